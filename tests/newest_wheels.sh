#!/usr/bin/env bash
# Not in CI (like tests/fuzz_nightly.sh): the test suite on the NEWEST 2026.2 oneAPI wheels with
# dpnp and oneMKL of the same minor version, pygdn installed the way users get it: `pip install .`
# with build isolation, i.e. built against the 2026.1.2 build requirement and run on 2026.2
# (docs/usage.md "Installing" lists the supported versions and why the build takes the oldest).
# The venv is made afresh each run: GDN_VENV picks it (default .venv-newest). Extra arguments go
# to pytest, e.g.  tests/newest_wheels.sh -x -k "attention or readme"
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GDN_VENV:-.venv-newest}
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
rm -rf "$venv"
python3 -m venv "$venv"
py="$venv/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)
newest=">=2026.2,<2026.3"
echo "== installing the newest 2026.2 runtime, dpnp and oneMKL $newest"
"${pip[@]}" "dpcpp-cpp-rt$newest" "intel-sycl-rt$newest" "intel-opencl-rt$newest" "dpnp>=0.20" \
  "onemkl-sycl-blas$newest" "onemkl-sycl-dft$newest" "onemkl-sycl-lapack$newest" "onemkl-sycl-rng$newest" \
  "onemkl-sycl-vm$newest" pytest hypothesis meson ninja
echo "== pip install . (build isolation on: built against intel-sycl-rt==2026.1.2)"
"${pip[@]}" .
"$py" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE "^(intel-|dpcpp|onemkl|mkl |dpnp|dpctl|pygdn)"
export OCL_ICD_FILENAMES="${OCL_ICD_FILENAMES:-$venv/lib/libintelocl.so}"
# A kernel cache of its own: another runtime version must not meet the CI run's cached binaries.
export SYCL_CACHE_DIR="${SYCL_CACHE_DIR:-$PWD/.sycl-cache-newest}"
export PATH="$venv/bin:$PATH"
exec "$venv/bin/pytest" -q -p no:cacheprovider tests "$@"
