"""Padding state indices (include/gdn_xpu.h "State caches", "Padding"): with pad_slot_id = 0 -- vLLM's
null block, NULL_BLOCK_ID, which its metadata builder writes into padded rows -- both 0 and -1 are
padding in every index array: non-spec write slots, spec columns, explicit read slots, block
checkpoints. A pad is never read and never written, under GDN_VALIDATE_FULL and GDN_VALIDATE_COUNTS,
by the CPU device's kernel variants and by the generic kernels (GDN_XPU_GENERIC_KERNELS=1).

How "never read" is seen: slot 0 of both caches holds NaN, and so does the slot-sized memory just
before slot 0 (the caches are views one slot into their allocations), where a kernel that
dereferenced index -1 would land. A read of either makes NaN in outputs or stored states, which the
float64 reference (pygdn/reference.py, the same padding rule) never has. "Never written": both
regions are bit-identical afterwards, and every slot the reference leaves alone too.

Shapes of test_state_caches.py (H=1, HV=2, K=V=16, W=4, f32): no kernel builds of their own.
"""
import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from pygdn.batch import to_device
from helpers import assert_close, conv_from_canonical, conv_to_canonical, ssm_from_canonical, ssm_to_canonical, usm

H, HV, K, V, W, S = 1, 2, 16, 16, 4, 2
SLOTS = 24
NULL = 0  # pad_slot_id: vLLM's null block


class SlotView:
    """A cache of SLOTS slots one slot into a USM allocation of SLOTS + 1 (the slot before it: "slot -1")."""

    def __init__(self, queue, canonical_with_guard):
        self.base = usm(queue, canonical_with_guard)
        self.shape = (SLOTS, *canonical_with_guard.shape[1:])
        self.offset = int(np.prod(canonical_with_guard.shape[1:]))

    @property
    def __sycl_usm_array_interface__(self):
        s = dict(self.base.__sycl_usm_array_interface__)
        s.update(shape=self.shape, offset=self.offset)
        return s

    def whole(self):
        """The allocation: [SLOTS + 1, ...], row 0 the guard ("slot -1")."""
        return self.base.to_numpy()


def meta_with_pads(reads):
    """A mixed batch whose padding uses both 0 and -1 everywhere an index goes:
    non-spec: a 130-token prefill from position 10 (checkpoints at its tokens 53 and 117 to 0 and -1: not
    stored), a 70-token prefill from position 0 (checkpoint at token 63 to slot 7), a decode in slot 2,
    padded decodes in slots 0 and -1 (one token each) and a zero-length one in slot 0;
    spec: [3, 4, 5] (3 tokens, A = 2), [6, 0, -1] (3 tokens, A = 1: tokens 1 and 2 store nowhere), padded
    rows [0, 0, 0] and [-1, -1, -1] with one and two tokens (A = 1, stale rows) and a zero-length [0, 0, 0].
    reads: explicit read slots, 0 and -1 among them ("nothing to read": zeros)."""
    ns_lens, s_lens = [130, 70, 1, 1, 1, 0], [3, 3, 1, 2, 0]
    T_ns, T_s = sum(ns_lens), sum(s_lens)
    T = T_ns + T_s
    rows = np.random.default_rng(3).permutation(T).astype(np.int32)
    i32 = lambda v: np.asarray(v, np.int32)  # noqa: E731
    meta = dict(num_prefills=2, num_decodes=4, num_spec_decodes=5, num_spec=S, num_actual_tokens=T,
                non_spec_token_count=T_ns, spec_token_count=T_s, pad_slot_id=NULL,
                non_spec_query_start_loc=i32(np.cumsum([0] + ns_lens)),
                non_spec_state_indices=i32([1, 8, 2, 0, -1, 0]), has_initial_state=np.ones(6, np.uint8),
                non_spec_start_pos=i32([10, 0, 5, 0, 0, 0]), checkpoint_interval=64, checkpoint_cols=2,
                checkpoint_state_indices=i32([[0, -1], [7, 0], [0, -1], [0, 0], [-1, -1], [0, -1]]),
                non_spec_token_indx=rows[:T_ns].copy(), spec_query_start_loc=i32(np.cumsum([0] + s_lens)),
                spec_state_indices=i32([[3, 4, 5], [6, 0, -1], [0, 0, 0], [-1, -1, -1], [0, 0, 0]]),
                num_accepted_tokens=i32([2, 1, 1, 1, 1]), spec_token_indx=rows[T_ns:].copy())
    if reads:
        meta["non_spec_read_state_indices"] = i32([9, 0, -1, 0, -1, 0])
        meta["spec_read_state_indices"] = i32([4, 0, -1, 0, -1])
    return meta


@pytest.mark.parametrize("reads", [False, True], ids=["default_reads", "explicit_reads"])
@pytest.mark.parametrize("conv_spec_layout", ["rolled", "snapshot"])
@pytest.mark.parametrize("validate", ["full", "counts"])
@pytest.mark.parametrize("kernels", ["cpu", "generic"])
def test_null_block_and_negative_indices_are_padding(queue, monkeypatch, kernels, validate, conv_spec_layout, reads):
    if kernels == "generic":
        monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")
    rng = np.random.default_rng(62)
    state_len = W - 1 + S
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=SLOTS, conv_width=W,
                       act_dtype="f32", ssm_layout="vk", conv_layout="time_major", conv_spec_layout=conv_spec_layout,
                       conv_state_len=state_len)
    C = cfg.conv_dim
    # canonical caches with the guard slot first; the guard and slot 0 hold NaN
    conv = rng.standard_normal((SLOTS + 1, C, state_len)).astype(np.float32)
    ssm = (rng.standard_normal((SLOTS + 1, HV, K, V)) * 0.5).astype(np.float32)
    conv[:2], ssm[:2] = np.nan, np.nan
    d_conv = SlotView(queue, conv_from_canonical(conv, "time_major"))
    d_ssm = SlotView(queue, ssm_from_canonical(ssm, "vk"))
    before_conv, before_ssm = d_conv.whole().tobytes(), d_ssm.whole().tobytes()

    meta = meta_with_pads(reads)
    T = meta["num_actual_tokens"]
    x = rng.standard_normal((T, C)).astype(np.float32)
    a, b = (rng.standard_normal((T, HV)).astype(np.float32) for _ in range(2))
    w = (rng.standard_normal((C, W)) * 0.5).astype(np.float32)
    bias = (rng.standard_normal(C) * 0.1).astype(np.float32)
    A_log = np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, HV).astype(np.float32)
    out = usm(queue, np.full((T, HV, V), 5.0, np.float32))
    pygdn.attention(queue, cfg, to_device(meta, queue, validate=validate), mixed_qkv=usm(queue, x), a=usm(queue, a),
                    b=usm(queue, b), conv_weight=usm(queue, w), conv_bias=usm(queue, bias), A_log=usm(queue, A_log),
                    dt_bias=usm(queue, dt_bias), conv_state=d_conv, ssm_state=d_ssm, core_attn_out=out)

    want_o, want_conv, want_ssm = ref.gdn_attention(x, a, b, w, bias, A_log, dt_bias, conv[1:], ssm[1:], meta, H, HV,
                                                    K, V, spec_layout=conv_spec_layout)
    got_conv = conv_to_canonical(d_conv.whole(), "time_major")
    got_ssm = ssm_to_canonical(d_ssm.whole(), "vk")
    # the guard ("slot -1") and slot 0: bit-identical (NaN included)
    for name, d, before in (("conv_state", d_conv, before_conv), ("ssm_state", d_ssm, before_ssm)):
        two_slots = 2 * len(before) // (SLOTS + 1)
        assert d.whole().tobytes()[:two_slots] == before[:two_slots], f"{name}: slot 0 or the memory of index -1 changed"
    assert_close(out.to_numpy(), want_o, 2e-5, "core_attn_out (a read of slot 0 or index -1 would be NaN)")
    assert np.array_equal(got_conv[2:], want_conv[1:]), "conv_state (exact copies)"
    assert_close(got_ssm[2:], want_ssm[1:], 2e-5, "ssm_state")
    for s in range(1, SLOTS):
        if np.array_equal(want_ssm[s], ssm[s + 1]):
            assert np.array_equal(got_ssm[s + 1], ssm[s + 1]), f"ssm slot {s} not written by the reference but changed"
    padded = [r for n, L in ((2, 1), (3, 2)) for r in meta["spec_token_indx"][meta["spec_query_start_loc"][n]:][:L]]
    padded += [int(meta["non_spec_token_indx"][j]) for j in (201, 202)]
    if not reads:
        assert np.all(out.to_numpy()[padded] == 0), "rows of padded sequences are zeros"
    else:  # explicit pad read slots: a spec row starts from zeros and stores nowhere; non-spec padding stays padding
        assert np.all(out.to_numpy()[padded[-2:]] == 0), "rows of padded non-spec sequences are zeros"
