"""gated delta rule kernels (recurrent decode, speculative decode, chunked prefill) against the
float64 reference recurrence. fp32 inputs: <= 2e-5 relative; f16/bf16 inputs: see RTOL_LOW."""
import os
import subprocess
import sys

import numpy as np
import pytest

from pygdn.batch import make_batch
from helpers import assert_close
from op_checks import RTOL_F32, run_delta


@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
@pytest.mark.parametrize("gva", [(1, 1), (2, 4), (1, 3)])
def test_recurrent_decode(queue, ssm_layout, gva):
    rng = np.random.default_rng(10 + gva[1])
    meta = make_batch(rng, num_slots=32, num_decodes=6, pad_non_spec=2, pad_len=1, order="random")
    run_delta(queue, rng, meta, H=gva[0], HV=gva[1], ssm_layout=ssm_layout)


# (48, 20): on the CPU device the vk recurrent variant walks rows in passes of 16 (GDN_VK_ROWS); 20 rows end
# with a short block. (32, 48), (32, 96) and (16, 144): the CPU chunk scan walks 16-column blocks four at
# a time (SCAN_CPU_CB) and GDN_SCAN_BLOCKS = 8 per work-item; 3 blocks make one short pass, 6 a full
# and a short one, 9 a second work-item.
# (256, 256): the largest head the library accepts, the CPU kernels' private arrays at their largest.
@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
@pytest.mark.parametrize("dims", [(128, 128), (64, 32), (32, 96), (256, 16), (48, 20), (5, 7), (32, 48), (16, 144),
                                  (256, 256)])
def test_head_dims(queue, dims, ssm_layout):
    K, V = dims
    rng = np.random.default_rng(K + V)
    meta = make_batch(rng, num_slots=16, num_decodes=2, prefill_lens=[70], spec_lens=[2], num_spec=1)
    run_delta(queue, rng, meta, H=1, HV=2, K=K, V=V, num_slots=16, ssm_layout=ssm_layout)


@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
@pytest.mark.parametrize("num_spec", [1, 2, 3])
def test_spec_decode_ragged(queue, num_spec, ssm_layout):
    """Ragged spec lengths 1..1+num_spec, every acceptance count, padded sequences."""
    rng = np.random.default_rng(20 + num_spec)
    cols = num_spec + 1
    lens = [cols, 1, max(1, cols - 1), cols, 2 if cols >= 2 else 1]
    accepted = [(i % cols) + 1 for i in range(len(lens))]
    meta = make_batch(rng, num_slots=48, spec_lens=lens, num_spec=num_spec, accepted=accepted, pad_spec=2,
                      pad_len=1, order="random")
    run_delta(queue, rng, meta, ssm_layout=ssm_layout, num_slots=48)


def test_spec_pad_read_slot_skips_sequence(queue):
    """A spec sequence whose initial slot is padding: zero outputs, nothing written."""
    rng = np.random.default_rng(3)
    meta = make_batch(rng, num_slots=16, spec_lens=[3, 3], num_spec=2, accepted=[2, 1], order="grouped")
    meta["spec_state_indices"][0, 1] = -1  # read slot of sequence 0 (accepted 2 -> column 1)
    got_o, *_ = run_delta(queue, rng, meta, num_slots=16)
    assert np.all(got_o[meta["spec_token_indx"][:3]] == 0)


PREFILL_LENS = [1, 63, 64, 65, 200, 1000]


@pytest.mark.parametrize("initial", ["none", "all", "mixed"])
def test_chunked_prefill_matches_recurrence(queue, initial):
    rng = np.random.default_rng(30)
    init = {"none": [0] * 6, "all": [1] * 6, "mixed": [1, 0, 1, 0, 1, 0]}[initial]
    meta = make_batch(rng, num_slots=12, prefill_lens=PREFILL_LENS, has_initial_state=init, order="blocks")
    chunk_o, chunk_s, want_o, want_s = run_delta(queue, np.random.default_rng(31), meta, num_slots=12)
    rec_o, rec_s, _, _ = run_delta(queue, np.random.default_rng(31), meta, num_slots=12, force_recurrent=True)
    assert_close(chunk_o, rec_o, RTOL_F32, "chunked vs recurrent kernel output")
    assert_close(chunk_s, rec_s, RTOL_F32, "chunked vs recurrent kernel state")


def test_chunked_prefill_qwen_head(queue):
    """K = V = 128 (the production head), GVA 2, interleaved with decodes and spec sequences."""
    rng = np.random.default_rng(40)
    meta = make_batch(rng, num_slots=20, prefill_lens=[130, 64], num_decodes=3, spec_lens=[3, 2], num_spec=2,
                      order="random")
    run_delta(queue, rng, meta, H=1, HV=2, K=128, V=128, num_slots=20)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_low_precision_inputs(queue, dtype):
    rng = np.random.default_rng(50)
    meta = make_batch(rng, num_slots=20, prefill_lens=[90], num_decodes=3, spec_lens=[3, 1], num_spec=2)
    run_delta(queue, rng, meta, dtype=dtype, num_slots=20)


@pytest.mark.parametrize("variant", ["g_beta", "no_l2norm", "l2_div"])
def test_gate_and_norm_variants(queue, variant):
    rng = np.random.default_rng(60)
    meta = make_batch(rng, num_slots=20, prefill_lens=[80], num_decodes=2, spec_lens=[2], num_spec=1)
    kw = {"g_beta": dict(gates="g_beta"), "no_l2norm": dict(l2norm=False), "l2_div": dict(l2_mode="div")}[variant]
    run_delta(queue, rng, meta, num_slots=20, **kw)


PROFILE_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[2])
import numpy as np
from pygdn.batch import make_batch
from helpers import default_queue
from op_checks import run_delta
rng = np.random.default_rng(0)
if sys.argv[1] == "steps":  # decodes and spec decodes only: no chunk kernels
    meta = make_batch(rng, num_slots=16, num_decodes=3, spec_lens=[2, 3], num_spec=2)
else:                       # with a prefill
    meta = make_batch(rng, num_slots=16, num_decodes=2, prefill_lens=[70], spec_lens=[2], num_spec=1)
run_delta(default_queue(), rng, meta, num_slots=16, ssm_layout="vk")
"""


@pytest.mark.parametrize("batch", ["steps", "with_prefill"])
def test_decode_steps_launch_no_prep_on_cpu(queue, batch, tmp_path):
    """On the CPU device a call without chunk kernels launches no gdn_prep: the recurrent kernels
    prepare their own tokens (one launch less per decode step); a call with a prefill keeps it.
    The kernels a call runs, from GDN_XPU_PROFILE's per-kernel lines; values checked in the child."""
    if not queue.sycl_device.is_cpu or os.environ.get("GDN_XPU_GENERIC_KERNELS") == "1":
        pytest.skip("the CPU device's kernel variants only")
    env = dict(os.environ, GDN_XPU_PROFILE="1")
    tests = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", PROFILE_CHILD, batch, tests], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    names = {line.split()[1] for line in out.stderr.splitlines() if line.startswith("libgdn_xpu: ")}
    if batch == "steps":
        assert names == {"gdn_recurrent_vk_cpu"}, names
    else:
        assert {"gdn_prep_cpu", "gdn_chunk_plan", "gdn_chunk_scan_cpu", "gdn_recurrent_vk_cpu"} <= names, names
