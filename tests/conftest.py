"""Fixtures. What the test modules share otherwise lives in helpers.py, op_checks.py and replay_checks.py."""
import importlib.util

import pytest

from helpers import default_queue


@pytest.fixture(scope="session")
def queue():
    """One in-order queue on GDN_TEST_DEVICE or the default SYCL device, for the whole session."""
    return default_queue()


@pytest.fixture(params=["cpu_kernels", "generic_kernels"])
def kernels(request, monkeypatch):
    """Both kernel families on the CPU device: its CPU variants, and the generic kernels Intel GPUs run
    (GDN_XPU_GENERIC_KERNELS=1, for this test only)."""
    if request.param == "generic_kernels":
        monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")
    return request.param


# tests/integration runs vLLM, in the environment of `tests/setup_and_run.sh integration`.
if importlib.util.find_spec("vllm") is None:
    collect_ignore = ["integration"]
