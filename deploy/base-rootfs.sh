#!/bin/sh
# A Debian bookworm base image made from Debian's packages, for machines that reach a
# Debian mirror but no container registry (this project's CI): the same role as
# python:3.11-slim-bookworm, with Debian's python3 (3.11) instead of python.org's.
#
#   deploy/base-rootfs.sh [IMAGE] [MIRROR]     (root; needs debootstrap and buildah)
#
# IMAGE defaults to localhost/pdserve-base:bookworm; pass it to the build as
# --build-arg BASE_IMAGE=IMAGE (`make image` does).
set -eu

image="${1:-localhost/pdserve-base:bookworm}"
mirror="${2:-http://deb.debian.org/debian}"
rootfs="$(mktemp -d /tmp/pdserve-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$rootfs" "$mirror"

# Security and point-release updates too (debootstrap writes only the release), then
# nothing a layer needs to carry: downloaded packages, package lists.
security="$(dirname "$mirror")/debian-security"
cat > "$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
SOURCES
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log

# One layer from the tree; `python3` is what the Containerfile calls in both stages.
ctr="$(buildah from scratch)"
buildah copy --quiet "$ctr" "$rootfs" /
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 --cmd /bin/bash \
  --label org.opencontainers.image.title="debian bookworm minbase + python3 (debootstrap)" "$ctr"
buildah commit --quiet --rm "$ctr" "$image"
echo "base image: $image"
