#!/bin/sh
# The load generator's environment beside pdserve's (`make loadgen-env`): AIPerf, the
# open-source OpenAI-API benchmark that bench/loadgen.py drives against the router's
# OpenAI front. It pins its own transformers, numpy, pandas and aiohttp and brings a
# dashboard stack (dash, plotly, textual) pdserve has no use for, so it never goes into
# the default environment (.venv): this one holds AIPerf and what it pulls, nothing else.
#
#   deploy/loadgen-env.sh VENV PYTHON
#
# AIPerf supports Python 3.11 to 3.13. Re-running it is cheap: the environment is kept and
# pip leaves an installed pin alone. AIPERF_VERSION overrides the pinned version; the
# resolved set lands in VENV/loadgen-pins.txt, so a report can be traced to its versions.
set -eu

venv="$1"
python="${2:-python3}"
version="${AIPERF_VERSION:-0.13.0}"

"$python" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' || {
  echo "loadgen-env: AIPerf $version needs Python 3.11 to 3.13; $python is" \
    "$("$python" -c 'import platform; print(platform.python_version())')" >&2
  exit 1
}
test -x "$venv/bin/python" || "$python" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q "aiperf==$version"
"$py" -m pip freeze > "$venv/loadgen-pins.txt"
echo "loadgen-env: AIPerf $("$venv/bin/aiperf" --version)"
