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
from helpers import assert_close, conv_to_canonical, quantize, ssm_from_canonical, ssm_to_canonical, usm

W = 4
PAD = -1


class Engine:
    """One layer's weights and caches on the device, in one mode (replay_tokens 0: per-token)."""

    def __init__(self, queue, cfg, w, bias, A_log, dt_bias, conv0, ssm0):
        self.q, self.cfg = queue, cfg
        self.d_conv = usm(queue, conv0.copy())
        self.d_ssm = usm(queue, ssm0.copy())
        self.d = dict(conv_weight=usm(queue, w), conv_bias=usm(queue, bias), A_log=usm(queue, A_log),
                      dt_bias=usm(queue, dt_bias))
        self.replay = cfg.replay_tokens > 0
        if self.replay:
            self.ring = usm(queue, np.zeros(cfg.replay_ring_shape, np.float32))
            self.count = usm(queue, np.zeros(cfg.replay_count_shape, np.int32))

    def rings(self):
        return dict(replay_ring=self.ring, replay_count=self.count) if self.replay else {}

    def step(self, meta, x, a, b, act, op="attention"):
        T = meta["num_actual_tokens"]
        out = usm(self.q, np.full((T + 1, self.cfg.num_v_heads * self.cfg.head_v_dim), 7, x.dtype))
        x, a, b = (usm(self.q, v) for v in (x, a, b))
        batch = to_device(meta, self.q)
        if op == "attention":
            pygdn.attention(self.q, self.cfg, batch, mixed_qkv=x, a=a, b=b, conv_state=self.d_conv,
                            ssm_state=self.d_ssm, core_attn_out=out, **self.d, **self.rings())
        else:
            pygdn.gated_delta_rule(self.q, self.cfg, batch, conv_out=x, a=a, b=b, A_log=self.d["A_log"],
                                   dt_bias=self.d["dt_bias"], ssm_state=self.d_ssm, core_attn_out=out, **self.rings())
        o = out.to_numpy()
        assert np.all(o[T] == 7), "canary row past num_actual_tokens was written"
        return o[:T]

    def flush(self, slots, num_tokens):
        pygdn.flush_replay(self.q, self.cfg, usm(self.q, np.asarray(slots, np.int32)),
                           usm(self.q, np.asarray(num_tokens, np.int32)), ssm_state=self.d_ssm,
                           replay_ring=self.ring, replay_count=self.count)

    def ssm(self):
        return self.d_ssm.to_numpy()


def make_config(H, HV, K, V, S, num_slots, state_dtype, ssm_layout, act="f32", replay=0):
    return pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=num_slots,
                        conv_width=W, act_dtype=act, state_dtype=state_dtype, ssm_layout=ssm_layout,
                        conv_layout="time_major", conv_spec_layout="rolled", conv_state_len=W - 1 + S,
                        replay_tokens=replay)


def act_array(x, act):
    return pygdn.to_bf16_bits(x) if act == "bf16" else np.asarray(x, np.float32 if act == "f32" else np.float16)


class Twins:
    """The per-token layer and the replay layer, stepped together and compared."""

    def __init__(self, queue, rng, H, HV, K, V, S, num_slots, state_dtype, ssm_layout, act="f32", extra=1):
        self.S, self.act, self.rng = S, act, rng
        self.cfg = make_config(H, HV, K, V, S, num_slots, state_dtype, ssm_layout, act)
        self.rcfg = make_config(H, HV, K, V, S, num_slots, state_dtype, ssm_layout, act, replay=S + extra)
        C = self.cfg.conv_dim
        w = act_array(rng.standard_normal((C, W)) * 0.5, act)
        bias = act_array(rng.standard_normal(C) * 0.1, act)
        A_log = np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32)
        dt_bias = rng.uniform(-1, 1, HV).astype(np.float32)
        conv0 = act_array(rng.standard_normal(self.cfg.conv_state_shape) * 0.5, act)
        ssm0, _ = quantize(rng.standard_normal((num_slots, HV, K, V)) * 0.3, state_dtype)
        ssm0 = ssm_from_canonical(ssm0, ssm_layout)
        self.pt = Engine(queue, self.cfg, w, bias, A_log, dt_bias, conv0, ssm0)
        self.rp = Engine(queue, self.rcfg, w, bias, A_log, dt_bias, conv0, ssm0)
        self.ssm0 = ssm0.copy()

    def tokens(self, n):
        C, HV = self.cfg.conv_dim, self.cfg.num_v_heads
        return (act_array(self.rng.standard_normal((n, C)), self.act),
                act_array(self.rng.standard_normal((n, HV)), self.act),
                act_array(self.rng.standard_normal((n, HV)), self.act))

    def step(self, meta, op="attention"):
        x, a, b = self.tokens(meta["num_actual_tokens"])
        o_pt = self.pt.step(meta, x, a, b, self.act, op)
        o_rp = self.rp.step(meta, x, a, b, self.act, op)
        assert np.array_equal(o_pt.view(np.uint8), o_rp.view(np.uint8)), \
            f"outputs differ from the per-token mode's (max {np.abs(o_pt.astype(np.float64) - o_rp.astype(np.float64)).max():.3g})"
        assert np.array_equal(self.pt.d_conv.to_numpy().view(np.uint8), self.rp.d_conv.to_numpy().view(np.uint8)), \
            "conv_state differs"
        return x, a, b, o_pt

    def flush_and_compare(self, blocks, accepted, rows):
        """Flushes the replay layer's committed slots blocks[n][0] (n in rows) with the accepted
        counts and compares them with the per-token layer's slots blocks[n][A-1]."""
        self.rp.flush([blocks[n][0] for n in rows], [accepted[n] for n in rows])
        got, want = self.rp.ssm(), self.pt.ssm()
        for n in rows:
            c, t = blocks[n][0], blocks[n][accepted[n] - 1]
            assert np.array_equal(got[c].view(np.uint8), want[t].view(np.uint8)), \
                f"flushed slot {c} != per-token slot {t} (request {n}, A = {accepted[n]})"


def spec_meta(L, blocks, accepted, S, decode_slot=None, read=None, prefill=None):
    """One step: spec sequences of L[n] tokens at rows in random order, an optional decode, an
    optional prefill (length, slot, has_initial_state), an optional spec read-slot array."""
    rng = np.random.default_rng(int(sum(L)) * 31 + len(L))
    ns_lens, ns_slots, has_init = [], [], []
    if prefill is not None:
        ns_lens.append(prefill[0]), ns_slots.append(prefill[1]), has_init.append(prefill[2])
    if decode_slot is not None:
        ns_lens.append(1), ns_slots.append(decode_slot), has_init.append(1)
    n_ns, t_ns, t_s = len(ns_lens), int(sum(ns_lens)), int(sum(L))
    rows = rng.permutation(t_ns + t_s).astype(np.int32)
    meta = dict(num_spec_decodes=len(L), num_spec=S, num_actual_tokens=t_ns + t_s, spec_token_count=t_s,
                spec_query_start_loc=np.concatenate([[0], np.cumsum(L)]).astype(np.int32),
                spec_state_indices=np.asarray(blocks, np.int32), num_accepted_tokens=np.asarray(accepted, np.int32),
                spec_token_indx=rows[t_ns:].copy())
    if read is not None:
        meta["spec_read_state_indices"] = np.asarray(read, np.int32)
    if n_ns:
        meta.update(num_prefills=int(prefill is not None), num_decodes=int(decode_slot is not None),
                    non_spec_token_count=t_ns, non_spec_query_start_loc=np.concatenate([[0], np.cumsum(ns_lens)]).astype(np.int32),
                    non_spec_state_indices=np.asarray(ns_slots, np.int32), non_spec_token_indx=rows[:t_ns].copy(),
                    has_initial_state=np.asarray(has_init, np.uint8))
    return meta


def prefill_meta(lens, slots):
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return dict(num_prefills=len(lens), num_actual_tokens=int(qsl[-1]), non_spec_token_count=int(qsl[-1]),
                non_spec_query_start_loc=qsl, non_spec_state_indices=np.asarray(slots, np.int32),
                has_initial_state=np.zeros(len(lens), np.uint8))


def mtp_loop(tw, reqs=3, steps=8, op="attention", check=None):
    """Prefills, then `steps` spec steps with a decode beside them: ragged drafts, random
    acceptance with all-rejected and all-accepted steps, a read slot apart from the committed one,
    a padded spec sequence, a request ending and its slots reused by a new prefill, a mid-loop
    flush (a prefix-cache checkpoint); at the end every committed slot flushed and compared."""
    S, rng = tw.S, tw.rng
    cols = S + 1
    blocks = [list(range(n * cols, (n + 1) * cols)) for n in range(reqs)]
    dec, spare = reqs * cols, reqs * cols + 1
    pad_row = [PAD] * cols
    # Request 0 is prefilled into the spare slot and reads it as its first spec step's read slot.
    first = [spare] + [blocks[n][0] for n in range(1, reqs)]
    tw.step(prefill_meta([5, 70, 2, 3][:reqs] + [4], first + [dec]), op)
    accepted = [1] * reqs
    for step in range(steps):
        L = [int(rng.integers(1, cols + 1)) for _ in range(reqs)]
        if step == 2:
            L = [cols] * reqs  # all drafts ...
        meta_blocks = blocks + [pad_row]
        read = first if step == 0 else None
        if step == 4:  # request 2 ended; a new request is prefilled into its committed slot
            meta = spec_meta(L[:2], blocks[:2], accepted[:2], S, dec, prefill=(9, blocks[2][0], 0))
            tw.step(meta, op)
            accepted[2] = 1
            continue
        # (a padded sequence after step 0: with an explicit read slot the per-token mode computes a
        # pad row's outputs from zeros, replay mode makes it padding)
        meta = (spec_meta(L, blocks, accepted, S, dec, read=read) if step == 0 else
                spec_meta(L + [1], meta_blocks, accepted + [1], S, dec))
        tw.step(meta, op)
        if step == 2:
            accepted = [cols] * reqs  # ... all accepted
        elif step == 3:
            accepted = [1] * reqs  # all rejected
        else:
            accepted = [int(rng.integers(1, n + 1)) for n in L]
        if step == 5:
            tw.flush_and_compare(blocks, accepted, [1])
    tw.flush_and_compare(blocks, accepted, range(reqs))
    # The columns [n][1..] are never touched in replay mode.
    got = tw.rp.ssm()
    for n in range(reqs):
        for t in range(1, cols):
            assert np.array_equal(got[blocks[n][t]].view(np.uint8), tw.ssm0[blocks[n][t]].view(np.uint8))


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
