#!/bin/sh
# Run a built image once: every role's module imports, each entrypoint answers --help, the
# compiled router modules and kernels load, torch and UCX are the expected builds.
#
#   deploy/smoke.sh IMAGE
#
# Uses `podman run`; where podman cannot start a container (a machine that is itself a
# container without CAP_SYS_RESOURCE: crun's setrlimit fails) it falls back to
# `buildah run --isolation chroot` on a working container of the image.
set -eu
image="$1"

if podman run --rm "$image" true >/dev/null 2>&1; then
  run() { podman run --rm "$image" "$@"; }
else
  echo "smoke: podman cannot run containers here; using buildah --isolation chroot" >&2
  ctr="$(buildah from --quiet "$image")"
  trap 'buildah rm "$ctr" >/dev/null' EXIT
  # buildah run does not apply the image's ENTRYPOINT: name it.
  run() { buildah run --isolation chroot --user 10001:10001 "$ctr" -- /usr/local/bin/pdserve-entrypoint "$@"; }
fi

run id
run python -c "import router, kv_directory, prefill_worker, decode_worker, runtime.telemetry.collector; print('ok')"
for role in router directory prefill decode mixed collector; do
  echo "--- $role --help"
  run "$role" --help | head -3
done
run python -m router.native_build status | sed -n '1,3p;$p'
run python -m runtime.kernels status
run python -c "import torch, ucxx; from importlib.metadata import version as v; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| ucxx', v('ucxx-cu12'), '| libucx', v('libucx-cu12'))"
run sh -c 'for c in gcc cc g++ c++; do command -v "$c" && exit 1; done; echo "no compiler on PATH"'
echo "smoke: ok ($image)"
