#!/usr/bin/env bash
# The test command: build the environment if needed (scripts/bootstrap.sh), then run every test,
# the multi-process ones under horovodrun included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider --timeout=1200 tests "$@"
