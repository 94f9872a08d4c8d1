#!/usr/bin/env bash
# Nightly metadata fuzzing: tests/test_fuzz.py with GDN_FUZZ_EXAMPLES=50000 hypothesis examples
# (the CI run uses the default, 2000). About 6 minutes on 2 cores of the SYCL CPU device.
# Extra arguments go to pytest, e.g.  tests/fuzz_nightly.sh --hypothesis-show-statistics
# Builds and runs through tests/setup_and_run.sh; GDN_VENV picks the virtual environment as there.
set -euo pipefail
cd "$(dirname "$0")/.."
export GDN_FUZZ_EXAMPLES="${GDN_FUZZ_EXAMPLES:-50000}"
exec tests/setup_and_run.sh test -k test_fuzz "$@"
