"""Replay mode (include/gdn_xpu.h "Replay mode"): spec sequences keep one committed state and a ring
of the last step's inputs. The same multi-step MTP simulation runs through two layers with
identical weights, caches and tokens, one in the per-token mode, one in replay mode: every step's
outputs are bit-identical (the replay reproduces the per-token walk's arithmetic, and both round a
stored state once), the conv caches identical, and after gdn_flush_replay a slot holds exactly the
per-token mode's state. The per-token mode itself is held to the float64 reference by
test_state_caches.py; here one loop is checked against the reference too.

Kernel builds: K = V = 16 with f32 activations, the shapes of test_state_caches.py (its builds are
shared), plus one Qwen3-Next-shaped loop (H = 16, HV = 32, K = V = 128, bf16 activations and state).
"""
import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from pygdn.batch import to_device
from helpers import assert_close, conv_to_canonical, ssm_to_canonical, usm
from replay_checks import Twins, make_config, mtp_loop, prefill_meta, spec_meta

SMALL = dict(H=1, HV=2, K=16, V=16)


@pytest.mark.parametrize("S", [1, 2, 3, 7])
@pytest.mark.parametrize("ssm_layout", ["vk", "kv"])
def test_replay_equals_per_token_f32(queue, S, ssm_layout):
    tw = Twins(queue, np.random.default_rng(450 + S), **SMALL, S=S, num_slots=3 * (S + 1) + 2,
               state_dtype="f32", ssm_layout=ssm_layout)
    mtp_loop(tw)


@pytest.mark.parametrize("state_dtype,ssm_layout", [("bf16", "vk"), ("bf16", "kv"), ("f16", "vk"), ("f16", "kv")])
def test_replay_equals_per_token_2byte_states(queue, state_dtype, ssm_layout):
    tw = Twins(queue, np.random.default_rng(460), **SMALL, S=3, num_slots=14, state_dtype=state_dtype,
               ssm_layout=ssm_layout)
    mtp_loop(tw)


@pytest.mark.parametrize("ssm_layout", ["vk", "kv"])
def test_replay_equals_per_token_delta_rule_alone(queue, ssm_layout):
    """gdn_gated_delta_rule (tokens taken as the conv output): the unfused recurrent kernels."""
    tw = Twins(queue, np.random.default_rng(470), **SMALL, S=2, num_slots=11, state_dtype="f32", ssm_layout=ssm_layout)
    mtp_loop(tw, op="delta")


@pytest.mark.parametrize("ssm_layout,state_dtype", [("kv", "f32"), ("vk", "bf16")])
def test_replay_equals_per_token_generic_kernels(queue, monkeypatch, ssm_layout, state_dtype):
    monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")
    tw = Twins(queue, np.random.default_rng(480), **SMALL, S=3, num_slots=14, state_dtype=state_dtype,
               ssm_layout=ssm_layout)
    mtp_loop(tw)


def test_replay_walks_longer_than_the_prepared_walk(queue):
    """S = 9: walks of 10 tokens take the CPU variants' held forms; the replay follows them."""
    for layout in ("vk", "kv"):
        tw = Twins(queue, np.random.default_rng(490), **SMALL, S=9, num_slots=32, state_dtype="f32", ssm_layout=layout)
        mtp_loop(tw, steps=5)


def test_replay_qwen3_next_shapes(queue):
    """H = 16, HV = 32, K = V = 128 (Qwen3-Next at TP = 1), bf16 activations and state, S = 3."""
    tw = Twins(queue, np.random.default_rng(500), H=16, HV=32, K=128, V=128, S=3, num_slots=14, state_dtype="bf16",
               ssm_layout="vk", act="bf16")
    mtp_loop(tw, steps=4)


def test_replay_against_the_reference(queue):
    """The outputs (bit-identical in both modes, tw.step) against the float64 reference."""
    H, HV, K, V, S = 1, 2, 16, 16, 2
    tw = Twins(queue, np.random.default_rng(510), H, HV, K, V, S=S, num_slots=8, state_dtype="f32", ssm_layout="vk")
    conv = conv_to_canonical(tw.pt.d_conv.to_numpy(), "time_major").astype(np.float64)
    ssm = ssm_to_canonical(tw.ssm0, "vk").astype(np.float64)
    w, bias = (tw.pt.d[k].to_numpy().astype(np.float64) for k in ("conv_weight", "conv_bias"))
    A_log, dt_bias = tw.pt.d["A_log"].to_numpy(), tw.pt.d["dt_bias"].to_numpy()
    blocks = [[0, 1, 2], [3, 4, 5]]
    metas, accepted = [prefill_meta([4, 6], [0, 3])], [1, 1]
    for L, A in (([3, 2], [2, 1]), ([1, 3], [1, 3]), ([2, 2], [2, 2])):
        metas.append(spec_meta(L, blocks, accepted, S))
        accepted = A
    for meta in metas:
        x, a, b, o = tw.step(meta)
        want, conv, ssm = ref.gdn_attention(*(v.astype(np.float64) for v in (x, a, b)), w, bias, A_log, dt_bias, conv,
                                            ssm, meta, H, HV, K, V, spec_layout="rolled")
        assert_close(o.reshape(want.shape), want, 2e-5, "core_attn_out")


# ----------------------------------------------------------------------------- validation
def replay_case(queue, S=2):
    tw = Twins(queue, np.random.default_rng(520), **SMALL, S=S, num_slots=10, state_dtype="f32", ssm_layout="vk")
    tw.step(prefill_meta([3, 4], [0, 3]))
    meta = spec_meta([3, 2], [[0, 1, 2], [3, 4, 5]], [1, 1], S)
    tw.step(meta)  # the rings of slots 0 and 3 hold 3 and 2 tokens
    return tw


def expect_error(tw, meta, status, words, cfg=None, **arrays):
    """The replay layer's call fails naming `words`, with nothing written (caches, rings, outputs)."""
    e = tw.rp
    before = [v.to_numpy().copy() for v in (e.d_ssm, e.d_conv, e.ring, e.count)]
    x, a, b = tw.tokens(meta["num_actual_tokens"])
    out = usm(e.q, np.full((meta["num_actual_tokens"], tw.cfg.num_v_heads * tw.cfg.head_v_dim), 7, np.float32))
    rings = dict(e.rings(), **arrays)
    with pytest.raises(pygdn.GdnError) as info:
        pygdn.attention(e.q, cfg or e.cfg, to_device(meta, e.q), mixed_qkv=usm(e.q, x), a=usm(e.q, a), b=usm(e.q, b),
                        conv_state=e.d_conv, ssm_state=e.d_ssm, core_attn_out=out, **e.d, **rings)
    assert info.value.status == status, info.value
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    for got, want in zip((e.d_ssm, e.d_conv, e.ring, e.count), before):
        assert np.array_equal(got.to_numpy(), want), "a failed call wrote"
    assert np.all(out.to_numpy() == 7)


def test_replay_validation(queue):
    lib = pygdn.lib
    tw = replay_case(queue)
    blocks = [[0, 1, 2], [3, 4, 5]]
    ok = spec_meta([2, 2], blocks, [2, 1], 2)
    x, a, b = (usm(queue, v) for v in tw.tokens(4))
    out = usm(queue, np.zeros((4, 32), np.float32))
    with pytest.raises(pygdn.GdnError, match="tensors->replay_ring is NULL"):
        pygdn.attention(queue, tw.rcfg, to_device(ok, queue), mixed_qkv=x, a=a, b=b, conv_state=tw.rp.d_conv,
                        ssm_state=tw.rp.d_ssm, core_attn_out=out, **tw.rp.d)
    with pytest.raises(ValueError, match="replay_ring: given, but cfg.replay_tokens = 0"):
        pygdn.attention(queue, tw.cfg, to_device(ok, queue), mixed_qkv=x, a=a, b=b, conv_state=tw.pt.d_conv,
                        ssm_state=tw.pt.d_ssm, core_attn_out=out, **tw.pt.d, **tw.rp.rings())
    # More accepted tokens than the ring holds (slot 3 holds 2).
    expect_error(tw, spec_meta([2, 2], blocks, [1, 3], 2), lib.GDN_ERROR_BAD_ACCEPTED,
                 ["num_accepted_tokens[1] = 3", "replay_count[3]"])
    # A non-spec sequence reading a slot with unreplayed tokens.
    meta = spec_meta([2], blocks[:1], [2], 2, decode_slot=3)
    expect_error(tw, meta, lib.GDN_ERROR_BAD_STATE_INDEX, ["non_spec_state_indices[0] = 3", "gdn_flush_replay"])
    # A ring too short for the step's drafts.
    small = make_config(1, 2, 16, 16, 2, 10, "f32", "vk", replay=2)
    expect_error(tw, ok, lib.GDN_ERROR_BAD_COUNT, ["cfg->replay_tokens = 2", "1 + batch->num_spec = 3"], cfg=small,
                 replay_ring=usm(queue, np.zeros(small.replay_ring_shape, np.float32)))
    # SNAPSHOT conv.
    snap = make_config(1, 2, 16, 16, 2, 10, "f32", "vk", replay=3)
    snap.conv_spec_layout = "snapshot"
    expect_error(tw, ok, lib.GDN_ERROR_UNSUPPORTED, ["cfg->conv_spec_layout", "SNAPSHOT"], cfg=snap)
    # A corrupt (not library-written) ring count.
    bad = tw.rp.count.to_numpy()
    bad[3] = 9
    expect_error(tw, ok, lib.GDN_ERROR_BAD_COUNT, ["replay_count[3] = 9"], replay_count=usm(queue, bad))
    # The flush: slots in range, distinct, num_tokens within the counts; nothing written on failure.
    e = tw.rp
    before = [v.to_numpy().copy() for v in (e.d_ssm, e.ring, e.count)]
    for slots, ntok, words in (([0, 10], [1, 1], "slots[1] = 10"), ([3, 3], [1, 1], "slot 3 twice"),
                               ([0, 3], [1, 3], "num_tokens[1] = 3")):
        with pytest.raises(pygdn.GdnError, match=words.replace("[", r"\[").replace("]", r"\]")):
            e.flush(slots, ntok)
    for got, want in zip((e.d_ssm, e.ring, e.count), before):
        assert np.array_equal(got.to_numpy(), want)
    # After the flush the decode may read the slot.
    tw.flush_and_compare(blocks, [2, 1], [0, 1])
    tw.step(spec_meta([2], blocks[:1], [2], 2, decode_slot=3))


def test_replay_warmup_and_workspace(queue):
    """gdn_warmup compiles replay mode's kernels too; the workspace does not depend on the mode."""
    cfg = make_config(1, 2, 16, 16, 2, 10, "f32", "vk", replay=3)
    pygdn.warmup(queue, cfg)
    meta = spec_meta([3, 2], [[0, 1, 2], [3, 4, 5]], [1, 1], 2, decode_slot=6)
    counts = to_device(meta, queue)
    per_token = make_config(1, 2, 16, 16, 2, 10, "f32", "vk")
    assert pygdn.workspace_size(cfg, counts) == pygdn.workspace_size(per_token, counts)
    assert cfg.replay_ring_shape == (10, 3, 16 + 2 * 16 + 2 * 2)
