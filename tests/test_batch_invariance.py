"""Batch invariance (include/gdn_xpu.h "Batch invariance"): a sequence's outputs and stored states
do not depend on what else its call holds. Three sequences -- a prefill of 70 tokens (the chunked
form), a decode, a spec sequence of 3 tokens -- run alone, then inside batches of 3, 8 and 32
sequences with other sequences in other slots, other row orders (interleaved, grouped, decodes
before prefills), graph padding and the fused gated RMSNorm, on both kernel families: their output
rows and every slot they write are bit-identical in every batch.

Kernel builds: K = V = 16, f32, the shapes of test_replay.py and test_kda.py (their builds are shared);
HV = 4 v-heads in the GDN layer, so the norm's (row, v-head) items come in counts that are not
multiples of 16."""
import itertools

import numpy as np
import pytest

import pygdn
from pygdn.batch import to_device
from helpers import usm

K = V = 16
W, S = 4, 3
COLS = S + 1
SLOTS = 160
PAD = -1
# The three sequences compared: kind, tokens, slots (the spec sequence's row of 1 + S), accepted.
TARGETS = {"prefill": ("prefill", 70, [0], 1), "decode": ("decode", 1, [1], 1),
           "spec": ("spec", 3, [2, 3, 4, 5], 2)}


def config(layer):
    heads = dict(num_k_heads=2, num_v_heads=4) if layer != "kda" else dict(
        num_k_heads=2, num_v_heads=2, gate_mode="channel", out_gate="sigmoid")
    return pygdn.Config(**heads, head_k_dim=K, head_v_dim=V, num_slots=SLOTS, conv_width=W, act_dtype="f32",
                        ssm_layout="kv" if layer == "kda" else "vk", conv_layout="time_major",
                        conv_spec_layout="rolled", conv_state_len=W - 1 + S,
                        replay_tokens=COLS if layer == "gdn_replay" else 0)


class Layer:
    """Weights, initial caches and every sequence's token inputs; run(seqs, order) makes one call."""

    def __init__(self, queue, rng, cfg):
        self.q, self.cfg, self.rng = queue, cfg, rng
        C, HV = cfg.conv_dim, cfg.num_v_heads
        f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
        self.weights = dict(conv_weight=usm(queue, f(C, W) * 0.5), conv_bias=usm(queue, f(C) * 0.1),
                            A_log=usm(queue, np.log(rng.uniform(0.5, 4.0, HV)).astype(np.float32)),
                            dt_bias=usm(queue, rng.uniform(-1, 1, HV * cfg.gate_k).astype(np.float32)),
                            norm_weight=usm(queue, rng.uniform(0.5, 1.5, V).astype(np.float32)))
        self.conv0, self.ssm0 = f(*cfg.conv_state_shape) * 0.5, f(*cfg.ssm_state_shape) * 0.3
        self.widths = dict(mixed_qkv=C, a=HV * cfg.gate_k, b=HV, z=HV * V)
        self.tokens = {}  # sequence name -> its rows of each input

    def inputs(self, name, n):
        if name not in self.tokens:
            self.tokens[name] = {k: self.rng.standard_normal((n, w)).astype(np.float32) for k, w in self.widths.items()}
        return self.tokens[name]

    def run(self, seqs, order):
        """seqs: (name, kind, tokens, slots, accepted); kind "pad" / "spec_pad": graph padding.
        order: "random" (rows interleaved), "grouped" (non-spec rows first), "spec_first".
        Returns {name: (output rows, {slot: (conv, ssm[, ring, count])})} of the named sequences."""
        ns = [s for s in seqs if s[1] in ("prefill", "decode", "pad")]
        sp = [s for s in seqs if s[1] in ("spec", "spec_pad")]
        t_ns, t_s = sum(s[2] for s in ns), sum(s[2] for s in sp)
        T = t_ns + t_s
        rows = {"random": self.rng.permutation(T), "grouped": np.arange(T),
                "spec_first": np.concatenate([np.arange(t_s, T), np.arange(t_s)])}[order]
        x = {k: np.zeros((T, w), np.float32) for k, w in self.widths.items()}
        at, where = 0, {}
        for s in ns + sp:
            where[s[0]] = rows[at:at + s[2]]
            for k, v in self.inputs(s[0], s[2]).items():
                x[k][where[s[0]]] = v
            at += s[2]
        qsl = lambda group: np.cumsum([0] + [s[2] for s in group]).astype(np.int32)  # noqa: E731
        meta = dict(num_prefills=sum(s[1] == "prefill" for s in ns), num_decodes=sum(s[1] != "prefill" for s in ns),
                    num_spec_decodes=len(sp), num_spec=S, num_actual_tokens=T, non_spec_token_count=t_ns,
                    spec_token_count=t_s, non_spec_query_start_loc=qsl(ns),
                    non_spec_state_indices=np.array([s[3][0] for s in ns], np.int32),
                    has_initial_state=np.ones(len(ns), np.uint8), non_spec_token_indx=rows[:t_ns].astype(np.int32),
                    spec_query_start_loc=qsl(sp), spec_state_indices=np.array([s[3] for s in sp], np.int32),
                    num_accepted_tokens=np.array([s[4] for s in sp], np.int32), spec_token_indx=rows[t_ns:].astype(np.int32))
        if not ns:
            meta.update({k: None for k in ("non_spec_query_start_loc", "non_spec_state_indices", "has_initial_state",
                                           "non_spec_token_indx")})
        if not sp:
            meta.update({k: None for k in ("spec_query_start_loc", "spec_state_indices", "num_accepted_tokens",
                                           "spec_token_indx")})
        caches = dict(conv_state=usm(self.q, self.conv0), ssm_state=usm(self.q, self.ssm0))
        if self.cfg.replay_tokens:
            caches.update(replay_ring=usm(self.q, np.zeros(self.cfg.replay_ring_shape, np.float32)),
                          replay_count=usm(self.q, np.zeros(self.cfg.replay_count_shape, np.int32)))
        out = usm(self.q, np.zeros((T, self.cfg.num_v_heads, V), np.float32))
        pygdn.attention(self.q, self.cfg, to_device(meta, self.q, validate="counts"), core_attn_out=out,
                        **{k: usm(self.q, v) for k, v in x.items()}, **self.weights, **caches)
        out = out.to_numpy()
        states = {k: v.to_numpy() for k, v in caches.items()}
        return {s[0]: (out[where[s[0]]], {slot: tuple(a[slot:slot + 1] for a in states.values()) for slot in s[3]})
                for s in seqs if s[0] in TARGETS}


NAMES = itertools.count()


def others(rng, n, free):
    """n other sequences (decodes, spec sequences, short prefills, graph padding) in slots from `free`."""
    seqs = []
    for i in range(n):
        kind = ["decode", "spec", "decode", "prefill", "spec", "pad", "spec_pad"][i % 7]
        name = f"other{next(NAMES)}"
        if kind == "spec":
            seqs.append((name, kind, int(rng.integers(1, COLS + 1)), [free.pop() for _ in range(COLS)],
                         int(rng.integers(1, COLS + 1))))
        elif kind == "spec_pad":
            seqs.append((name, kind, COLS, [PAD] * COLS, 1))
        else:
            tokens = {"decode": 1, "prefill": int(rng.integers(2, 90)), "pad": 1}[kind]
            seqs.append((name, kind, tokens, [free.pop() if kind != "pad" else PAD], 1))
    return seqs


@pytest.mark.parametrize("layer", ["gdn", "gdn_replay", "kda"])
def test_sequences_alone_and_in_batches(queue, kernels, layer):
    rng = np.random.default_rng(800)
    lay = Layer(queue, rng, config(layer))
    targets = [(name, *spec) for name, spec in TARGETS.items()]
    alone = {}
    for t in targets:
        alone.update(lay.run([t], "grouped"))
    free = list(rng.permutation(np.arange(6, SLOTS)))
    batches = {
        "the three, B = 3": (targets, "random"),
        "B = 8, interleaved": (others(rng, 2, free) + targets[::-1] + others(rng, 3, free), "random"),
        "B = 8, decodes before prefills, spec rows first": (
            [targets[1]] + others(rng, 4, free)[:1] + [targets[0]] + others(rng, 4, free) + [targets[2]], "spec_first"),
        "B = 32, grouped rows": (others(rng, 14, free) + targets + others(rng, 15, free), "grouped"),
        "B = 32, interleaved": (targets[2:] + others(rng, 20, free) + targets[:2] + others(rng, 9, free), "random"),
    }
    for what, (seqs, order) in batches.items():
        got = lay.run(seqs, order)
        for name, (out, slots) in alone.items():
            assert np.array_equal(got[name][0].view(np.uint32), out.view(np.uint32)), f"{what}: the {name}'s outputs"
            for slot, arrays in slots.items():
                for a, b, cache in zip(got[name][1][slot], arrays, ("conv", "ssm", "ring", "ring count")):
                    assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"{what}: the {name}'s {cache} slot {slot}"
    assert all(np.any(out != 0) for out, _ in alone.values())
