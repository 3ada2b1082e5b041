#!/bin/sh
# Which torch build and which UCX wheels go together, for `make install` and deploy/Containerfile.
#
#   deploy/torch-ucx.sh torch-index PYTHON   the index to install torch from; nothing: pip's own
#   deploy/torch-ucx.sh ucx-extra PYTHON     pdserve's UCX extra for the torch PYTHON imports
#
# torch-index: $TORCH_INDEX_URL when set (e.g. https://download.pytorch.org/whl/cu128 for a
# driver older than CUDA 13, or a mirror). On a machine without an NVIDIA GPU, PyTorch's CPU
# index ($TORCH_CPU_INDEX_URL, a mirror of it) when it answers: a 190 MB CPU wheel, where
# PyPI's torch is a CUDA 13 build, 2.8 GB to download with its CUDA libraries. Otherwise
# nothing, and pip's own configuration decides: PyPI's CUDA 13 build, or a pre-staged wheel.
#
# ucx-extra: ucx-cu12 or ucx-cu13 (pyproject.toml). UCX's wheels come per CUDA major and pull
# cuda-bindings of that major, which must agree with torch's: ucxx-cu12's rmm-cu12 wants
# cuda-bindings<13, PyPI's torch 2.13.0 cuda-bindings>=13.0.3. A CPU torch takes either; it
# gets ucx-cu12, the line the images and CI have run.
set -eu

cpu_index="${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}"

note() { echo "torch-ucx: $*" >&2; }

has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# An index answers when its torch page does within 5 s, trusting pip's CA bundle when one is set.
answers() {
  "$1" - "$2/torch/" >/dev/null 2>&1 <<'EOF'
import os, ssl, sys, urllib.request
context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
urllib.request.urlopen(sys.argv[1], timeout=5, context=context).close()
EOF
}

torch_index() {
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    note "torch from TORCH_INDEX_URL"
    echo "$TORCH_INDEX_URL"
  elif has_gpu; then
    note "an NVIDIA GPU: torch from pip's indexes (PyPI's is a CUDA 13 build;" \
      "for an older driver set TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128)"
  elif answers "$1" "$cpu_index"; then
    note "no NVIDIA GPU: torch from $cpu_index"
    echo "$cpu_index"
  else
    note "no NVIDIA GPU, $cpu_index does not answer: torch from pip's indexes"
  fi
}

ucx_extra() {
  cuda="$("$1" -c 'import torch; print(torch.version.cuda or "")')"
  case "$cuda" in
    "" | 12.*) echo ucx-cu12 ;;
    13.*) echo ucx-cu13 ;;
    *) note "torch is built for CUDA $cuda: UCX extras exist for CUDA 12 and 13"; exit 1 ;;
  esac
}

case "${1:-}:${2:-}" in
  torch-index:?*) torch_index "$2" ;;
  ucx-extra:?*) ucx_extra "$2" ;;
  *) echo "usage: $0 torch-index|ucx-extra PYTHON" >&2; exit 2 ;;
esac
