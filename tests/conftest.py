"""Fixtures. What the test modules share otherwise lives in helpers.py, op_checks.py and replay_checks.py."""
import importlib.util

import pytest

from helpers import default_queue


@pytest.fixture(scope="session")
def queue():
    """One in-order queue on GDN_TEST_DEVICE or the default SYCL device, for the whole session."""
    return default_queue()


# tests/integration runs vLLM, in the environment of `tests/setup_and_run.sh integration`.
if importlib.util.find_spec("vllm") is None:
    collect_ignore = ["integration"]
