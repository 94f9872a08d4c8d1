#!/usr/bin/env bash
# Soak test (not in CI): 1,000,000 C-ABI calls of mixed batches in ONE process, through the plain C
# program tests/c/endurance.c (built here against the installed library; no Python in the loop). Five
# batch shapes (decode x8; prefill 70 + 2 decodes + 2 spec with permuted rows, validated fully and
# by counts; spec-only x4; two prefills 33 + 130) plus gdn_causal_conv1d and gdn_gated_delta_rule
# calls, GDN_VALIDATE_FULL and GDN_VALIDATE_COUNTS. Reports RSS and malloc heap at start (after
# 5,000 warm-up calls) and end, RSS at 10 points in between, calls/s and p50/p99/max latency of a
# call until its results are ready (call + gdn_queue_wait). docs/design.md "Memory over many calls" describes the check.
#   tests/soak.sh [calls] [warmup] [samples]      (default 1000000 5000 10)
# Uses the environment GDN_VENV (default .venv) that tests/setup_and_run.sh builds; run that first.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GDN_VENV:-.venv}
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
py="$venv/bin/python"
[ -x "$py" ] || { echo "no environment at $venv: run tests/setup_and_run.sh test first (or set GDN_VENV)" >&2; exit 2; }
# Build the program against the installed library (the wheel ships no executables), as the tests do.
# -P: the installed pygdn, not the source folder of this checkout.
build_args=$(cd "$venv" && "$py" -P -c 'from pygdn import _lib; print(" ".join(_lib.c_build_args()))')
exe=$(mktemp -d)/gdn_endurance
trap 'rm -rf "$(dirname "$exe")"' EXIT
# shellcheck disable=SC2086  # build_args is a list of words
"${CC:-cc}" -std=c99 -O2 -Wall tests/c/endurance.c -o "$exe" $build_args -lm
export OCL_ICD_FILENAMES="${OCL_ICD_FILENAMES:-$venv/lib/libintelocl.so}"
echo "== $(date -u +%FT%TZ) $(uname -m), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$exe" "${1:-1000000}" "${2:-5000}" "${3:-10}"
