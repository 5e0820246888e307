#!/usr/bin/env bash
# Set up (idempotent) and serve: tritonserver with the chosen families + the OpenAI front.
# Extra arguments go to `python -m frontend` (e.g. --port 8091 --families piper).
# Serving only Piper (the default) sets up only what it needs: no torch, no vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
families=${TRITONTTS_FAMILIES:-piper}
previous=
for arg in "$@"; do
  case "$arg" in --families=*) families=${arg#--families=} ;; esac
  [ "$previous" = --families ] && families=$arg
  previous=$arg
done
if [ "$families" = piper ]; then bash scripts/setup.sh --minimal; else bash scripts/setup.sh; fi
exec .venv/bin/python -m frontend "$@"
