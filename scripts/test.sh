#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite against a real tritonserver and front.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# --durations: every run (CI included) shows where the time goes, to keep the suite in budget.
exec .venv/bin/python -m pytest -ra --durations=30 "$@"
