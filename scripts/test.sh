#!/usr/bin/env bash
# The test command: sets up .venv with the dev extras, lints, then runs the whole suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k weights`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/ruff check keras_vit export apps tests benchmarks scripts setup.py
.venv/bin/ruff format --check keras_vit export apps tests benchmarks scripts setup.py
export KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=2
# Three workers on CI's 2 cores, each test file on one (its module fixtures built once), the
# slowest files first (tests/conftest.py orders them). The training and export tests wait for
# long stretches (subprocesses starting, single-threaded tracing), so a third worker fills the
# gaps: 551 s with three against 676 s with two, on nearly the same tests (issue 27's note).
# --durations: the slowest tests in every log, to keep the suite within its 15 minutes.
exec .venv/bin/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder --durations=12 "$@"
