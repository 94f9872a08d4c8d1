"""The generic kernels (the ones Intel GPUs run) checked on the CPU device: with
GDN_XPU_GENERIC_KERNELS=1 the library skips its CPU-only vector variants. Dims are multiples of
16 here, which is exactly where the CPU variants would otherwise take over."""
import numpy as np
import pytest

from pygdn.batch import make_batch
from op_checks import run_conv, run_delta, run_mixed_batch


@pytest.fixture(autouse=True)
def generic_kernels(monkeypatch):
    monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")


@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
def test_generic_chunked_prefill_and_spec(queue, ssm_layout):
    rng = np.random.default_rng(90)
    meta = make_batch(rng, num_slots=24, prefill_lens=[1, 63, 64, 65, 200], num_decodes=2, spec_lens=[3, 1, 2],
                      num_spec=2, order="random")
    run_delta(queue, rng, meta, H=1, HV=2, K=32, V=32, num_slots=24, ssm_layout=ssm_layout)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_generic_conv(queue, dtype):
    run_conv(queue, np.random.default_rng(91), dtype, 4, "time_major", "rolled", "mixed_padded")
    run_conv(queue, np.random.default_rng(92), dtype, 3, "dim_major", "snapshot", "time_tiles")


@pytest.mark.parametrize("seed", [1, 3, 6, 9])
def test_generic_mixed_batches(queue, seed):
    run_mixed_batch(queue, seed)
