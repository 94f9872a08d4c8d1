"""The benchmark's work: one step at Qwen3-Next TP=1 shapes as a Case (host inputs, initial
caches, metadata), its useful bytes and FLOPs, pygdn running it (Ours), and one case measured
against the peers (run_case), with its KDA twin where the plan asks for one (KDA_H: Kimi Linear's
per-channel gates at the same H*K*V)."""
from __future__ import annotations

import dataclasses as dc
import time

import numpy as np

import pygdn
from pygdn import reference as ref
from pygdn.batch import make_batch, to_device

from machine import StatePass, reference_passes
from peers import CHUNK
from report import KDA_TWIN, REFERENCE_PASSES, REPLAY_PASSES, STATE_PASSES, progress_line, row_line
from timing import LATE_BUDGET_S, RETRY_SHARE, first_call_s, timed_blocks, wait_quiet

H, HV, K, V, W = 16, 32, 128, 128, 4          # Qwen3-Next-80B-A3B linear attention, TP=1
# The model around those layers, from the HF config.json of Qwen/Qwen3-Next-80B-A3B-Instruct
# (num_hidden_layers 48, full_attention_interval 4: every 4th layer is full attention, the others GDN;
# linear_num_key_heads 16 = H, linear_num_value_heads 32 = HV, linear_key_head_dim 128 = K,
# linear_value_head_dim 128 = V): the SSM state a sequence holds (model_state_bytes).
MODEL_LAYERS, FULL_ATTENTION_INTERVAL = 48, 4
GDN_LAYERS = MODEL_LAYERS - MODEL_LAYERS // FULL_ATTENTION_INTERVAL   # 36
# KDA (gate_mode "channel", Kimi-Linear-48B-A3B TP=1: 32 heads, head dim 128) needs as many k-heads as
# v-heads: its twin of a GDN case has KDA_H = HV k-heads, so HV*K*V (the state) is the same.
KDA_H = HV


# ----------------------------------------------------------------------------- the work
@dc.dataclass
class Case:
    """One benchmark step: host float32 inputs (bf16-rounded for bf16), initial caches in
    pygdn's layouts (conv [slots, state_len, C], ssm [slots, HV, V, K]) and the metadata."""

    kind: str              # "decode" | "spec" | "prefill"
    label: str
    batch: int             # sequences
    num_spec: int
    lens: tuple            # tokens per sequence
    act: str
    meta: dict
    x: np.ndarray
    a: np.ndarray
    b: np.ndarray
    conv_w: np.ndarray
    conv_b: object
    A_log: np.ndarray
    dt_bias: np.ndarray
    conv0: np.ndarray
    ssm0: np.ndarray
    H: int = H
    HV: int = HV
    K: int = K
    V: int = V
    W: int = W
    l2_eps: float = 1e-6
    gate_mode: str = "head"  # "channel": KDA (a and dt_bias hold HV*K gates per row)

    @property
    def gate_k(self):
        """Gates per v-head and row (pygdn.Config.gate_k)."""
        return self.K if self.gate_mode == "channel" else 1

    @property
    def C(self):
        return 2 * self.H * self.K + self.HV * self.V

    @property
    def rows(self):
        return int(self.meta["num_actual_tokens"])

    @property
    def state_len(self):
        return self.W - 1 + self.num_spec

    @property
    def num_slots(self):
        return int(self.ssm0.shape[0])


def _round_act(x, act):
    x = np.asarray(x, np.float32)
    return pygdn.from_bf16_bits(pygdn.to_bf16_bits(x)) if act == "bf16" else x


def _lean_rows(rng, T, C, act, period=2048):
    """[T, C] activations in pygdn's encoding (bf16: uint16 bits) without a float32 copy of the
    whole array: a random block of `period` rows repeated. For the long prefills of the sweep
    (131072 x 8192 float32 alone would be 4 GiB); the values only have to be realistic, not new."""
    block = _round_act(rng.standard_normal((min(T, period), C), np.float32), act)
    block = pygdn.to_bf16_bits(block) if act == "bf16" else block
    out = np.empty((T, C), block.dtype)
    for r0 in range(0, T, len(block)):
        out[r0:r0 + len(block)] = block[:T - r0]
    return out


def make_case(kind, act, batch=1, num_spec=0, lens=(), seed=0, lean=False, gate_mode="head"):
    """lean: mixed_qkv already encoded for pygdn (bf16 bits) and built by _lean_rows (a prefill
    measured for pygdn only: the peers need float inputs). gate_mode "channel": the KDA twin (KDA_H
    k-heads, a gate per key channel, labelled "KDA ...")."""
    rng = np.random.default_rng(seed)
    kda = gate_mode == "channel"
    h, gk = (KDA_H, K) if kda else (H, 1)
    if kind == "decode":
        slots = batch
        meta = make_batch(rng, num_slots=slots, num_decodes=batch, order="grouped", identity_indices=True)
        label, lens = f"decode B={batch}", (1,) * batch
    elif kind == "spec":
        slots = batch * (1 + num_spec)
        meta = make_batch(rng, num_slots=slots, spec_lens=[1 + num_spec] * batch, num_spec=num_spec,
                          order="grouped", identity_indices=True)
        label, lens = f"spec S={num_spec} B={batch}", (1 + num_spec,) * batch
    else:
        slots = batch = len(lens)
        meta = make_batch(rng, num_slots=slots, prefill_lens=list(lens), has_initial_state=[1] * batch,
                          order="grouped", identity_indices=True)
        label = f"prefill {lens[0]}" if batch == 1 else f"prefill {batch}x{lens[0]}"
    T = int(meta["num_actual_tokens"])
    C = 2 * h * K + HV * V
    st = W - 1 + num_spec
    f32 = np.float32
    return Case(kind=kind, label=("KDA " if kda else "") + label, batch=batch, num_spec=num_spec, lens=tuple(lens),
                act=act, meta=meta,
                x=_lean_rows(rng, T, C, act) if lean else _round_act(rng.standard_normal((T, C), f32), act),
                a=_round_act(rng.standard_normal((T, HV * gk), f32), act),
                b=_round_act(rng.standard_normal((T, HV), f32), act),
                conv_w=_round_act(rng.standard_normal((C, W), f32) * 0.5, act), conv_b=None,  # neither has a conv bias
                A_log=np.log(rng.uniform(1.0, 16.0, HV)).astype(f32), dt_bias=np.ones(HV * gk, f32),
                conv0=_round_act(rng.standard_normal((slots, st, C), f32), act),
                ssm0=rng.standard_normal((slots, HV, V, K), f32) * f32(0.05), H=h, gate_mode=gate_mode)


STATE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "i8": 1, "f8e4m3": 1}
# An 8-bit state (cfg.state_dtype "i8" / "f8e4m3") has one f32 scale per state row beside its codes
# (ssm_scale [slots, HV, V]: value = code * scale); these bytes move with the state.
SCALE_BYTES = {"i8": 4, "f8e4m3": 4}


def head_bytes(k, v, state_dtype="f32"):
    """Bytes of one v-head's state: k x v elements in the state dtype, and for an 8-bit state the v
    scales of its rows."""
    return k * v * STATE_BYTES[state_dtype] + v * SCALE_BYTES.get(state_dtype, 0)


def head_state_bytes(case, state_dtype="f32"):
    """head_bytes at a case's K and V."""
    return head_bytes(case.K, case.V, state_dtype)


def slot_state_bytes(case, state_dtype="f32"):
    """Bytes of one slot's ssm state (HV heads, head_state_bytes each)."""
    return case.HV * head_state_bytes(case, state_dtype)


# The state dtypes of model_state_bytes, and the budget of state its concurrency is counted in.
MODEL_STATE_DTYPES = ("f32", "bf16", "i8", "f8e4m3")
STATE_BUDGET_BYTES = 1 << 30


def model_state_bytes(hv=HV, k=K, v=V, layers=GDN_LAYERS):
    """The SSM state one sequence (slot) holds at Qwen3-Next-80B-A3B's shapes, TP=1, per state dtype:
    bytes per GDN layer (HV K V elements, + HV V f32 scales for 8-bit), per model (GDN_LAYERS of
    MODEL_LAYERS layers), and the slots STATE_BUDGET_BYTES of state holds (the sequences it serves
    at once; conv states and the full-attention layers' KV cache not counted)."""
    out = {"model": "Qwen3-Next-80B-A3B TP=1", "gdn_layers": layers, "layers": MODEL_LAYERS, "HV": hv, "K": k, "V": v,
           "budget_bytes": STATE_BUDGET_BYTES}
    for sd in MODEL_STATE_DTYPES:
        layer = hv * head_bytes(k, v, sd)
        out[sd] = {"per_layer": layer, "per_model": layers * layer,
                   "slots_per_budget": STATE_BUDGET_BYTES // (layers * layer)}
    return out


def model_state_line(m):
    """model_state_bytes as one line: per dtype, bytes per slot per GDN layer and per model, slots per GiB."""
    cells = [f"{sd} {m[sd]['per_layer'] / 2**20:.3f} MiB/layer, {m[sd]['per_model'] / 2**20:.2f} MiB/model, "
             f"{m[sd]['slots_per_budget']} slots ({m[sd]['slots_per_budget'] / m['f32']['slots_per_budget']:.1f}x f32)"
             for sd in MODEL_STATE_DTYPES]
    return (f"SSM state per sequence, {m['model']} ({m['gdn_layers']} GDN layers of {m['layers']}, HV={m['HV']} "
            f"K={m['K']} V={m['V']}; 8-bit: + 4 B scale per v-row), slots in {m['budget_bytes'] / 2**30:.0f} GiB: "
            + "; ".join(cells))


def traffic_bytes(case, state_dtype="f32", replay=False):
    """Useful memory traffic of one step: each ssm state touched read once per sequence and
    written once per state written back (decode/prefill: once; spec: once per token, the
    per-token write-backs; spec in replay mode: once, plus the ring entries replayed (read) and
    the step's tokens' entries (written), f32), in the state dtype's bytes; conv state read +
    written; mixed_qkv and a/b in, core_attn_out out, conv weight. Workspace intermediates are
    not counted."""
    return sum(traffic_split(case, state_dtype, replay))


def ring_entry_bytes(case):
    """Bytes of one replay-mode ring entry: k [H, K], v [HV, V], g [HV, gate_k], beta [HV], f32."""
    return 4 * (case.H * case.K + case.HV * case.V + case.HV * (case.gate_k + 1))


def traffic_split(case, state_dtype="f32", replay=False):
    """traffic_bytes as (bytes read, bytes written)."""
    act = 2 if case.act == "bf16" else 4
    C, T, n = case.C, case.rows, case.batch
    sb = slot_state_bytes(case, state_dtype)
    read = T * C * act + T * case.HV * (case.gate_k + 1) * act + C * case.W * act + n * sb + n * (case.W - 1) * C * act
    written = T * case.HV * case.V * act
    if case.kind == "spec" and replay:
        accepted = int(np.sum(case.meta["num_accepted_tokens"]))
        read += accepted * ring_entry_bytes(case) + 4 * n
        written += n * sb + T * ring_entry_bytes(case) + 4 * n + n * (case.W - 2 + case.num_spec + 1) * C * act
    elif case.kind == "spec":
        written += n * (case.num_spec + 1) * sb + n * (case.W - 2 + case.num_spec + 1) * C * act
    else:
        written += n * sb + n * (case.W - 1) * C * act
    return read, written


def conv_traffic_bytes(case):
    """Useful memory traffic of the conv alone (pygdn.causal_conv1d): mixed_qkv's rows in, the conv
    output's rows out, the conv weight, and each sequence's conv state read and written (W-1 columns;
    a spec step writes its W-2+1+num_spec)."""
    act = 2 if case.act == "bf16" else 4
    cols = case.W - 2 + case.num_spec + 1 if case.kind == "spec" else case.W - 1
    return act * case.C * (2 * case.rows + case.W + case.batch * (case.W - 1 + cols))


def chunked_flops(case):
    """FLOPs of the chunked (WY/UT, chunks of CHUNK tokens) gated delta rule + conv of a prefill, per
    v-head and chunk of n tokens (multiply-add = 2, triangular products counted half):
    K K^T and Q K^T: 2 n^2 K; T=(I+A)^-1: n^3/3; W = T(beta e^G K): n^2 K; U = T(beta V): n^2 V;
    u = U - W S, q S, S += K^T u: 6 n K V; Aqk u: n^2 V; decay of S: K V. Conv: 2 W C per token.
    KDA (a decay per key channel): the same products on q and k scaled by the cumulative per-channel
    decays, and 5 n K for those (the cumulative sum, the scalings of q, k and of k to the chunk end)."""
    f = 0.0
    for L in case.lens:
        for c0 in range(0, L, CHUNK):
            n = min(CHUNK, L - c0)
            f += case.HV * (3 * n * n * case.K + 2 * n * n * case.V + n ** 3 / 3 + 6 * n * case.K * case.V
                            + case.K * case.V + (5 * n * case.K if case.gate_k > 1 else 0))
        f += 2 * case.W * case.C * L
    return f


# ----------------------------------------------------------------------------- pygdn
class Unsupported(Exception):
    """This build of pygdn / libgdn_xpu cannot run the asked variant (bf16 state, checkpoints)."""


def _batch_fields():
    return {f.name for f in dc.fields(pygdn.Batch)}


def checkpoint_meta(meta, interval, first_slot):
    """meta with block checkpoints every `interval` tokens (gdn_batch_t version 2):
    every non-spec sequence starts at position 0 and stores each boundary's state to its own
    slot, first_slot, first_slot + 1, ... Returns (meta, slots used)."""
    lens = np.diff(np.asarray(meta["non_spec_query_start_loc"], np.int64))
    cols = max(1, int(max(lens)) // interval)
    n = len(lens)
    ck = np.full((n, cols), meta.get("pad_slot_id", -1), np.int32)
    for i, L in enumerate(lens):
        ck[i, :L // interval] = first_slot + i * cols + np.arange(L // interval)
    out = dict(meta, checkpoint_interval=interval, checkpoint_cols=cols,
               non_spec_start_pos=np.zeros(n, np.int32), checkpoint_state_indices=ck.reshape(-1))
    return out, n * cols


class Ours:
    """pygdn.attention on USM shared arrays of the queue, caches kept between steps.

    state_dtype "bf16" (the ssm cache in bf16), "i8" / "f8e4m3" (8-bit codes with an f32 scale per
    state row, ssm_scale, beside them) and checkpoint_interval > 0 (block checkpoints during a
    prefill) need a build that has them; Unsupported says why not.
    own_workspace: the call gets a workspace array of its own (freed with this object) instead
    of the library's per-queue one, which only grows: the long prefills of the sweep."""

    name = "ours"

    def __init__(self, queue, case, ssm_layout="vk", state_dtype="f32", checkpoint_interval=0, own_workspace=False,
                 replay=False, prefill_precision=None):
        self.q, self.case, self.layout, self.state_dtype, self.replay = queue, case, ssm_layout, state_dtype, replay
        meta, extra = case.meta, 0
        if replay:  # one slot per sequence, holding the state its per-token twin reads
            if "replay_tokens" not in {f.name for f in dc.fields(pygdn.Config)}:
                raise Unsupported("pygdn.Config has no replay_tokens (replay mode)")
            cols = np.asarray(meta["spec_state_indices"]).reshape(case.batch, -1)
            first = cols[np.arange(case.batch), np.asarray(meta["num_accepted_tokens"]) - 1]
            lines = cols[:, 0]
            rows = np.full_like(cols, meta.get("pad_slot_id", -1))
            rows[:, 0] = np.arange(case.batch)
            meta = dict(meta, spec_state_indices=rows.reshape(-1))
        if checkpoint_interval:
            if "checkpoint_interval" not in _batch_fields():
                raise Unsupported("pygdn.Batch has no checkpoint_interval (block checkpoints)")
            meta, extra = checkpoint_meta(meta, checkpoint_interval, case.num_slots)
        slots = case.batch if replay else case.num_slots + extra
        dtype_kw = {} if state_dtype == "f32" else {"state_dtype": state_dtype}  # older builds: no such field
        if replay:
            dtype_kw["replay_tokens"] = case.num_spec + 1
        if prefill_precision is not None:  # (None: the default, "auto"; older builds have no such field)
            if "prefill_precision" not in {f.name for f in dc.fields(pygdn.Config)}:
                raise Unsupported("pygdn.Config has no prefill_precision")
            dtype_kw["prefill_precision"] = prefill_precision
        try:
            self.cfg = pygdn.Config(num_k_heads=case.H, num_v_heads=case.HV, head_k_dim=case.K, head_v_dim=case.V,
                                    num_slots=slots, conv_width=case.W, act_dtype=case.act, ssm_layout=ssm_layout,
                                    conv_layout="time_major", conv_spec_layout="rolled", conv_state_len=case.state_len,
                                    gate_mode=case.gate_mode, **dtype_kw)
        except TypeError as e:
            raise Unsupported("pygdn.Config has no state_dtype" if "state_dtype" in str(e) else str(e)) from None
        except ValueError as e:  # a state dtype this build does not know
            if "state_dtype" not in str(e):
                raise
            raise Unsupported(str(e)) from None
        enc = pygdn.to_bf16_bits if case.act == "bf16" else (lambda v: np.ascontiguousarray(v, np.float32))
        x = case.x if case.x.dtype == np.uint16 else enc(case.x)  # lean cases come encoded
        U = lambda v: pygdn.UsmArray.from_numpy(v, queue)  # noqa: E731
        ssm = case.ssm0 if ssm_layout == "vk" else np.swapaxes(case.ssm0, 2, 3)
        conv = enc(case.conv0)
        if replay:
            ssm, conv = ssm[first], conv[lines]
        if extra:  # checkpoint slots start as zeros
            ssm = np.concatenate([ssm, np.zeros((extra,) + ssm.shape[1:], ssm.dtype)])
            conv = np.concatenate([conv, np.zeros((extra,) + conv.shape[1:], conv.dtype)])
        scales = None
        if state_dtype in SCALE_BYTES:  # rows along K: a vk state [.., V, K] is quantized as [.., K, V]
            rows_last = ssm_layout == "vk"
            codes, scales = ref.quantize_state(np.swapaxes(ssm, 2, 3) if rows_last else ssm, state_dtype,
                                               scale_dtype=np.float32)
            ssm = np.ascontiguousarray(np.swapaxes(codes, 2, 3) if rows_last else codes)
        else:
            ssm = pygdn.to_bf16_bits(ssm) if state_dtype == "bf16" else np.ascontiguousarray(ssm, np.float32)
        act_np = np.uint16 if case.act == "bf16" else np.float32
        self.arrays = dict(mixed_qkv=U(x), a=U(enc(case.a)), b=U(enc(case.b)),
                           conv_weight=U(enc(case.conv_w)), A_log=U(case.A_log), dt_bias=U(case.dt_bias),
                           conv_state=U(conv), ssm_state=U(ssm),
                           core_attn_out=pygdn.UsmArray((case.rows, case.HV, case.V), act_np, queue))
        if scales is not None:
            self.arrays["ssm_scale"] = U(np.ascontiguousarray(scales, np.float32))
        if replay:
            self.arrays.update(replay_ring=U(np.zeros(self.cfg.replay_ring_shape, np.float32)),
                               replay_count=U(np.zeros(self.cfg.replay_count_shape, np.int32)))
        self._conv_out = None  # the breakdown's conv output, made when first needed
        self.meta, self.batch = meta, to_device(meta, queue)
        if own_workspace:
            self.arrays["workspace"] = pygdn.UsmArray((pygdn.workspace_size(self.cfg, self.batch),), np.uint8, queue,
                                                      usm_type="device")
        self._prepared = None  # the timed steps' call, made by the first step

    def step(self):
        """One step. The first is a plain pygdn.attention call whose metadata the library reads back and
        checks (validate="full"); the others run it as a serving loop does: prepared once (pygdn.prepare),
        its metadata trusted (validate="counts"), so a step costs the C call, its kernels and the wait.
        (The plain call's host cost is measured on its own: machine.host_overhead.)"""
        try:
            if self._prepared is None:
                pygdn.attention(self.q, self.cfg, self.batch, **self.arrays)
                counts = to_device(self.meta, self.q, validate="counts")
                self._prepared = pygdn.prepare(pygdn.attention, self.q, self.cfg, counts, **self.arrays)
            else:
                self._prepared.run()
        except pygdn.GdnError as e:
            if e.status == pygdn.lib.GDN_ERROR_UNSUPPORTED:
                raise Unsupported(str(e)) from None
            raise

    @property
    def conv_out(self):
        if self._conv_out is None:
            act_np = np.uint16 if self.case.act == "bf16" else np.float32
            self._conv_out = pygdn.UsmArray((self.case.rows, self.case.C), act_np, self.q)
        return self._conv_out

    def conv_only(self):
        A = self.arrays
        pygdn.causal_conv1d(self.q, self.cfg, self.batch, mixed_qkv=A["mixed_qkv"], conv_weight=A["conv_weight"],
                            conv_state=A["conv_state"], conv_out=self.conv_out)

    def delta_only(self):
        A = self.arrays
        pygdn.gated_delta_rule(self.q, self.cfg, self.batch, conv_out=self.conv_out, ssm_state=A["ssm_state"],
                               core_attn_out=A["core_attn_out"], a=A["a"], b=A["b"], A_log=A["A_log"],
                               dt_bias=A["dt_bias"], **({"ssm_scale": A["ssm_scale"]} if "ssm_scale" in A else {}))

    def result(self):
        out = self.arrays["core_attn_out"].to_numpy()
        out = pygdn.from_bf16_bits(out) if self.case.act == "bf16" else out
        ssm = self.arrays["ssm_state"].to_numpy()[:self.case.num_slots]
        if self.state_dtype in SCALE_BYTES:  # code * scale, rows along K (see __init__)
            scales = self.arrays["ssm_scale"].to_numpy()[:self.case.num_slots]
            rows_last = self.layout == "vk"
            ssm = ref.dequantize_state(np.swapaxes(ssm, 2, 3) if rows_last else ssm, scales, self.state_dtype)
            ssm = (np.swapaxes(ssm, 2, 3) if rows_last else ssm).astype(np.float32)
        ssm = pygdn.from_bf16_bits(ssm) if self.state_dtype == "bf16" else ssm
        return out.astype(np.float32), (ssm if self.layout == "vk" else np.swapaxes(ssm, 2, 3))


def l3_bytes():
    """The largest cache of this machine (sysfs), or 32 MiB when it does not say."""
    best = 0
    try:
        import glob
        for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
            with open(path) as f:
                s = f.read().strip()
            best = max(best, int(s[:-1]) * {"K": 1 << 10, "M": 1 << 20}.get(s[-1], 1) if s[-1] in "KM" else int(s))
    except (OSError, ValueError):
        pass
    return best or 32 << 20


class Rotating:
    """R copies of one Ours (each with its own caches), stepped in turn, R chosen so that the
    copies together hold >= max(256 MiB, 4 x the last-level cache): every step then finds its
    state in DRAM, as a model's layer does (Qwen3-Next runs 35 other GDN layers between two steps
    of one layer). Repeating one step on one set of caches would time an L3-resident state (a
    batch-8 f32 state is 16 MiB; the 2-core test host has a 32 MiB L3) against a DRAM bandwidth."""

    def __init__(self, make, set_bytes):
        self.pool_bytes = max(256 << 20, 4 * l3_bytes())
        self.items = [make() for _ in range(max(2, -(-self.pool_bytes // max(set_bytes, 1))))]
        self.i = 0

    def __len__(self):
        return len(self.items)

    def call(self, method):
        """A function running `method` of the next copy each time it is called; its `cycle`, the
        calls of one turn over the copies, is what timing.timed_blocks warms up."""
        def run():
            item = self.items[self.i]
            self.i = (self.i + 1) % len(self.items)
            getattr(item, method)()
        run.cycle = len(self.items)
        return run

    @property
    def first(self):
        return self.items[0]


def cache_set_bytes(case, state_dtype="f32"):
    """Bytes of the caches one step touches: its ssm state slots and conv state lines."""
    act = 2 if case.act == "bf16" else 4
    return case.num_slots * (slot_state_bytes(case, state_dtype) + case.state_len * case.C * act)


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-6)
    return float(np.max(np.abs(got - want))) / scale


# ----------------------------------------------------------------------------- one case, ours and the peers
# Our step in other cache formats, measured beside the default (vk layout, f32 state) on every
# decode / spec case: (record key, ssm layout, state dtype).
VARIANTS = (("ours_kv_layout", "kv", "f32"), ("ours_bf16_state", "vk", "bf16"), ("ours_bf16_state_kv", "kv", "bf16"),
            ("ours_i8_state", "vk", "i8"), ("ours_f8e4m3_state", "vk", "f8e4m3"))
# The 8-bit state variants (their scales counted in their bytes; time also against bf16's, "vs_bf16").
STATE8_VARIANTS = tuple(v[0] for v in VARIANTS if v[2] in SCALE_BYTES)
# Spec rows also in replay mode (gdn_xpu.h "Replay mode"), f32 and bf16 state, vk layout: (record
# key, state dtype). Timed in the same rounds as the per-token step.
REPLAY_VARIANTS = (("ours_replay", "f32"), ("ours_replay_bf16_state", "bf16"))
# Prefill rows also with each cfg.prefill_precision the default ("auto") does not take on the device:
# (record key, setting); its time against ours ("vs_ours") is the two settings' ratio in one run.
PREFILL_VARIANTS = (("ours_prefill_f32", "f32"), ("ours_prefill_bf16", "bf16"))
# Timed in interleaved rounds (timing.timed_blocks): the variants, and the state passes and the
# reference's stream kernels their times are read against.
TOGETHER = ("ours", KDA_TWIN) + tuple(v[0] for v in VARIANTS + REPLAY_VARIANTS + PREFILL_VARIANTS) \
    + tuple(p[0] for p in STATE_PASSES + REPLAY_PASSES + REFERENCE_PASSES)
# A bf16 state cache is rounded once per stored state (relative 2^-9): its outputs and states
# against the f32-state step, max |diff| / max |f32|, must stay well inside this.
STATE_TOL = 2e-2
# The same check per state dtype. An 8-bit state is rounded once per stored state to a grid of its
# row's largest value: i8 to within amax / 254 (half a step of amax / 127), f8e4m3 to 3 mantissa bits
# (within 1/16 of the value, and coarser below its normal range), its initial state included (the
# f32-state step starts from the unrounded one); so 5e-2 for i8 and 1.5e-1 for f8e4m3, max |diff| /
# max |f32|.
STATE_TOLS = {"bf16": STATE_TOL, "i8": 5e-2, "f8e4m3": 1.5e-1}
# bf16 operands of the chunk products (docs/op.md "Prefill precision"): the two settings' outputs and
# states against each other, max |diff| / max |one|.
PREFILL_TOL = 5e-2


def add_prefill_precisions(queue, case, cfg, rec, impls, agreement, ref_out, ref_ssm, plan, log, reps):
    """A prefill row's step with the prefill_precision setting the default (ours, config cfg) does
    not take here (PREFILL_VARIANTS; the default's path in rec["prefill_path"]), checked against
    ours, timed with it."""
    if not hasattr(pygdn, "prefill_path"):  # an older build
        plan["unsupported"]["prefill_precision"] = "pygdn has no prefill_path"
        return
    rec["prefill_path"] = pygdn.prefill_path(queue, cfg)
    for name, precision in PREFILL_VARIANTS:
        if rec["prefill_path"][0] == "f32" and precision == "f32" or rec["prefill_path"][0] != "f32" and precision != "f32":
            continue  # what ours runs
        try:
            o = Ours(queue, case, prefill_precision=precision)
            impls[name] = (o.step, reps, first_call_s(o.step))
            rec[f"path_{name}"] = pygdn.prefill_path(queue, o.cfg)
        except (Unsupported, pygdn.GdnError) as e:
            log(f"  prefill_precision {precision}: not run ({type(e).__name__}: {e})")
            continue
        out, ssm = o.result()
        a = {"out": rel_err(out, ref_out), "ssm": rel_err(ssm, ref_ssm)}
        a["ok"] = bool(a["out"] <= PREFILL_TOL and a["ssm"] <= PREFILL_TOL)
        agreement[name] = a


def add_replay(queue, case, rec, impls, agreement, ref_out, plan, log, reps):
    """The spec step in replay mode (REPLAY_VARIANTS) and the bare passes of the state bytes it
    moves (REPLAY_PASSES: each state read once and written once), into impls. Every cache copy
    takes one step first, so each timed step replays the accepted tokens of the one before (the
    steady state: the step repeats its batch, whose tokens fill the ring)."""
    for (name, sd), (pname, _) in zip(REPLAY_VARIANTS, REPLAY_PASSES):
        if name in plan["unsupported"]:
            continue
        try:
            rot = Rotating(lambda: Ours(queue, case, state_dtype=sd, replay=True), replay_set_bytes(case, sd))
            run = rot.call("step")
            first = first_call_s(run)  # copy 0's first step: nothing to replay, the per-token twin's outputs
            out, _ = rot.first.result()
            for _ in range(len(rot) - 1):
                run()
        except Unsupported as e:
            plan["unsupported"][name] = str(e)
            log(f"  replay mode ({sd} state): not supported by this build ({e})")
            continue
        a = {"out": rel_err(out, ref_out), "ssm": 0.0}
        a["ok"] = bool(a["out"] <= (STATE_TOL if sd != "f32" else 0.0))
        agreement[name] = a
        impls[name] = (run, reps, first)
        rec[f"bytes_{name}"] = traffic_bytes(case, sd, replay=True)
        rec[f"bytes_read_written_{name}"] = traffic_split(case, sd, replay=True)
        try:
            sp = StatePass(queue, case.batch * case.HV, head_state_bytes(case, sd), 1)
            impls[pname] = (sp.step, reps, first_call_s(sp.step))
        except Exception as e:  # noqa: BLE001 (the rows stand without it)
            log(f"  replay state pass ({sd}): not measured ({type(e).__name__}: {e})")


def replay_set_bytes(case, state_dtype):
    """Bytes of the caches a replay-mode step touches: one ssm slot, one conv line and a ring per sequence."""
    act = 2 if case.act == "bf16" else 4
    return case.batch * (slot_state_bytes(case, state_dtype) + case.state_len * case.C * act
                         + (case.num_spec + 1) * ring_entry_bytes(case))


def reference_error(case, out, ssm):
    """Our first step's outputs [rows, HV, V] and ssm states [slots, HV, V, K] against the float64
    reference (pygdn.reference.gdn_attention) on v-head 0 and its k-head: max |diff| / max |ref| of
    each. A row without a peer (the KDA twins) is checked this way; one head keeps it cheap."""
    H, K, V, gk = case.H, case.K, case.V, case.gate_k
    ch = np.r_[0:K, H * K:H * K + K, 2 * H * K:2 * H * K + V]               # q0 | k0 | v0
    x = case.x if case.x.dtype != np.uint16 else pygdn.from_bf16_bits(case.x)
    o, _, want_ssm = ref.gdn_attention(x[:, ch], case.a[:, :gk], case.b[:, :1], case.conv_w[ch], None,
                                       case.A_log[:1], case.dt_bias[:gk], np.swapaxes(case.conv0, 1, 2)[:, ch],
                                       np.swapaxes(case.ssm0[:, :1], 2, 3), case.meta, 1, 1, K, V,
                                       spec_layout="rolled")
    return {"out": rel_err(out[:, :1], o), "ssm": rel_err(np.swapaxes(ssm[:, :1], 2, 3), want_ssm)}


def add_twin(queue, twin, impls, reps, tol):
    """The KDA twin of a row (make_case(..., gate_mode="channel")): our step on it, rotating over
    copies of its caches as the row's own step does (decode / spec), into impls[KDA_TWIN], to be
    timed in the row's rounds, its first step checked against the float64 reference (it has no
    peer; tol: the row's agreement tolerance). Returns its record fields (bytes, FLOPs, the check),
    or an error."""
    try:
        if twin.kind == "prefill":
            first = Ours(queue, twin)
            run = first.step
        else:
            rot = Rotating(lambda: Ours(queue, twin), cache_set_bytes(twin))
            first, run = rot.first, rot.call("step")
        impls[KDA_TWIN] = (run, reps, first_call_s(run))
    except (Unsupported, pygdn.GdnError) as e:
        return {"label": twin.label, "error": f"{type(e).__name__}: {e}"}
    check = reference_error(twin, *first.result())
    check["ok"] = bool(max(check["out"], check["ssm"]) <= tol)
    out = {"label": twin.label, "H": twin.H, "bytes": traffic_bytes(twin), "bytes_read_written": traffic_split(twin),
           "agreement_vs_reference": check}
    if twin.kind == "prefill":
        out["flops"] = chunked_flops(twin)
    return out


def run_case(queue, case, peers, plan, log, missing=(), twin=None):
    """One row: our step, its cache-format variants, bare passes and the peers; with twin (a KDA case at
    the same H*K*V), our step on it too, in the same rounds (record key KDA_TWIN, "vs_gdn": its time / ours)."""
    late = time.perf_counter() > plan["deadline"]
    if late:
        # Past the run's soft deadline (--quick: a loaded machine): no waiting, no retries, and
        # LATE_BUDGET_S of repeats per implementation (a slower one: its first call alone).
        plan["quiet_left_s"] = plan["retry_left_s"] = 0.0
    rec = {"kind": case.kind, "label": case.label, "batch": case.batch, "num_spec": case.num_spec,
           "tokens": case.rows, "lens": list(case.lens), "act": case.act, "bytes": traffic_bytes(case),
           "bytes_read_written": traffic_split(case), "bytes_conv": conv_traffic_bytes(case)}
    if case.kind == "spec":
        rec["num_accepted"] = [int(v) for v in case.meta["num_accepted_tokens"]]
    if case.kind == "prefill":
        rec["flops"] = chunked_flops(case)
    reps_ours, reps_peer, budget = plan["reps_ours"][case.kind], plan["reps_peer"][case.kind], plan["budget_s"]
    if late:
        budget = LATE_BUDGET_S
        rec["past_deadline"] = True
    rec["waited_for_quiet_s"] = wait_quiet(plan)
    tol = 5e-2 if case.act == "bf16" else 2e-3
    agreement = {}

    # The first call of each implementation warms it up (workspace growth, allocator, caches)
    # and is the agreement check: all start from the same caches and inputs.
    # Decode / spec steps rotate over copies of the caches (cold state, see Rotating); a
    # prefill's own traffic is far larger than its state, it runs on one set.
    make = lambda **kw: (lambda: Ours(queue, case, **kw))  # noqa: E731
    rotating = case.kind != "prefill"
    if rotating:
        ours_r = Rotating(make(), cache_set_bytes(case))
        rec["cache_copies"] = len(ours_r)
        ours = ours_r.first
    else:
        ours = Ours(queue, case)
    step = ours_r.call("step") if rotating else ours.step
    first = first_call_s(step)   # copy 0: the agreement check reads its result
    ref_out, ref_ssm = ours.result()
    impls = {"ours": (step, reps_ours, first)}
    kda = add_twin(queue, twin, impls, reps_ours, tol) if twin is not None else None
    if case.kind == "prefill" and "prefill_precision" not in plan["unsupported"]:
        add_prefill_precisions(queue, case, ours.cfg, rec, impls, agreement, ref_out, ref_ssm, plan, log, reps_ours)
    if kda and "error" in kda:
        log(f"  {kda['label']}: not run ({kda['error']})")
    if case.kind != "prefill":
        # The same step with the ssm cache in the "kv" layout [slots, HV, K, V], with a bf16 state
        # cache in both layouts and with 8-bit state caches, vk layout (when this build has them; the
        # bytes counted are then the state dtype's, with the 8-bit states' scales).
        for sd in sorted({v[2] for v in VARIANTS} - {"f32"}):
            rec[f"bytes_{sd}_state"] = traffic_bytes(case, sd)
            rec[f"bytes_read_written_{sd}_state"] = traffic_split(case, sd)
        for name, layout, sd in VARIANTS:
            if name in plan["unsupported"]:
                continue
            try:
                rot = Rotating(make(ssm_layout=layout, state_dtype=sd), cache_set_bytes(case, sd))
                o, run = rot.first, rot.call("step")
                impls[name] = (run, reps_ours, first_call_s(run))
            except Unsupported as e:
                plan["unsupported"][name] = str(e)
                log(f"  {sd} state, {layout} layout: not supported by this build ({e})")
                continue
            if sd != "f32":
                out, ssm = o.result()
                a = {"out": rel_err(out, ref_out), "ssm": rel_err(ssm, ref_ssm)}
                a["ok"] = bool(a["out"] <= STATE_TOLS[sd] and a["ssm"] <= STATE_TOLS[sd])
                agreement[name] = a
        if case.kind == "spec":
            add_replay(queue, case, rec, impls, agreement, ref_out, plan, log, reps_ours)
        for name, sd in STATE_PASSES:
            if name in plan["unsupported"] or (sd != "f32" and not any(v[0] in impls for v in VARIANTS if v[2] == sd)):
                continue
            try:
                sp = StatePass(queue, case.batch * case.HV, head_state_bytes(case, sd),
                               case.num_spec + 1 if case.kind == "spec" else 0)
            except Exception as e:  # noqa: BLE001 (the rows stand without it)
                if isinstance(e, RuntimeError):  # not an OpenCL queue: no row gets one
                    plan["unsupported"][name] = str(e)
                log(f"  state pass ({sd}): not measured ({type(e).__name__}: {e})")
                continue
            impls[name] = (sp.step, reps_ours, first_call_s(sp.step))
        if "state_pass" not in plan["unsupported"]:  # (the same OpenCL stream kernels)
            try:
                if "reference_passes" not in plan:
                    plan["reference_passes"] = reference_passes(queue)
                for name, kind in REFERENCE_PASSES:
                    ref_step = plan["reference_passes"][kind][0]
                    impls[name] = (ref_step, reps_ours, first_call_s(ref_step))
            except Exception as e:  # noqa: BLE001 (the run's reference stands alone)
                log(f"  reference passes beside the row: not measured ({type(e).__name__}: {e})")
    # Breakdown of our step: the conv alone and the delta rule alone (two calls instead of one).
    reps_part = max(1, reps_ours // 2)
    for part in ("conv", "delta"):
        run = ours_r.call(f"{part}_only") if rotating else getattr(ours, f"{part}_only")
        for _ in range(len(ours_r) - 1 if rotating else 0):
            run()  # every copy's first part call makes its conv_out array: not timed
        impls[f"ours_{part}"] = (run, reps_part, first_call_s(run))
    for name, why in missing:
        rec[name] = {"error": why, "not_installed": True}
    for peer_cls in peers:
        name = peer_cls.name
        try:
            p = peer_cls(case)
            pfirst = first_call_s(p.step)
            out, ssm = p.result()
        except Exception as e:  # noqa: BLE001
            rec[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        a = {"out": rel_err(out, ref_out), "ssm": rel_err(ssm, ref_ssm)}
        a["ok"] = bool(a["out"] <= tol and a["ssm"] <= tol)
        agreement[name] = a
        impls[name] = (p.step, reps_peer, pfirst)
        del out, ssm

    t_block = time.perf_counter()
    stats, foreign = timed_blocks(impls, budget, together=TOGETHER)
    t_block = time.perf_counter() - t_block
    if foreign > RETRY_SHARE and plan["retry_left_s"] >= t_block + 1.0:
        # Other processes took a large share of the 2 cores: wait a little, measure again, keep
        # the quieter of the two measurements.
        t = time.perf_counter()
        time.sleep(1.0)
        stats2, foreign2 = timed_blocks(impls, budget, together=TOGETHER)
        plan["retry_left_s"] -= time.perf_counter() - t
        rec["retried"] = {"foreign_first": foreign, "foreign_second": foreign2}
        if foreign2 < foreign:
            stats, foreign = stats2, foreign2
    rec["foreign_cpu"] = foreign
    for name, st in stats.items():
        rec[name] = st
    for name, a in agreement.items():
        if not name.startswith("ours"):
            rec[name]["ratio"] = rec[name]["median_s"] / rec["ours"]["median_s"]
        rec[name]["agreement_vs_ours"] = a
    t_ours = rec["ours"]["median_s"]
    rec["ours"]["GBps"] = rec["bytes"] / t_ours / 1e9
    rec["ours"]["bytes_read_written"] = rec["bytes_read_written"]
    # Each variant's traffic counted in its state dtype's bytes; a state pass's rate is the traffic
    # model's had the step taken as long as the bare pass.
    of_dtype = lambda sd: "" if sd == "f32" else f"_{sd}_state"  # noqa: E731
    for name, _, sd in VARIANTS:
        if name in rec:
            rec[name]["GBps"] = rec["bytes" + of_dtype(sd)] / rec[name]["median_s"] / 1e9
            rec[name]["bytes_read_written"] = rec["bytes_read_written" + of_dtype(sd)]
            rec[name]["vs_ours"] = rec[name]["median_s"] / t_ours
    for name in STATE8_VARIANTS:  # the 8-bit states' time against the bf16 state's, same rounds
        if "median_s" in rec.get(name, {}) and "median_s" in rec.get("ours_bf16_state", {}):
            rec[name]["vs_bf16"] = rec[name]["median_s"] / rec["ours_bf16_state"]["median_s"]
    for name, sd in STATE_PASSES:
        if name in rec:
            rec[name]["GBps"] = rec["bytes" + of_dtype(sd)] / rec[name]["median_s"] / 1e9
    for (name, sd), (pname, _) in zip(REPLAY_VARIANTS, REPLAY_PASSES):
        if name in rec:
            rec[name]["GBps"] = rec[f"bytes_{name}"] / rec[name]["median_s"] / 1e9
            rec[name]["bytes_read_written"] = rec[f"bytes_read_written_{name}"]
            rec[name]["speedup"] = rec[("ours" if sd == "f32" else "ours_bf16_state")]["median_s"] / rec[name]["median_s"] \
                if "median_s" in rec.get("ours" if sd == "f32" else "ours_bf16_state", {}) else None
        if pname in rec:  # the replay's bytes had the step taken as long as its bare pass
            rec[pname]["GBps"] = rec[f"bytes_{name}"] / rec[pname]["median_s"] / 1e9
    for name, kind in REFERENCE_PASSES:  # the best of the repeats, as the run's are the best of 5
        if name in rec:
            rec[name]["GBps"] = plan["reference_passes"][kind][1] / rec[name]["min_s"] / 1e9
    if "flops" in rec:
        rec["ours"]["GFLOPs"] = rec["flops"] / t_ours / 1e9
    if "median_s" in rec.get("ours_conv", {}):
        rec["ours_conv"]["GBps"] = rec["bytes_conv"] / rec["ours_conv"]["median_s"] / 1e9
    for name, _ in PREFILL_VARIANTS:
        if "median_s" in rec.get(name, {}):
            rec[name].update(GFLOPs=rec["flops"] / rec[name]["median_s"] / 1e9, vs_ours=rec[name]["median_s"] / t_ours)
    if kda:  # the twin's rates in its own bytes and FLOPs, and its time against ours
        rec[KDA_TWIN] = dict(rec.get(KDA_TWIN, {}), **kda)
        t = rec[KDA_TWIN].get("median_s")
        if t:
            rec[KDA_TWIN].update(GBps=kda["bytes"] / t / 1e9, vs_gdn=t / t_ours)
            if "flops" in kda:
                rec[KDA_TWIN]["GFLOPs"] = kda["flops"] / t / 1e9
    log.detail(row_line(rec, plan))
    log.brief(progress_line(rec, plan))
    return rec
