"""Every validation rule of gdn_attention (src/validate/, src/ops.cpp) and of the Python layer
(pygdn/config.py, batch.py, _marshal.py, _usm.py): an otherwise valid call with exactly one thing
broken must fail with the documented status, a message naming the field and the offending value, and NOTHING
written (conv_state, ssm_state and core_attn_out -- pre-filled with a canary -- bit-identical).
Also what must be ACCEPTED: graph padding (long arrays, PAD_SLOT_ID rows, zero-length sequences),
validate="counts", a newer caller's struct with a zero tail, a caller workspace of the right size.

Rules the Python layer would reject first are reached through pygdn.lib.gdn_attention with
hand-filled structs (raw()).
"""
import dataclasses
import gc
import weakref

import numpy as np
import pytest

import dpctl
import pygdn
from pygdn import ffi, lib
from pygdn import reference as ref
from pygdn._usm import NUMPY_DTYPES
from pygdn.batch import BATCH_ARRAYS, BATCH_COUNTS
from helpers import (EditedSUAI, assert_close, conv_from_canonical, conv_to_canonical, ssm_from_canonical,
                     ssm_to_canonical, usm)

H, HV, K, V, W = 1, 2, 4, 4, 4
C = 2 * H * K + HV * V  # 16
NUM_SLOTS, NUM_SPEC = 16, 2
CANARY = 7.0
I32_MAX = 2**31 - 1

# gdn_batch_t version 2 (state caches): NULL in the base batch
STATE_KEYS = ("non_spec_read_state_indices", "spec_read_state_indices", "non_spec_start_pos", "checkpoint_state_indices")
INT_KEYS = tuple(k for k, a in BATCH_ARRAYS.items() if a.dtype == "i32" and k not in STATE_KEYS)  # the base batch's
COUNT_KEYS = BATCH_COUNTS + ("pad_slot_id",)


def base_meta():
    """A prefill (3 tokens, slot 1) and a decode (slot 2); two spec sequences (3 tokens, A=2, slots 3 4 5;
    2 tokens, A=1, slots 6 7 8); the 9 rows interleaved."""
    return dict(num_prefills=1, num_decodes=1, num_spec_decodes=2, num_spec=NUM_SPEC, num_actual_tokens=9,
                non_spec_token_count=4, spec_token_count=5, pad_slot_id=-1, validate="full",
                non_spec_query_start_loc=[0, 3, 4], non_spec_state_indices=[1, 2], has_initial_state=[1, 1],
                non_spec_token_indx=[0, 2, 5, 7], spec_query_start_loc=[0, 3, 5],
                spec_state_indices=[[3, 4, 5], [6, 7, 8]], num_accepted_tokens=[2, 1], spec_token_indx=[1, 3, 4, 6, 8],
                checkpoint_interval=0, checkpoint_cols=0, **{k: None for k in STATE_KEYS})


def drop_empty_spec_sequences(meta):
    """The reference takes spec sequences of 1..1+num_spec tokens; a zero-length one is padding (no-op)."""
    if not meta["num_spec_decodes"]:
        return meta
    qsl = np.asarray(meta["spec_query_start_loc"])
    keep = [n for n in range(meta["num_spec_decodes"]) if qsl[n + 1] > qsl[n]]
    lens = [int(qsl[n + 1] - qsl[n]) for n in keep]
    return dict(meta, num_spec_decodes=len(keep), spec_query_start_loc=np.cumsum([0] + lens),
                spec_state_indices=np.asarray(meta["spec_state_indices"]).reshape(-1, meta["num_spec"] + 1)[keep],
                num_accepted_tokens=np.asarray(meta["num_accepted_tokens"])[keep])


class Setup:
    """Config, device tensors (one spare row past num_actual_tokens) and the batch of one call."""

    def __init__(self, queue, spec_layout="rolled", conv_state_len=W - 1 + NUM_SPEC, rows=9, z=True, **meta):
        self.q = queue
        self.meta = base_meta()
        self.meta.update(meta)
        self.cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=NUM_SLOTS,
                                conv_width=W, act_dtype="f32", ssm_layout="vk", conv_layout="time_major",
                                conv_spec_layout=spec_layout, conv_state_len=conv_state_len)
        rng = np.random.default_rng(7)
        f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
        R = rows + 1
        self.host = dict(mixed_qkv=f(R, C), a=f(R, HV), b=f(R, HV), conv_weight=f(C, W) * 0.5, conv_bias=f(C) * 0.1,
                         A_log=np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32),
                         dt_bias=rng.uniform(-1, 1, HV).astype(np.float32), z=f(R, HV, V) if z else None,
                         norm_weight=rng.uniform(0.5, 1.5, V).astype(np.float32) if z else None,
                         conv_state=f(NUM_SLOTS, C, conv_state_len), ssm_state=f(NUM_SLOTS, HV, K, V) * 0.5)
        self.t = {k: None if v is None else usm(queue, v) for k, v in self.host.items()
                  if k not in ("conv_state", "ssm_state")}
        self.t["conv_state"] = usm(queue, conv_from_canonical(self.host["conv_state"], "time_major"))
        self.t["ssm_state"] = usm(queue, ssm_from_canonical(self.host["ssm_state"], "vk"))
        self.t["core_attn_out"] = usm(queue, np.full((R, HV, V), CANARY, np.float32))

    def batch(self, **over):
        m = dict(self.meta)
        m.update(over)
        arrays = {}
        for k, a in BATCH_ARRAYS.items():
            v = m[k]
            if v is not None and not hasattr(v, "__sycl_usm_array_interface__"):
                v = usm(self.q, np.asarray(v, NUMPY_DTYPES[a.dtype]).reshape(-1))
            arrays[k] = v
        return pygdn.Batch(validate=m["validate"], **{k: m[k] for k in COUNT_KEYS}, **arrays)

    def attention(self, batch=None, **tensors):
        args = dict(self.t)
        args.update(tensors)
        pygdn.attention(self.q, self.cfg, batch if batch is not None else self.batch(), **args)

    def state(self):
        return {k: self.t[k].to_numpy() for k in ("conv_state", "ssm_state", "core_attn_out")}

    def raw(self, batch=None, cfg=None, tensors=None, queue=None, mutate_cfg=None, mutate_batch=None,
            mutate_tensors=None):
        """pygdn.lib.gdn_attention on hand-filled structs; mutate_* edit a struct in place or return a
        replacement pointer. Raises GdnError like the Python layer."""
        keep = []
        c_cfg = (cfg or self.cfg)._to_c()
        c_batch = (batch if batch is not None else self.batch())._to_c(self.q, keep)
        c_t = ffi.new("gdn_tensors_t *")
        lib.gdn_tensors_init(c_t)
        args = dict(self.t)
        args.update(tensors or {})
        for k, v in args.items():
            if v is not None:
                setattr(c_t, k, ffi.cast("void *", v.__sycl_usm_array_interface__["data"][0]))
        # (a returned pointer may be ffi.NULL, which is falsy: compare with None)
        c_cfg, c_batch, c_t = (c if m is None or (r := m(c)) is None else r
                               for c, m in ((c_cfg, mutate_cfg), (c_batch, mutate_batch), (c_t, mutate_tensors)))
        q = ffi.cast("void *", self.q.addressof_ref()) if queue is None else queue
        status = lib.gdn_attention(q, c_cfg, c_batch, c_t)
        message = ffi.string(lib.gdn_last_error()).decode()
        self.q.wait()
        if status != lib.GDN_SUCCESS:
            raise pygdn.GdnError(status, message)

    def reference(self, meta=None):
        """(out [rows, HV, V], conv_state, ssm_state) of the float64 reference (canonical layouts)."""
        m = drop_empty_spec_sequences(meta or self.meta)
        T = m["num_actual_tokens"]
        h = self.host
        o, cs, ss = ref.gdn_attention(h["mixed_qkv"][:T], h["a"][:T], h["b"][:T], h["conv_weight"], h["conv_bias"],
                                      h["A_log"], h["dt_bias"], h["conv_state"], h["ssm_state"], m, H, HV, K, V,
                                      spec_layout=self.cfg.conv_spec_layout,
                                      z=None if h["z"] is None else h["z"][:T], norm_weight=h["norm_weight"])
        return o, cs, ss

    def check_reference(self, meta=None, written=None):
        """The call matched the reference; rows past num_actual_tokens kept the canary; ssm slots
        outside `written` are bit-identical."""
        m = meta or self.meta
        T = m["num_actual_tokens"]
        o, cs, ss = self.reference(m)
        got = self.state()
        assert_close(got["core_attn_out"][:T], o, 2e-4, "core_attn_out")
        assert np.all(got["core_attn_out"][T:] == CANARY), "row past num_actual_tokens written"
        assert np.array_equal(conv_to_canonical(got["conv_state"], "time_major"), cs), "conv_state"
        gs = ssm_to_canonical(got["ssm_state"], "vk")
        assert_close(gs, ss, 2e-4, "ssm_state")
        if written is not None:
            for s in set(range(NUM_SLOTS)) - set(written):
                assert np.array_equal(gs[s], self.host["ssm_state"][s]), f"ssm slot {s} not addressed but changed"
        return got


@pytest.fixture
def s(queue):
    return Setup(queue)


def fails(s, status, needles, call, exc=pygdn.GdnError):
    """call() raises exc (GdnError with `status`), its message contains every needle, nothing changed."""
    before = s.state()
    with pytest.raises(exc) as info:
        call()
    s.q.wait()
    err = info.value
    if exc is pygdn.GdnError:
        assert err.status_name == status, f"got {err.status_name}: {err}"
    for needle in needles:
        assert needle in str(err), f"{needle!r} not in the message: {err}"
    after = s.state()
    for k in before:
        assert np.array_equal(before[k], after[k]), f"{k} changed by a failed call ({err})"
    return err


def test_base_call_is_valid(s):
    s.attention()
    s.check_reference(written=range(1, 9))


# ----------------------------------------------------------------------------- NULL arrays
@pytest.mark.parametrize("field,why", [
    ("non_spec_query_start_loc", "num_prefills + num_decodes > 0"),
    ("non_spec_state_indices", "num_prefills + num_decodes > 0"),
    ("spec_query_start_loc", "num_spec_decodes > 0"),
    ("spec_state_indices", "num_spec_decodes > 0"),
    ("num_accepted_tokens", "num_spec_decodes > 0"),
])
def test_null_batch_array(s, field, why):
    fails(s, "GDN_ERROR_NULL_POINTER", [f"batch->{field} is NULL", why], lambda: s.attention(s.batch(**{field: None})))


@pytest.mark.parametrize("field", ["mixed_qkv", "conv_weight", "conv_state", "a", "b", "A_log", "dt_bias",
                                   "ssm_state", "core_attn_out", "norm_weight"])
def test_null_tensor(s, field):
    fails(s, "GDN_ERROR_NULL_POINTER", [f"tensors->{field} is NULL"], lambda: s.attention(**{field: None}))


def test_conv_out_null_for_causal_conv1d(s):
    fails(s, "GDN_ERROR_NULL_POINTER", ["tensors->conv_out is NULL but gdn_causal_conv1d writes it"],
          lambda: pygdn.causal_conv1d(s.q, s.cfg, s.batch(), mixed_qkv=s.t["mixed_qkv"], conv_weight=s.t["conv_weight"],
                                      conv_state=s.t["conv_state"], conv_out=None))


def test_conv_out_null_for_gated_delta_rule(s):
    fails(s, "GDN_ERROR_NULL_POINTER", ["tensors->conv_out is NULL but gdn_gated_delta_rule reads q|k|v from it"],
          lambda: pygdn.gated_delta_rule(s.q, s.cfg, s.batch(), conv_out=None, ssm_state=s.t["ssm_state"],
                                         core_attn_out=s.t["core_attn_out"], a=s.t["a"], b=s.t["b"],
                                         A_log=s.t["A_log"], dt_bias=s.t["dt_bias"]))


def test_workspace_size_null_output(s):
    status = lib.gdn_attention_workspace_size(s.cfg._to_c(), pygdn.batch.counts_only(s.batch()), ffi.NULL)
    assert pygdn._lib.status_name(status) == "GDN_ERROR_NULL_POINTER"
    assert "bytes is NULL" in ffi.string(lib.gdn_last_error()).decode()


def test_g_without_beta(s):
    g = usm(s.q, np.zeros((10, HV), np.float32))
    fails(s, "GDN_ERROR_NULL_POINTER", ["tensors->g", "tensors->beta", "together"], lambda: s.raw(tensors=dict(g=g)))


def test_nulls_allowed_without_tokens(queue):
    """num_actual_tokens = 0: no array is needed, nothing is written."""
    s = Setup(queue)
    before = s.state()
    batch = pygdn.Batch(num_actual_tokens=0, num_prefills=2, num_spec_decodes=1, num_spec=NUM_SPEC)
    pygdn.attention(queue, s.cfg, batch, mixed_qkv=None, a=None, b=None, conv_weight=None, A_log=None, dt_bias=None,
                    conv_state=s.t["conv_state"], ssm_state=s.t["ssm_state"], core_attn_out=s.t["core_attn_out"])
    after = s.state()
    for k in before:
        assert np.array_equal(before[k], after[k]), k


# ----------------------------------------------------------------------------- counts
@pytest.mark.parametrize("field", ["num_prefills", "num_decodes", "num_spec_decodes", "num_spec", "num_actual_tokens",
                                   "non_spec_token_count", "spec_token_count"])
def test_negative_count(s, field):
    fails(s, "GDN_ERROR_BAD_COUNT", [f"batch->{field} = -1 is outside [0, "],
          lambda: s.attention(s.batch(**{field: -1})))


def test_num_spec_above_64(s):
    def mutate(b):
        b.num_spec = 65
    fails(s, "GDN_ERROR_BAD_COUNT", ["batch->num_spec = 65 is outside [0, 64]"], lambda: s.raw(mutate_batch=mutate))


def test_unknown_validate_mode(s):
    def mutate(b):
        b.validate = 2
    fails(s, "GDN_ERROR_BAD_COUNT", ["batch->validate = 2 is outside [0, 1]"], lambda: s.raw(mutate_batch=mutate))


def test_token_counts_do_not_add_up(s):
    fails(s, "GDN_ERROR_BAD_COUNT", ["non_spec_token_count (4) + spec_token_count (5) != num_actual_tokens (10)"],
          lambda: s.attention(s.batch(num_actual_tokens=10)))


def test_non_spec_sequence_count_overflows(s):
    def mutate(b):
        b.num_prefills, b.num_decodes = I32_MAX, 1
    fails(s, "GDN_ERROR_BAD_COUNT", ["num_prefills + num_decodes overflows int32"], lambda: s.raw(mutate_batch=mutate))


def test_non_spec_tokens_without_sequences(s):
    fails(s, "GDN_ERROR_BAD_COUNT", ["non_spec_token_count = 4 but there are no non-spec sequences"],
          lambda: s.attention(s.batch(num_prefills=0, num_decodes=0)))


def test_spec_tokens_without_sequences(s):
    fails(s, "GDN_ERROR_BAD_COUNT", ["spec_token_count = 5 but num_spec_decodes = 0"],
          lambda: s.attention(s.batch(num_spec_decodes=0)))


def test_spec_tokens_exceed_capacity(s):
    fails(s, "GDN_ERROR_BAD_COUNT", ["spec_token_count = 5 > num_spec_decodes * (1 + num_spec) = 4"],
          lambda: s.attention(s.batch(num_spec=1)))


# ----------------------------------------------------------------------------- config
CONFIG_RULES = [  # field, value, status, message
    ("num_k_heads", 0, "GDN_ERROR_BAD_SHAPE", "cfg->num_k_heads = 0 is outside [1, 1024]"),
    ("num_k_heads", 1025, "GDN_ERROR_BAD_SHAPE", "cfg->num_k_heads = 1025 is outside [1, 1024]"),
    ("num_v_heads", 0, "GDN_ERROR_BAD_SHAPE", "cfg->num_v_heads = 0 is outside [1, 4096]"),
    ("num_v_heads", 4097, "GDN_ERROR_BAD_SHAPE", "cfg->num_v_heads = 4097 is outside [1, 4096]"),
    ("num_v_heads", 3, "GDN_ERROR_BAD_SHAPE", "cfg->num_v_heads = 3 is not a multiple of num_k_heads = 2"),
    ("head_k_dim", 0, "GDN_ERROR_BAD_SHAPE", "cfg->head_k_dim = 0 is outside [1, 256]"),
    ("head_k_dim", 257, "GDN_ERROR_BAD_SHAPE", "cfg->head_k_dim = 257 is outside [1, 256]"),
    ("head_v_dim", 0, "GDN_ERROR_BAD_SHAPE", "cfg->head_v_dim = 0 is outside [1, 256]"),
    ("head_v_dim", 257, "GDN_ERROR_BAD_SHAPE", "cfg->head_v_dim = 257 is outside [1, 256]"),
    ("conv_width", 1, "GDN_ERROR_BAD_SHAPE", "cfg->conv_width = 1 is outside [2, 8]"),
    ("conv_width", 9, "GDN_ERROR_BAD_SHAPE", "cfg->conv_width = 9 is outside [2, 8]"),
    ("act_dtype", 0, "GDN_ERROR_BAD_DTYPE", "cfg->act_dtype = 0 is not a gdn_dtype_t"),
    ("act_dtype", 6, "GDN_ERROR_BAD_DTYPE", "cfg->act_dtype = 6 is not a gdn_dtype_t"),
    ("act_dtype", 4, "GDN_ERROR_BAD_DTYPE", "cfg->act_dtype = 4: GDN_DTYPE_I8 / GDN_DTYPE_F8E4M3 are state dtypes only"),
    ("state_rounding", 2, "GDN_ERROR_BAD_DTYPE", "cfg->state_rounding = 2 is outside [0, 1]"),
    ("state_rounding", 1, "GDN_ERROR_UNSUPPORTED", "cfg->state_rounding = GDN_ROUND_STOCHASTIC with state_dtype = 1"),
    ("reserved2", 1, "GDN_ERROR_UNSUPPORTED", "cfg->reserved2 = 1 must be 0"),
    ("ssm_scale_slot_stride", -1, "GDN_ERROR_BAD_LAYOUT", "cfg->ssm_scale_slot_stride"),
    ("state_dtype", 0, "GDN_ERROR_BAD_DTYPE", "cfg->state_dtype = 0 is not a gdn_dtype_t"),
    ("state_dtype", 9, "GDN_ERROR_BAD_DTYPE", "cfg->state_dtype = 9 is not a gdn_dtype_t"),
    ("ssm_layout", 2, "GDN_ERROR_BAD_LAYOUT", "cfg->ssm_layout = 2 is outside [0, 1]"),
    ("ssm_layout", -1, "GDN_ERROR_BAD_LAYOUT", "cfg->ssm_layout = -1 is outside [0, 1]"),
    ("conv_layout", 2, "GDN_ERROR_BAD_LAYOUT", "cfg->conv_layout = 2 is outside [0, 1]"),
    ("conv_spec_layout", 7, "GDN_ERROR_BAD_LAYOUT", "cfg->conv_spec_layout = 7 is outside [0, 1]"),
    ("num_slots", 0, "GDN_ERROR_BAD_COUNT", "cfg->num_slots = 0 is outside [1, 2147483647]"),
    ("conv_state_len", 2, "GDN_ERROR_BAD_LAYOUT", "cfg->conv_state_len = 2 is outside [3, 1048576]"),
    ("conv_state_len", 2**20 + 1, "GDN_ERROR_BAD_LAYOUT", "cfg->conv_state_len = 1048577 is outside [3, 1048576]"),
    ("conv_slot_stride", 79, "GDN_ERROR_BAD_LAYOUT", "cfg->conv_slot_stride = 79 < row width 80"),
    ("ssm_slot_stride", 31, "GDN_ERROR_BAD_LAYOUT", "cfg->ssm_slot_stride = 31 < row width 32"),
    ("flags", 32, "GDN_ERROR_UNSUPPORTED", "cfg->flags has unknown bits: 32"),
    ("gate_mode", 2, "GDN_ERROR_BAD_LAYOUT", "cfg->gate_mode = 2 is outside [0, 1]"),
    ("gate_mode", 1, "GDN_ERROR_BAD_SHAPE",
     "cfg->num_v_heads = 2 != num_k_heads = 1: GDN_GATE_CHANNEL needs one v-head per k-head"),
    ("out_gate", -1, "GDN_ERROR_BAD_LAYOUT", "cfg->out_gate = -1 is outside [0, 1]"),
]


@pytest.mark.parametrize("field,value,status,message", CONFIG_RULES, ids=[f"{r[0]}={r[1]}" for r in CONFIG_RULES])
def test_config_rule(s, field, value, status, message):
    def mutate(c):
        if field == "num_v_heads" and value == 3:
            c.num_k_heads = 2
        setattr(c, field, value)
    fails(s, status, [message], lambda: s.raw(mutate_cfg=mutate))


@pytest.mark.parametrize("field,value", [("scale", -0.5), ("l2norm_eps", 0.0), ("norm_eps", -1.0)])
def test_config_float_rule_names_field(s, field, value):
    def mutate(c):
        setattr(c, field, value)
    fails(s, "GDN_ERROR_BAD_SHAPE", [f"cfg->{field}"], lambda: s.raw(mutate_cfg=mutate))


@pytest.mark.parametrize("field,value,text", [("scale", -0.5, "-0.5"), ("l2norm_eps", 0.0, "0"),
                                              ("norm_eps", -1.0, "-1"), ("gate_lower_bound", 0.5, "0.5"),
                                              ("gate_lower_bound", float("-inf"), "-inf"),
                                              ("gate_lower_bound", float("nan"), "nan")])
def test_config_float_rule_shows_value(s, field, value, text):
    def mutate(c):
        setattr(c, field, value)
    fails(s, "GDN_ERROR_BAD_SHAPE", [f"cfg->{field} = {text}"], lambda: s.raw(mutate_cfg=mutate))


@pytest.mark.parametrize("field,dense", [("mixed_qkv_stride", C), ("conv_out_stride", C), ("ab_stride", HV), ("b_stride", HV),
                                         ("out_stride", HV * V), ("z_stride", HV * V)])
def test_stride_too_small(s, field, dense):
    def mutate(t):
        setattr(t, field, dense - 1)
    fails(s, "GDN_ERROR_BAD_LAYOUT", [f"tensors->{field} = {dense - 1} < row width {dense}"],
          lambda: s.raw(mutate_tensors=mutate))


def test_rolled_conv_state_too_short(queue):
    s = Setup(queue, spec_layout="rolled", conv_state_len=W - 1)  # needs W-1+num_spec = 5
    fails(s, "GDN_ERROR_BAD_LAYOUT", ["cfg->conv_state_len = 3 < W-1+num_spec = 5", "GDN_CONV_SPEC_ROLLED"],
          s.attention)


def test_snapshot_needs_only_w_minus_1(queue):
    s = Setup(queue, spec_layout="snapshot", conv_state_len=W - 1)
    s.attention()
    s.check_reference(written=range(1, 9))


# ----------------------------------------------------------------------------- start locations
@pytest.mark.parametrize("field,value,message", [
    ("non_spec_query_start_loc", [1, 3, 4], "non_spec_query_start_loc[0] = 1, expected 0"),
    ("spec_query_start_loc", [1, 3, 5], "spec_query_start_loc[0] = 1, expected 0"),
    ("non_spec_query_start_loc", [0, 5, 4], "non_spec_query_start_loc decreases at [2]: 5 -> 4"),
    ("spec_query_start_loc", [0, 6, 5], "spec_query_start_loc decreases at [2]: 6 -> 5"),
    ("non_spec_query_start_loc", [0, 3, 3], "non_spec_query_start_loc[last] = 3 but non_spec_token_count = 4"),
    ("spec_query_start_loc", [0, 3, 4], "spec_query_start_loc[last] = 4 but spec_token_count = 5"),
], ids=["ns_first", "spec_first", "ns_decreasing", "spec_decreasing", "ns_last", "spec_last"])
def test_bad_start_loc(s, field, value, message):
    fails(s, "GDN_ERROR_BAD_START_LOC", [message], lambda: s.attention(s.batch(**{field: value})))


def test_spec_sequence_longer_than_1_plus_num_spec(s):
    fails(s, "GDN_ERROR_BAD_START_LOC", ["spec sequence 0 has 4 tokens > 1 + num_spec = 3"],
          lambda: s.attention(s.batch(spec_query_start_loc=[0, 4, 5])))


# ----------------------------------------------------------------------------- state indices
@pytest.mark.parametrize("field,value,message", [
    ("non_spec_state_indices", [1, 16], "non_spec_state_indices[1] = 16 is outside [0, num_slots=16)"),
    ("non_spec_state_indices", [2**31 - 1, 2], "non_spec_state_indices[0] = 2147483647 is outside [0, num_slots=16)"),
    ("spec_state_indices", [[3, 4, 5], [6, 7, 16]], "spec_state_indices[1][2] = 16 is outside [0, num_slots=16)"),
    ("spec_state_indices", [[17, 4, 5], [6, 7, 8]], "spec_state_indices[0][0] = 17 is outside [0, num_slots=16)"),
], ids=["ns_high", "ns_int32_max", "spec_unused_column", "spec_first_column"])
def test_state_index_out_of_range(s, field, value, message):
    fails(s, "GDN_ERROR_BAD_STATE_INDEX", [message, "not padding (pad_slot_id -1 or negative)"],
          lambda: s.attention(s.batch(**{field: value})))


@pytest.mark.parametrize("field,value,message", [
    ("non_spec_state_indices", [1, 1], "non_spec_state_indices[1] = 1 is also written by non-spec sequence 0"),
    ("spec_state_indices", [[3, 2, 5], [6, 7, 8]],
     "spec_state_indices[0][1] = 2 is also written by non-spec sequence 1"),
    ("spec_state_indices", [[3, 4, 5], [3, 7, 8]], "spec_state_indices[1][0] = 3 is also written by spec sequence 0"),
], ids=["non_spec_vs_non_spec", "spec_vs_non_spec", "spec_vs_spec"])
def test_duplicate_write_slot(s, field, value, message):
    fails(s, "GDN_ERROR_DUPLICATE_SLOT", [message], lambda: s.attention(s.batch(**{field: value})))


@pytest.mark.parametrize("read_slot,writer", [(2, "non-spec sequence 1 (non_spec_state_indices[1])"),
                                              (5, "spec sequence 0 (spec_state_indices[0][2])")])
def test_initial_state_slot_written_by_another_sequence(s, read_slot, writer):
    # Spec sequence 1 has 2 tokens and A=3: it reads column 2, which it does not write.
    fails(s, "GDN_ERROR_DUPLICATE_SLOT",
          [f"spec_state_indices[1][2] = {read_slot} is read as an initial state by spec sequence 1 but written by {writer}"],
          lambda: s.attention(s.batch(num_accepted_tokens=[2, 3], spec_state_indices=[[3, 4, 5], [6, 7, read_slot]])))


@pytest.mark.parametrize("value", [0, 4, -1])
def test_bad_num_accepted(s, value):
    fails(s, "GDN_ERROR_BAD_ACCEPTED", [f"num_accepted_tokens[1] = {value} is outside [1, 1 + num_spec = 3]"],
          lambda: s.attention(s.batch(num_accepted_tokens=[2, value])))


# ----------------------------------------------------------------------------- token rows
@pytest.mark.parametrize("field,value,message", [
    ("spec_token_indx", [1, 3, 9, 6, 8], "spec_token_indx[2] = 9 is outside [0, num_actual_tokens=9)"),
    ("non_spec_token_indx", [-1, 2, 5, 7], "non_spec_token_indx[0] = -1 is outside [0, num_actual_tokens=9)"),
], ids=["spec_high", "non_spec_negative"])
def test_token_index_out_of_range(s, field, value, message):
    fails(s, "GDN_ERROR_BAD_TOKEN_INDEX", [message], lambda: s.attention(s.batch(**{field: value})))


@pytest.mark.parametrize("over,message", [
    (dict(spec_token_indx=[0, 3, 4, 6, 8]), "spec_token_indx[0] = row 0 is already claimed by a non-spec token"),
    (dict(non_spec_token_indx=[0, 0, 5, 7]), "non_spec_token_indx[1] = row 0 is already claimed by a non-spec token"),
    (dict(spec_token_indx=[1, 3, 3, 6, 8]), "spec_token_indx[2] = row 3 is already claimed by a spec token"),
    (dict(non_spec_token_indx=None, spec_token_indx=None),
     "spec_token_indx[0] = row 0 is already claimed by a non-spec token (NULL index = identity)"),
    (dict(non_spec_token_indx=None, spec_token_indx=[4, 5, 6, 7, 3]),
     "spec_token_indx[4] = row 3 is already claimed by a non-spec token"),
], ids=["spec_vs_non_spec", "non_spec_twice", "spec_twice", "both_null", "non_spec_null"])
def test_overlapping_token_rows(s, over, message):
    fails(s, "GDN_ERROR_BAD_TOKEN_INDEX", [message], lambda: s.attention(s.batch(**over)))


def test_null_index_of_one_group_is_identity(s):
    """non_spec_token_indx NULL = rows 0..3; the spec rows 4..8 complete a valid batch."""
    s.attention(s.batch(non_spec_token_indx=None, spec_token_indx=[4, 5, 6, 7, 8]))
    s.check_reference(dict(s.meta, non_spec_token_indx=None, spec_token_indx=[4, 5, 6, 7, 8]), written=range(1, 9))


# ----------------------------------------------------------------------------- structs, pointers, queue
STRUCTS = {"cfg": "gdn_config_t", "batch": "gdn_batch_t", "tensors": "gdn_tensors_t"}


def resized(ctype, size, tail_byte):
    """mutate_* callback: copy the struct into a buffer of `size` bytes, struct_size = size."""
    def mutate(c):
        n = ffi.sizeof(ctype)
        buf = ffi.new("unsigned char[]", max(size, n) + 8)
        ffi.memmove(buf, c, n)
        p = ffi.cast(ctype + " *", buf)
        p.struct_size = size
        if size > n and tail_byte:
            buf[size - 1] = tail_byte
        mutate.keep = buf
        return p
    return mutate


def struct_kw(which, mutate):
    return {{"cfg": "mutate_cfg", "batch": "mutate_batch", "tensors": "mutate_tensors"}[which]: mutate}


# Version 1 of each struct (libgdn_xpu 0.1.0): each ends where its version-2 fields begin.
V1_SIZE = {"cfg": ffi.offsetof("gdn_config_t", "packed_order"),
           "batch": ffi.offsetof("gdn_batch_t", "non_spec_read_state_indices"),
           "tensors": ffi.offsetof("gdn_tensors_t", "qkvz")}


def test_version_1_sizes_are_pinned():
    """The ABI promise: version-1 layouts never change (x86-64 / LP64 sizes of 0.1.0)."""
    if ffi.sizeof("void *") == 8:
        assert V1_SIZE == {"cfg": 88, "batch": 112, "tensors": 184}


@pytest.mark.parametrize("which", list(STRUCTS))
def test_struct_size_older_than_version_1(s, which):
    n = V1_SIZE[which] - 8
    fails(s, "GDN_ERROR_BAD_STRUCT_SIZE",
          [f"{which}->struct_size = {n} is older than the oldest version this library accepts ({n + 8} bytes"],
          lambda: s.raw(**struct_kw(which, resized(STRUCTS[which], n, 0))))


def test_struct_size_between_versions(s):
    n = V1_SIZE["batch"] + 8
    fails(s, "GDN_ERROR_BAD_STRUCT_SIZE", [f"batch->struct_size = {n} is the size of no version of this struct",
                                           str(V1_SIZE["batch"]), str(ffi.sizeof("gdn_batch_t"))],
          lambda: s.raw(mutate_batch=resized("gdn_batch_t", n, 0)))


def version_1(which):
    """mutate_* callback: the caller's struct as a version-1 caller lays it out: struct_size = the
    version-1 size, and whatever happens to follow it in memory (here 0xA5 bytes) is not ours."""
    ctype = STRUCTS[which]

    def mutate(c):
        n = ffi.sizeof(ctype)
        buf = ffi.new("unsigned char[]", n)
        ffi.memmove(buf, b"\xa5" * n, n)
        ffi.memmove(buf, c, V1_SIZE[which])
        p = ffi.cast(ctype + " *", buf)
        p.struct_size = V1_SIZE[which]
        mutate.keep = buf
        return p
    return mutate


@pytest.mark.parametrize("which", list(STRUCTS))
def test_version_1_caller_gets_the_defaults(s, which):
    """A caller built against the 0.1.0 header: its struct ends before the version-2 fields (batch:
    at spec_token_indx; config: at flags; tensors: at workspace_bytes); the bytes after it (garbage
    here) are never read, the version-2 fields take their defaults (no read slots, no checkpoints,
    no packed projections) and the call computes what it always did."""
    s.raw(**struct_kw(which, version_1(which)))
    s.check_reference(written=range(1, 9))


def older_struct(which, size):
    """mutate_*: an older caller's cfg or tensors of `size` bytes, garbage after it."""
    def mutate(c):
        n = ffi.sizeof(STRUCTS[which])
        buf = ffi.new("unsigned char[]", n)
        ffi.memmove(buf, b"\xa5" * n, n)
        ffi.memmove(buf, c, size)
        p = ffi.cast(STRUCTS[which] + " *", buf)
        p.struct_size = size
        mutate.keep = buf
        return p
    return mutate


# Version 2 of gdn_config_t and gdn_tensors_t: each ends where its version-3 fields (gate modes) begin.
V2_SIZE = {"cfg": ffi.offsetof("gdn_config_t", "gate_mode"), "tensors": ffi.offsetof("gdn_tensors_t", "b_stride")}
# Version 4: each ends where its version-5 fields (8-bit states) begin.
V4_SIZE = {"cfg": ffi.offsetof("gdn_config_t", "ssm_scale_slot_stride"), "tensors": ffi.offsetof("gdn_tensors_t", "ssm_scale")}


@pytest.mark.parametrize("sizes", [V1_SIZE, V2_SIZE, V4_SIZE], ids=["version_1", "version_2", "version_4"])
def test_older_cfg_and_tensors_get_the_defaults(s, sizes):
    """Callers of the 0.1.0 header's gdn_config_t and gdn_tensors_t get the per-token mode
    (replay_tokens 0, no rings) and, like version-2 callers, the per-head gates (GDN_GATE_HEAD, silu
    output gate, no lower bound, b at ab_stride); version-4 callers no ssm_scale and round-to-nearest
    stores; whatever follows their structs in memory."""
    s.raw(mutate_cfg=older_struct("cfg", sizes["cfg"]), mutate_tensors=older_struct("tensors", sizes["tensors"]))
    s.check_reference(written=range(1, 9))


@pytest.mark.parametrize("which", list(STRUCTS))
def test_struct_size_newer_caller_with_fields_set(s, which):
    n = ffi.sizeof(STRUCTS[which])
    fails(s, "GDN_ERROR_UNSUPPORTED", [f"{which}->struct_size = {n + 16}", "fields newer than this library"],
          lambda: s.raw(**struct_kw(which, resized(STRUCTS[which], n + 16, 1))))


@pytest.mark.parametrize("which", list(STRUCTS))
def test_struct_size_newer_caller_zero_tail_is_accepted(s, which):
    n = ffi.sizeof(STRUCTS[which])
    s.raw(**struct_kw(which, resized(STRUCTS[which], n + 16, 0)))
    s.check_reference(written=range(1, 9))


@pytest.mark.parametrize("which", list(STRUCTS))
def test_null_struct(s, which):
    fails(s, "GDN_ERROR_NULL_POINTER", [f"{which} is NULL"], lambda: s.raw(**struct_kw(which, lambda c: ffi.NULL)))


@pytest.mark.parametrize("where,field", [("tensors", "a"), ("tensors", "ssm_state"), ("batch", "num_accepted_tokens"),
                                         ("batch", "non_spec_token_indx"), ("batch", "spec_read_state_indices"),
                                         ("batch", "non_spec_start_pos")])
def test_host_pointer_is_not_usm(s, where, field):
    """Without GDN_FLAG_HOST_MEMORY a pointer the context does not know is refused on every device
    (it may be freed USM); with the flag, where the device addresses host memory, it is taken as host
    memory (test_host_memory.py)."""
    host = ffi.new("int32_t[]", 64)  # plain host memory, not a USM allocation

    def mutate(c):
        setattr(c, field, ffi.cast("void *", host))
    fails(s, "GDN_ERROR_BAD_POINTER", [f"{where}->{field} is not a USM allocation"],
          lambda: s.raw(**struct_kw(where, mutate)))


@pytest.mark.parametrize("where,field,size,delta", [
    ("batch", "non_spec_query_start_loc", 4, 1), ("batch", "spec_state_indices", 4, 2),
    ("batch", "num_accepted_tokens", 4, 3), ("tensors", "mixed_qkv", 4, 1), ("tensors", "A_log", 4, 2),
    ("tensors", "conv_state", 4, 1), ("tensors", "ssm_state", 4, 1), ("tensors", "core_attn_out", 4, 2),
    ("tensors", "z", 4, 1)])
def test_pointer_not_aligned_to_its_element(s, where, field, size, delta):
    """A USM pointer `delta` bytes past an element boundary is refused, naming the field."""
    def mutate(c):
        setattr(c, field, ffi.cast("void *", ffi.cast("char *", getattr(c, field)) + delta))
    fails(s, "GDN_ERROR_BAD_POINTER", [f"{where}->{field} = 0x", f"is not aligned to its element size ({size} bytes",
                                       f"{delta} byte(s) past a boundary"],
          lambda: s.raw(**struct_kw(where, mutate)))


def test_pointer_not_aligned_bf16(s):
    """bf16 activations need 2-byte alignment (the refused call runs nothing, so the f32 buffers of
    the setup serve)."""
    s.cfg.act_dtype = "bf16"

    def mutate(c):
        c.b = ffi.cast("void *", ffi.cast("char *", c.b) + 1)
    fails(s, "GDN_ERROR_BAD_POINTER", ["tensors->b = 0x", "(2 bytes, bf16 act_dtype): 1 byte(s) past a boundary"],
          lambda: s.raw(mutate_tensors=mutate))


def test_null_queue(s):
    fails(s, "GDN_ERROR_BAD_QUEUE", ["queue is NULL"], lambda: s.raw(queue=ffi.NULL))


def test_workspace_too_small(s):
    ws = pygdn.UsmArray((4,), np.float32, s.q)
    fails(s, "GDN_ERROR_OUT_OF_MEMORY", ["tensors->workspace_bytes = 16 <", "needed by this batch"],
          lambda: s.attention(workspace=ws))


def test_workspace_of_workspace_size_is_enough(s):
    batch = s.batch()
    ws = pygdn.UsmArray((pygdn.workspace_size(s.cfg, batch),), np.uint8, s.q, usm_type="device")
    s.attention(batch, workspace=ws)
    s.check_reference(written=range(1, 9))


# ----------------------------------------------------------------------------- Python layer
@pytest.mark.parametrize("field,value", [("act_dtype", "f64"), ("ssm_layout", "kk"), ("conv_layout", "row_major"),
                                         ("conv_spec_layout", "ring")])
def test_python_unknown_config_choice(s, field, value):
    setattr(s.cfg, field, value)
    fails(s, None, [f"{field}={value!r}", "expected one of"], s.attention, exc=ValueError)


def test_python_unknown_validate_mode(s):
    fails(s, None, ["validate='all'"], lambda: s.attention(s.batch(validate="all")), exc=ValueError)


def test_python_batch_array_wrong_dtype(s):
    bad = usm(s.q, np.array([0, 3, 4], np.float32))
    fails(s, None, ["batch.non_spec_query_start_loc: dtype f32, expected i32"],
          lambda: s.attention(s.batch(non_spec_query_start_loc=bad)), exc=TypeError)


def test_python_batch_array_too_short(s):
    fails(s, None, ["batch.spec_state_indices: 5 elements, the counts need 6"],
          lambda: s.attention(s.batch(spec_state_indices=[3, 4, 5, 6, 7])), exc=ValueError)


@pytest.mark.parametrize("counts,want", [
    # 3 prefills + 1 decode (10 tokens), 2 spec sequences of 1 + 2 columns (5 tokens), checkpoints
    # (the two groups' sizes differ, so an array read by the other group's count would show)
    (dict(num_actual_tokens=15, num_prefills=3, num_decodes=1, non_spec_token_count=10, num_spec_decodes=2,
          num_spec=2, spec_token_count=5, checkpoint_interval=64, checkpoint_cols=3),
     dict(non_spec_query_start_loc=5, non_spec_state_indices=4, has_initial_state=4, non_spec_token_indx=10,
          spec_query_start_loc=3, spec_state_indices=6, num_accepted_tokens=2, spec_token_indx=5,
          non_spec_read_state_indices=4, spec_read_state_indices=2, non_spec_start_pos=4, checkpoint_state_indices=12)),
    # decodes only, no checkpoints: the spec group's arrays and checkpoint_state_indices read nothing
    (dict(num_actual_tokens=5, num_decodes=5, non_spec_token_count=5, checkpoint_cols=4),
     dict(non_spec_query_start_loc=6, non_spec_state_indices=5, has_initial_state=5, non_spec_token_indx=5,
          non_spec_read_state_indices=5, non_spec_start_pos=5)),
    # spec sequences only: the non-spec group's arrays read nothing (its start locations neither)
    (dict(num_actual_tokens=4, num_spec_decodes=2, num_spec=1, spec_token_count=4),
     dict(spec_query_start_loc=3, spec_state_indices=4, num_accepted_tokens=2, spec_token_indx=4,
          spec_read_state_indices=2)),
])
def test_batch_array_elements(counts, want):
    """gdn_batch_array_elements: the elements a call reads of each metadata array (the header's
    lengths), which pygdn checks arrays against."""
    assert pygdn.batch.array_elements(counts) == {k: want.get(k, 0) for k in BATCH_ARRAYS}


def test_batch_array_elements_refuses_bad_counts_and_arguments():
    with pytest.raises(pygdn.GdnError, match=r"non_spec_token_count \(3\) \+ spec_token_count \(0\) != "
                                             r"num_actual_tokens \(4\)"):
        pygdn.batch.array_elements(dict(num_actual_tokens=4, num_decodes=3, non_spec_token_count=3))
    c, out = pygdn.batch.counts_only({}), ffi.new("int64_t[2]", [-7, -7])
    assert lib.gdn_batch_array_elements(c, ffi.NULL, 0) == lib.GDN_SUCCESS
    assert lib.gdn_batch_array_elements(c, ffi.NULL, 1) == lib.GDN_ERROR_NULL_POINTER
    assert lib.gdn_batch_array_elements(c, out, -1) == lib.GDN_ERROR_BAD_COUNT
    assert lib.gdn_batch_array_elements(ffi.NULL, out, 2) == lib.GDN_ERROR_NULL_POINTER
    assert list(out) == [-7, -7], "a refused query wrote its output"
    assert lib.gdn_batch_array_elements(c, out, 1) == lib.GDN_SUCCESS and list(out) == [0, -7]


def test_python_batch_array_for_a_group_without_sequences(s):
    """An array given for a group without sequences is read for nothing: an empty one passes
    pygdn's checks (the library's lengths, gdn_batch_array_elements), a short one of a group with
    sequences does not."""
    empty = pygdn.UsmArray((0,), np.int32, s.q)
    decodes = pygdn.Batch(num_actual_tokens=2, num_decodes=2, non_spec_token_count=2,
                          non_spec_query_start_loc=usm(s.q, np.arange(3, dtype=np.int32)),
                          non_spec_state_indices=usm(s.q, np.arange(2, dtype=np.int32)), spec_query_start_loc=empty)
    decodes._to_c(s.q, [])
    with pytest.raises(ValueError, match=r"batch.non_spec_query_start_loc: 0 elements, the counts need 3"):
        dataclasses.replace(decodes, non_spec_query_start_loc=empty)._to_c(s.q, [])


def test_python_tensor_wrong_dtype(s):
    fails(s, None, ["mixed_qkv: dtype f16, expected f32"],
          lambda: s.attention(mixed_qkv=usm(s.q, s.host["mixed_qkv"].astype(np.float16))), exc=TypeError)


@pytest.mark.parametrize("shape", [(8, C), (10, C + 1)])
def test_python_tensor_wrong_shape(s, shape):
    fails(s, None, [f"mixed_qkv: shape {shape}"],
          lambda: s.attention(mixed_qkv=usm(s.q, np.zeros(shape, np.float32))), exc=ValueError)


def test_python_unsupported_element_type(s):
    fails(s, None, ["a: unsupported element type '<f8'"],
          lambda: s.attention(a=usm(s.q, s.host["a"].astype(np.float64))), exc=TypeError)


def test_python_not_a_usm_array(s):
    # (a NumPy array is host memory, accepted on devices that address it: test_host_memory.py)
    fails(s, None, ["b: expected an object with __sycl_usm_array_interface__", "list"],
          lambda: s.attention(b=s.host["b"].tolist()), exc=TypeError)


class _Described:
    """A USM array through an SUAI object whose described row count can change between calls."""

    def __init__(self, base):
        self.base, self.rows = base, base.shape[0]

    @property
    def __sycl_usm_array_interface__(self):
        d = dict(self.base.__sycl_usm_array_interface__)
        d["shape"] = (self.rows,) + tuple(self.base.shape[1:])
        return d


def test_python_checks_after_cached_calls(s):
    """A plain call keeps its checked structs for the next call with the same pygdn.UsmArray
    objects, queue object and row count (Batch._to_c, pygdn._marshal.arrays_cached): whatever changed
    since is checked again, and the config keeps no array alive."""
    batch = s.batch()

    def cached_then_fails(needles, call, exc):
        s.attention(batch)
        s.attention(batch)  # the kept structs
        fails(s, None, needles, call, exc=exc)

    # another array object in a tensor's place
    cached_then_fails(["mixed_qkv: dtype f16, expected f32"],
                      lambda: s.attention(batch, mixed_qkv=usm(s.q, s.host["mixed_qkv"].astype(np.float16))), TypeError)
    # an array of the batch replaced
    good = batch.spec_state_indices
    cached_then_fails(["batch.spec_state_indices: 5 elements, the counts need 6"],
                      lambda: (setattr(batch, "spec_state_indices", usm(s.q, np.arange(3, 8, dtype=np.int32))),
                               s.attention(batch)), ValueError)
    batch.spec_state_indices = good
    # arrays of other kinds may describe other memory from call to call: never kept
    shrinking = {"spec_state_indices": _Described(good), "a": _Described(s.t["a"])}
    batch.spec_state_indices = shrinking["spec_state_indices"]
    s.attention(batch, a=shrinking["a"])
    s.attention(batch, a=shrinking["a"])
    shrinking["spec_state_indices"].rows = 5
    fails(s, None, ["batch.spec_state_indices: 5 elements, the counts need 6"],
          lambda: s.attention(batch, a=shrinking["a"]), exc=ValueError)
    batch.spec_state_indices = good
    s.attention(batch, a=shrinking["a"])
    shrinking["a"].rows = 8
    fails(s, None, ["a: shape (8, "], lambda: s.attention(batch, a=shrinking["a"]), exc=ValueError)
    # a count changed
    cached_then_fails(["elements, the counts need"],
                      lambda: (setattr(batch, "num_spec_decodes", 4), s.attention(batch)), ValueError)
    batch.num_spec_decodes = s.meta["num_spec_decodes"]
    # another queue object, of another context: the batch's arrays are checked first, then (with
    # a batch of that context) the tensors
    dev = s.q.sycl_device
    other = dpctl.SyclQueue(dpctl.SyclContext([dev]), dev, property="in_order")
    tensors = {k: v for k, v in s.t.items() if v is not None}
    cached_then_fails(["batch.", "lives in another SYCL context than the queue"],
                      lambda: pygdn.attention(other, s.cfg, batch, **tensors), ValueError)
    there = dataclasses.replace(batch, **{f: usm(other, getattr(batch, f).to_numpy()) for f in BATCH_ARRAYS
                                          if getattr(batch, f) is not None})
    cached_then_fails(["mixed_qkv: lives in another SYCL context than the queue"],
                      lambda: pygdn.attention(other, s.cfg, there, **tensors), ValueError)
    # the config changed
    cached_then_fails(["mixed_qkv: dtype f32, expected bf16"], lambda: (setattr(s.cfg, "act_dtype", "bf16"),
                                                                      s.attention(batch)), TypeError)
    s.cfg.act_dtype = "f32"
    # the config holds its last arrays weakly; a UsmArray describes the same memory for its life
    a = usm(s.q, s.host["a"])
    s.attention(batch, a=a)
    s.attention(batch, a=a)
    gone = weakref.ref(a)
    del a
    gc.collect()
    assert gone() is None, "the config kept an array alive"
    with pytest.raises(AttributeError, match="read-only"):
        s.t["b"].shape = (1, HV)


def test_python_cached_calls_compute_what_fresh_calls_do(queue):
    """Three steps through the kept structs (same Config, Batch and arrays) leave what three
    steps with a new Config and Batch object each (every check and struct made again) leave."""
    kept, fresh = Setup(queue), Setup(queue)
    batch = kept.batch()
    for _ in range(3):
        kept.attention(batch)
        fresh.cfg = dataclasses.replace(fresh.cfg)
        fresh.attention(fresh.batch())
    got, want = kept.state(), fresh.state()
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def test_python_non_contiguous(s):
    # every other column of a USM array, through SUAI strides (rows may be strided: test_host_memory.py)
    strided = EditedSUAI(usm(s.q, np.zeros((20, 2 * C), np.float32)),
                         lambda d: d.update(shape=(10, C), strides=(2 * C, 2)))
    fails(s, None, ["mixed_qkv: the dimensions after the first must be C-contiguous"],
          lambda: s.attention(mixed_qkv=strided), exc=ValueError)
    whole = EditedSUAI(usm(s.q, np.zeros((20, C), np.float32)), lambda d: d.update(shape=(C, 20), strides=(1, C)))
    fails(s, None, ["conv_weight: must be C-contiguous"], lambda: s.attention(conv_weight=whole), exc=ValueError)


def test_python_other_context(s):
    dev = s.q.sycl_device
    other = dpctl.SyclQueue(dpctl.SyclContext([dev]), dev, property="in_order")
    assert other.sycl_context != s.q.sycl_context
    a = pygdn.UsmArray.from_numpy(s.host["a"], other)
    fails(s, None, ["a: lives in another SYCL context than the queue"], lambda: s.attention(a=a), exc=ValueError)
    acc = pygdn.UsmArray.from_numpy(np.array([2, 1], np.int32), other)
    fails(s, None, ["batch.num_accepted_tokens: lives in another SYCL context"],
          lambda: s.attention(s.batch(num_accepted_tokens=acc)), exc=ValueError)


def test_python_unknown_array_argument(s):
    fails(s, None, ["unknown array argument 'bogus'"],
          lambda: pygdn.ops._call(lib.gdn_attention, s.q, s.cfg, s.batch(), dict(s.t, bogus=s.t["a"])), exc=TypeError)


# ----------------------------------------------------------------------------- validate="counts"
def test_counts_mode_matches_full_mode(queue):
    full, counts = Setup(queue), Setup(queue)
    full.attention()
    counts.attention(counts.batch(validate="counts"))
    a, b = full.state(), counts.state()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_counts_mode_skips_content_checks(s):
    # Column 2 of spec sequence 1 (2 tokens, A=1) is never read or written: FULL rejects the
    # out-of-range value, COUNTS does not look at it and computes the valid call's result.
    bad = dict(spec_state_indices=[[3, 4, 5], [6, 7, 999]])
    fails(s, "GDN_ERROR_BAD_STATE_INDEX", ["spec_state_indices[1][2] = 999"], lambda: s.attention(s.batch(**bad)))
    s.attention(s.batch(validate="counts", **bad))
    s.check_reference(written=range(1, 9))


@pytest.mark.parametrize("op", ["attention", "force_recurrent", "causal_conv1d", "gated_delta_rule", "generic"])
@pytest.mark.parametrize("field, bad, clamped", [
    ("non_spec_query_start_loc", [0, 5, 4], [0, 4, 4]),   # past the 4 non-spec tokens, then decreasing
    ("non_spec_query_start_loc", [-3, 3, 4], [0, 3, 4]),  # before the first token
    ("spec_query_start_loc", [0, 3, 9], [0, 3, 5]),       # past the 5 spec tokens
])
def test_counts_mode_clamps_start_locations(queue, monkeypatch, op, field, bad, clamped):
    # GDN_VALIDATE_COUNTS reads nothing back: the kernels clamp each start location into [0, the
    # group's token count] (the end not before the start). Every op (the chunk kernels, the token
    # recurrence, the conv's time tiles walk whole sequences) then computes exactly the call with
    # the clamped start locations, and writes nothing outside the token rows. "generic": attention
    # on the generic kernels.
    if op == "generic":
        monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")
    runs = []
    for validate, qsl in (("counts", bad), ("full", clamped)):
        s = Setup(queue)
        batch = s.batch(validate=validate, **{field: qsl})
        conv_out = usm(s.q, np.full((s.host["mixed_qkv"].shape[0], C), CANARY, np.float32))
        t = s.t
        {"attention": lambda: s.attention(batch), "generic": lambda: s.attention(batch),
         "force_recurrent": lambda: pygdn.attention(s.q, dataclasses.replace(s.cfg, force_recurrent=True), batch, **t),
         "causal_conv1d": lambda: pygdn.causal_conv1d(s.q, s.cfg, batch, mixed_qkv=t["mixed_qkv"],
                                                      conv_weight=t["conv_weight"], conv_bias=t["conv_bias"],
                                                      conv_state=t["conv_state"], conv_out=conv_out),
         "gated_delta_rule": lambda: pygdn.gated_delta_rule(s.q, s.cfg, batch, conv_out=usm(s.q, s.host["mixed_qkv"]),
                                                            ssm_state=t["ssm_state"], core_attn_out=t["core_attn_out"],
                                                            a=t["a"], b=t["b"], A_log=t["A_log"], dt_bias=t["dt_bias"]),
         }[op]()
        runs.append(dict(s.state(), conv_out=conv_out.to_numpy()))
    for k in runs[0]:
        assert np.array_equal(runs[0][k], runs[1][k]), k
    assert np.all(runs[0]["core_attn_out"][9] == CANARY) and np.all(runs[0]["conv_out"][9] == CANARY)


def test_counts_mode_still_checks_counts(s):
    fails(s, "GDN_ERROR_BAD_COUNT", ["!= num_actual_tokens (10)"],
          lambda: s.attention(s.batch(validate="counts", num_actual_tokens=10)))


def test_device_memory_of_another_device_of_the_context(queue):
    """A context may span several devices (dpctl's default context: all GPUs of a platform): device
    USM of one of them, given with a queue on another, is refused by name (src/validate/pointers.cpp check_usm).
    Two sub-devices of the test device make such a context here."""
    try:
        subs = queue.sycl_device.create_sub_devices(partition=1)[:2]
    except Exception as e:  # noqa: BLE001 - a device that cannot be partitioned
        pytest.skip(f"the device cannot be partitioned: {e}")
    if len(subs) < 2:
        pytest.skip("fewer than two sub-devices")
    ctx = dpctl.SyclContext(subs)
    q0, q1 = (dpctl.SyclQueue(ctx, d, property="in_order") for d in subs)
    s = Setup(q1)
    other = pygdn.UsmArray.from_numpy(s.host["ssm_state"], q0, usm_type="device")
    fails(s, "GDN_ERROR_BAD_POINTER", ["tensors->ssm_state is device USM of another device than the queue's"],
          lambda: s.attention(ssm_state=other))


# ----------------------------------------------------------------------------- metadata in any kind of USM
def _batch_in(s, usm_type, **over):
    """s.batch(**over) with every metadata array in `usm_type` USM (validation reads host and shared
    USM in place and copies device USM through a staging buffer: both paths)."""
    b = s.batch(**over)
    for k in BATCH_ARRAYS:
        v = getattr(b, k)
        if v is not None:
            setattr(b, k, pygdn.UsmArray.from_numpy(v.to_numpy(), s.q, usm_type=usm_type))
    return b


@pytest.mark.parametrize("usm_type", ["device", "host"])
def test_metadata_in_device_or_host_usm(s, usm_type):
    fails(s, "GDN_ERROR_BAD_STATE_INDEX", ["spec_state_indices[1][2] = 999"],
          lambda: s.attention(_batch_in(s, usm_type, spec_state_indices=[[3, 4, 5], [6, 7, 999]])))
    fails(s, "GDN_ERROR_BAD_START_LOC", ["non_spec_query_start_loc decreases at [2]: 5 -> 4"],
          lambda: s.attention(_batch_in(s, usm_type, non_spec_query_start_loc=[0, 5, 4])))
    s.attention(_batch_in(s, usm_type))
    s.check_reference(written=range(1, 9))


# ----------------------------------------------------------------------------- graph padding is accepted
def test_arrays_longer_than_the_counts_need(queue):
    plain, padded = Setup(queue), Setup(queue)
    plain.attention()
    junk = [99, -7, 12345]
    over = {k: list(np.asarray(padded.meta[k]).reshape(-1)) + junk for k in INT_KEYS}
    over["has_initial_state"] = [1, 1, 0, 0, 1]
    padded.attention(padded.batch(**over))
    a, b = plain.state(), padded.state()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


@pytest.mark.parametrize("pad", [-1, 0])
@pytest.mark.parametrize("spec_layout", ["snapshot", "rolled"])
def test_graph_padded_batch(queue, pad, spec_layout):
    """The base batch plus: a padded decode (1 row, pad slot), a zero-length padded prefill, a padded spec
    sequence (1 row, all slots pad) and a zero-length padded spec sequence; 11 rows."""
    meta = dict(num_prefills=2, num_decodes=2, num_spec_decodes=4, num_actual_tokens=11, non_spec_token_count=5,
                spec_token_count=6, pad_slot_id=pad,
                non_spec_query_start_loc=[0, 3, 3, 4, 5], non_spec_state_indices=[1, pad, 2, pad],
                has_initial_state=[1, 0, 1, 1], non_spec_token_indx=[0, 2, 5, 7, 10],
                spec_query_start_loc=[0, 3, 3, 5, 6],
                spec_state_indices=[[3, 4, 5], [pad] * 3, [6, 7, 8], [pad] * 3], num_accepted_tokens=[2, 1, 1, 1],
                spec_token_indx=[1, 3, 4, 6, 8, 9])
    s = Setup(queue, spec_layout=spec_layout, rows=11, **meta)
    s.attention()
    got = s.check_reference(written=range(1, 9))
    assert np.all(got["core_attn_out"][[9, 10]] == 0), "rows of padded sequences are zeros"
    if pad == 0:
        assert np.array_equal(got["ssm_state"][0], ssm_from_canonical(s.host["ssm_state"], "vk")[0])


def test_read_slot_shared_by_two_readers(s):
    """Two spec sequences may read the same initial slot when nobody writes it (2 tokens, A=3 -> column 2)."""
    over = dict(num_accepted_tokens=[2, 3], spec_state_indices=[[3, 4, 5], [6, 7, 4]],
                spec_query_start_loc=[0, 2, 4], spec_token_count=4, num_actual_tokens=8, spec_token_indx=[1, 3, 4, 6])
    fails(s, "GDN_ERROR_DUPLICATE_SLOT", ["spec_state_indices[1][2] = 4 is read as an initial state"],
          lambda: s.attention(s.batch(**over)))  # slot 4 is written by spec sequence 0 (its token 1)
    over["spec_state_indices"] = [[3, 4, 9], [6, 7, 9]]
    over["num_accepted_tokens"] = [3, 3]
    s.attention(s.batch(**over))
    s.check_reference(dict(s.meta, **over), written=[1, 2, 3, 4, 6, 7])


# ----------------------------------------------------------------------------- state caches (gdn_batch_t v2)
# Base batch: prefill (3 tokens) writes 1, decode writes 2; spec sequence 0 writes 3 4 5 (reads 4: A=2),
# spec sequence 1 writes 6 7 (2 tokens, reads 6: A=1). Slots 9..15 are free.
@pytest.mark.parametrize("field,value,message", [
    ("non_spec_read_state_indices", [1, 16], "non_spec_read_state_indices[1] = 16 is outside [0, num_slots=16)"),
    ("spec_read_state_indices", [3, 20], "spec_read_state_indices[1] = 20 is outside [0, num_slots=16)"),
], ids=["non_spec", "spec"])
def test_read_slot_out_of_range(s, field, value, message):
    fails(s, "GDN_ERROR_BAD_STATE_INDEX", [message], lambda: s.attention(s.batch(**{field: value})))


@pytest.mark.parametrize("over,message", [
    (dict(non_spec_read_state_indices=[6, 2]),
     "non_spec_read_state_indices[0] = 6 is read as an initial state by non-spec sequence 0 but written by spec "
     "sequence 1 (spec_state_indices[1][0])"),
    (dict(spec_read_state_indices=[2, 6]),
     "spec_read_state_indices[0] = 2 is read as an initial state by spec sequence 0 but written by non-spec "
     "sequence 1 (non_spec_state_indices[1])"),
    (dict(spec_read_state_indices=[4, 5]),
     "spec_read_state_indices[1] = 5 is read as an initial state by spec sequence 1 but written by spec sequence 0"),
], ids=["non_spec_reads_spec_write", "spec_reads_non_spec_write", "spec_reads_spec_write"])
def test_read_slot_written_by_another_sequence(s, over, message):
    fails(s, "GDN_ERROR_DUPLICATE_SLOT", [message], lambda: s.attention(s.batch(**over)))


def test_negative_start_pos(s):
    fails(s, "GDN_ERROR_BAD_COUNT", ["non_spec_start_pos[1] = -1 is negative"],
          lambda: s.attention(s.batch(non_spec_start_pos=[0, -1])))


@pytest.mark.parametrize("field,value,message", [
    ("checkpoint_interval", 100, "batch->checkpoint_interval = 100 is not a multiple of GDN_CHUNK_SIZE (64)"),
    ("checkpoint_interval", -64, "batch->checkpoint_interval = -64 is outside [0, 2147483647]"),
    ("checkpoint_cols", -1, "batch->checkpoint_cols = -1 is outside [0, 2147483647]"),
])
def test_bad_checkpoint_counts(s, field, value, message):
    def mutate(b):
        setattr(b, field, value)
    fails(s, "GDN_ERROR_BAD_COUNT", [message], lambda: s.raw(mutate_batch=mutate))


def test_checkpoints_need_their_slots(s):
    fails(s, "GDN_ERROR_NULL_POINTER",
          ["batch->checkpoint_state_indices is NULL but checkpoint_interval > 0 and checkpoint_cols > 0"],
          lambda: s.attention(s.batch(checkpoint_interval=64, checkpoint_cols=1)))


# start_pos 62 and 63: the prefill's token 1 and the decode's token 0 end a block of 64 (a boundary).
CK = dict(checkpoint_interval=64, checkpoint_cols=1, non_spec_start_pos=[62, 63])


@pytest.mark.parametrize("over,status,message", [
    (dict(checkpoint_state_indices=[[10], [16]]), "GDN_ERROR_BAD_STATE_INDEX",
     "checkpoint_state_indices[1][0] = 16 is outside [0, num_slots=16)"),
    (dict(checkpoint_state_indices=[[10], [10]]), "GDN_ERROR_DUPLICATE_SLOT",
     "checkpoint_state_indices[1][0] = 10 (a checkpoint of non-spec sequence 1) is also checkpoint_state_indices[0][0] "
     "of non-spec sequence 0"),
    (dict(checkpoint_state_indices=[[3], [11]]), "GDN_ERROR_DUPLICATE_SLOT",
     "checkpoint_state_indices[0][0] = 3 (a checkpoint of non-spec sequence 0) is also written by spec sequence 0 "
     "(spec_state_indices[0][0])"),
    (dict(checkpoint_state_indices=[[10], [11]], non_spec_read_state_indices=[1, 10]), "GDN_ERROR_DUPLICATE_SLOT",
     "checkpoint_state_indices[0][0] = 10 (a checkpoint of non-spec sequence 0) is also read by non-spec sequence 1 "
     "(non_spec_read_state_indices[1]) as an initial state"),
    (dict(checkpoint_state_indices=[[10], [4]]), "GDN_ERROR_DUPLICATE_SLOT",
     "checkpoint_state_indices[1][0] = 4 (a checkpoint of non-spec sequence 1) is also written by spec sequence 0"),
    (dict(checkpoint_state_indices=[[12], [11]], non_spec_read_state_indices=[12, 2]), "GDN_ERROR_DUPLICATE_SLOT",
     "checkpoint_state_indices[0][0] = 12 (a checkpoint of non-spec sequence 0) is also that sequence's read slot "
     "(non_spec_read_state_indices[0])"),
    (dict(checkpoint_state_indices=[[1], [11]]), "GDN_ERROR_DUPLICATE_SLOT",
     "checkpoint_state_indices[0][0] = 1 (a checkpoint of non-spec sequence 0) is also that sequence's write slot "
     "(non_spec_state_indices[0]) but its boundary, token 1, is not the sequence's last token"),
    (dict(checkpoint_state_indices=[[10], [11]], checkpoint_cols=0), "GDN_ERROR_BAD_COUNT",
     "non-spec sequence 0 (non_spec_start_pos 62, 3 tokens) crosses 1 checkpoint boundaries (checkpoint_interval 64) "
     "but checkpoint_cols = 0"),
], ids=["out_of_range", "two_sequences", "spec_write", "other_read", "spec_write_decode", "own_read",
        "own_write_not_last", "too_many_boundaries"])
def test_bad_checkpoint_slot(s, over, status, message):
    fails(s, status, [message], lambda: s.attention(s.batch(**dict(CK, **over))))


def test_checkpoint_slot_twice_in_one_row(queue):
    """One 66-token prefill from position 63 crosses two boundaries (tokens 0 and 64)."""
    s = Setup(queue, rows=66, num_decodes=0, num_spec_decodes=0, num_actual_tokens=66, non_spec_token_count=66,
              spec_token_count=0, non_spec_query_start_loc=[0, 66], non_spec_state_indices=[1], has_initial_state=[1],
              non_spec_token_indx=None, checkpoint_interval=64, non_spec_start_pos=[63])
    fails(s, "GDN_ERROR_DUPLICATE_SLOT",
          ["checkpoint_state_indices[0][1] = 10 (a checkpoint of non-spec sequence 0) is also checkpoint_state_indices[0][0]"],
          lambda: s.attention(s.batch(checkpoint_cols=2, checkpoint_state_indices=[10, 10])))
    fails(s, "GDN_ERROR_BAD_COUNT", ["crosses 2 checkpoint boundaries", "checkpoint_cols = 1"],
          lambda: s.attention(s.batch(checkpoint_cols=1, checkpoint_state_indices=[10])))


def test_checkpoint_fields_unread_without_interval(s):
    """checkpoint_interval = 0: checkpoint_cols and checkpoint_state_indices are not looked at."""
    s.attention(s.batch(checkpoint_cols=3, non_spec_start_pos=[5, 7]))
    s.check_reference(written=range(1, 9))


# ----------------------------------------------------------------------------- cost independent of num_slots
def test_num_slots_beyond_the_caches(s):
    """num_slots declares the caches' extent: with num_slots = 2**31 - 1 and caches of 16 slots the
    call is refused naming the first cache it reads (the bytes computed without overflow), before
    any metadata is read; nothing is written."""
    def mutate(c):
        c.num_slots = I32_MAX
    need = ((I32_MAX - 1) * C * (W - 1 + NUM_SPEC) + C * (W - 1 + NUM_SPEC)) * 4
    fails(s, "GDN_ERROR_BAD_POINTER", ["tensors->conv_state = 0x", f"needs {need} bytes",
                                       f"num_slots = {I32_MAX}", f"has {NUM_SLOTS * C * (W - 1 + NUM_SPEC) * 4} bytes"],
          lambda: s.raw(mutate_cfg=mutate))


# ----------------------------------------------------------------------------- state caches: what is accepted
@pytest.mark.parametrize("over", [
    dict(non_spec_read_state_indices=[12, 12], spec_read_state_indices=[12, 12]),  # one slot read by four
    dict(non_spec_read_state_indices=[2, 2], has_initial_state=[0, 1]),  # "reads" another's write slot: nothing read
    dict(non_spec_read_state_indices=[-1, 2], spec_read_state_indices=[-1, 6]),  # pad read slot: zeros
    dict(spec_read_state_indices=[5, 7]),  # a spec sequence reads one of its own write slots
    dict(CK, checkpoint_state_indices=[[10], [2]]),  # the decode's boundary is its last token: its own write slot
    dict(CK, checkpoint_state_indices=[[-1], [11]], checkpoint_cols=1),  # a pad checkpoint is not stored
], ids=["shared_by_four", "no_initial_state", "pad_read", "own_write_slot", "checkpoint_at_last_token",
        "pad_checkpoint"])
def test_state_cache_cases_accepted(s, over):
    s.attention(s.batch(**over))
    meta = dict(s.meta, **over)
    written = {1, 2, 3, 4, 5, 6, 7} | ({10, 11} if over.get("checkpoint_interval") else set())
    s.check_reference(meta, written=written)
