#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite against a real tritonserver and front.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# --durations: every run (CI included) shows where the time goes, to keep the suite in budget.
# Two workers (TRITONTTS_TEST_WORKERS; 0 runs in this process): a pooled server's tests run
# together on one, beside the other's (tests/conftest.py). Two servers of tiny checkpoints
# at once fit 2 cores and 24 GiB; more would contend for the cores.
exec .venv/bin/python -m pytest -ra --durations=30 -n "${TRITONTTS_TEST_WORKERS:-2}" --dist loadgroup "$@"
