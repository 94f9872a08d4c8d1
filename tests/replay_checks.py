"""The replay tests' two layers (tests/test_replay.py): one layer's weights and caches on the device in
the per-token mode, the same in replay mode, stepped together through a multi-step MTP loop with
every step's outputs compared bit for bit and the flushed states against the per-token mode's.
Gate modes: the config's (cfg_kw gate_mode="channel": KDA, a and dt_bias HV*K wide)."""
import numpy as np

import pygdn
from pygdn.batch import to_device
from helpers import quantize, ssm_from_canonical, usm

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


def make_config(H, HV, K, V, S, num_slots, state_dtype, ssm_layout, act="f32", replay=0, **kw):
    return pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=num_slots,
                        conv_width=W, act_dtype=act, state_dtype=state_dtype, ssm_layout=ssm_layout,
                        conv_layout="time_major", conv_spec_layout="rolled", conv_state_len=W - 1 + S,
                        replay_tokens=replay, **kw)


def act_array(x, act):
    return pygdn.to_bf16_bits(x) if act == "bf16" else np.asarray(x, np.float32 if act == "f32" else np.float16)


class Twins:
    """The per-token layer and the replay layer, stepped together and compared (cfg_kw: more of the
    config, both layers')."""

    def __init__(self, queue, rng, H, HV, K, V, S, num_slots, state_dtype, ssm_layout, act="f32", extra=1, **cfg_kw):
        self.S, self.act, self.rng = S, act, rng
        self.cfg = make_config(H, HV, K, V, S, num_slots, state_dtype, ssm_layout, act, **cfg_kw)
        self.rcfg = make_config(H, HV, K, V, S, num_slots, state_dtype, ssm_layout, act, replay=S + extra, **cfg_kw)
        C = self.cfg.conv_dim
        w = act_array(rng.standard_normal((C, W)) * 0.5, act)
        bias = act_array(rng.standard_normal(C) * 0.1, act)
        A_log = np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32)
        dt_bias = rng.uniform(-1, 1, HV * self.cfg.gate_k).astype(np.float32)
        conv0 = act_array(rng.standard_normal(self.cfg.conv_state_shape) * 0.5, act)
        ssm0, _ = quantize(rng.standard_normal((num_slots, HV, K, V)) * 0.3, state_dtype)
        ssm0 = ssm_from_canonical(ssm0, ssm_layout)
        self.pt = Engine(queue, self.cfg, w, bias, A_log, dt_bias, conv0, ssm0)
        self.rp = Engine(queue, self.rcfg, w, bias, A_log, dt_bias, conv0, ssm0)
        self.ssm0 = ssm0.copy()

    def tokens(self, n):
        C, HV = self.cfg.conv_dim, self.cfg.num_v_heads
        return (act_array(self.rng.standard_normal((n, C)), self.act),
                act_array(self.rng.standard_normal((n, HV * self.cfg.gate_k)), self.act),
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
