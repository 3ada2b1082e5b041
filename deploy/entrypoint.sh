#!/bin/sh
# The image's entrypoint: the first argument names the role, the rest are its flags.
#
#   router     python -m router                          (the chart's router Deployment)
#   directory  python -m kv_directory                    (the KV directory over Redis)
#   prefill    python -m prefill_worker
#   decode     python -m decode_worker
#   mixed      python -m decode_worker --serve-prefill   (a decode worker that also serves Prefill)
#   collector  python -m runtime.telemetry.collector    (the local trace collector)
#   roles      print this table
#
# Anything else runs as a command (`python ...`, `pdctl ...`, `pdserve ...`), so a debug
# pod or the chart's `helm test` hook uses the same image. `exec` makes the service
# PID 1: it gets the kubelet's SIGTERM itself (every service handles SIGTERM:
# runtime/common/grpc_server.py) and no shell stays behind.
set -eu

role="${1:-roles}"
case "$role" in
  router)    shift; exec python -m router "$@" ;;
  directory|kv-directory|kv_directory)
             shift; exec python -m kv_directory "$@" ;;
  prefill)   shift; exec python -m prefill_worker "$@" ;;
  decode)    shift; exec python -m decode_worker "$@" ;;
  mixed)     shift; exec python -m decode_worker --serve-prefill "$@" ;;
  collector) shift; exec python -m runtime.telemetry.collector "$@" ;;
  roles|--help|-h)
             sed -n '2,11s/^# \{0,1\}//p' "$0"; exit 0 ;;
  *)         exec "$@" ;;
esac
