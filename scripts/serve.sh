#!/usr/bin/env bash
# Set up (idempotent) and serve: tritonserver with the chosen families + the OpenAI front.
# Extra arguments go to `python -m frontend` (e.g. --port 8091 --families piper).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m frontend "$@"
