"""Every array a call reads or writes lies inside its USM allocation (include/gdn_xpu.h, "Every
array a call reads or writes lies inside its USM allocation"), for every array of every entry point.

Through the C entry points (pygdn.lib with hand-filled structs: pygdn's own shape checks would
refuse these calls before the library sees them): each array in an allocation of its own, shared
or device USM, each followed by a canary allocation. An allocation one element short of what the
call needs -> GDN_ERROR_BAD_POINTER naming the array, the bytes it needs and the bytes it has, with
every array and every canary bit-identical; an exact fit, or a view inside a larger allocation ->
the float64 reference's values. Through pygdn: a producer whose __sycl_usm_array_interface__
describes more memory than its allocation holds gets the same error.
"""
import numpy as np
import pytest

import dpctl.memory as dpmem
import pygdn
from pygdn import ffi, lib
from pygdn import reference as ref
from pygdn.batch import BATCH_ARRAYS
from helpers import EditedSUAI, assert_close

H, HV, K, V, W = 1, 2, 4, 4, 4
C = 2 * H * K + HV * V
SLOTS, NUM_SPEC, L = 8, 1, W - 1
T = 6
CANARY_BYTES, CANARY = 256, 0xA5
OUT_FILL = 7.0
RTOL = 2e-4

# A prefill (3 tokens, reads slot 0, writes 1), a decode (slot 2) and a spec sequence (2 tokens, reads
# slot 5, writes 3 and 4), rows interleaved; every metadata array given (checkpoints: none crossed).
META = dict(num_prefills=1, num_decodes=1, num_spec_decodes=1, num_spec=NUM_SPEC, num_actual_tokens=T,
            non_spec_token_count=4, spec_token_count=2, pad_slot_id=-1,
            non_spec_query_start_loc=[0, 3, 4], non_spec_state_indices=[1, 2], has_initial_state=[1, 1],
            non_spec_token_indx=[0, 1, 2, 4], spec_query_start_loc=[0, 2], spec_state_indices=[[3, 4]],
            num_accepted_tokens=[1], spec_token_indx=[3, 5], non_spec_read_state_indices=[0, 2],
            spec_read_state_indices=[5], checkpoint_interval=64, checkpoint_cols=1, non_spec_start_pos=[0, 10],
            checkpoint_state_indices=[-1, -1])
COUNTS = ("num_prefills", "num_decodes", "num_spec_decodes", "num_spec", "num_actual_tokens", "non_spec_token_count",
          "spec_token_count", "pad_slot_id", "checkpoint_interval", "checkpoint_cols")


def _host():
    rng = np.random.default_rng(11)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    h = dict(mixed_qkv=f(T, C), a=f(T, HV), b=f(T, HV), conv_weight=f(C, W) * 0.5, conv_bias=f(C) * 0.1,
             A_log=np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32),
             dt_bias=rng.uniform(-1, 1, HV).astype(np.float32),
             g=-rng.uniform(0.05, 1.0, (T, HV)).astype(np.float32), beta=rng.uniform(0, 1, (T, HV)).astype(np.float32),
             conv_state=f(SLOTS, C, L), ssm_state=f(SLOTS, HV, K, V) * 0.5,
             core_attn_out=np.full((T, HV, V), OUT_FILL, np.float32), z=f(T, HV, V),
             norm_weight=rng.uniform(0.5, 1.5, V).astype(np.float32))
    conv_ref, _ = ref.causal_conv1d(h["mixed_qkv"], h["conv_weight"], h["conv_bias"], h["conv_state"], META)
    h["conv_out_in"] = conv_ref.astype(np.float32)  # gdn_gated_delta_rule's input
    h["conv_out"] = np.full((T, C), OUT_FILL, np.float32)
    for k, a in BATCH_ARRAYS.items():
        h[k] = np.asarray(META[k], np.uint8 if a.dtype == "u8" else np.int32).reshape(-1)
    return h


HOST = _host()
TENSORS = {  # entry point -> the tensors it reads or writes (all of them given)
    "gdn_attention": ("mixed_qkv", "a", "b", "conv_weight", "conv_bias", "A_log", "dt_bias", "conv_state",
                      "ssm_state", "core_attn_out", "z", "norm_weight", "conv_out", "workspace"),
    "gdn_causal_conv1d": ("mixed_qkv", "conv_weight", "conv_bias", "conv_state", "conv_out"),
    "gdn_gated_delta_rule": ("conv_out", "a", "b", "A_log", "dt_bias", "ssm_state", "core_attn_out", "workspace"),
    "gdn_gated_delta_rule(g, beta)": ("conv_out", "g", "beta", "ssm_state", "core_attn_out", "workspace"),
}
WRITTEN = ("conv_state", "ssm_state", "core_attn_out", "conv_out")


def _cfg_c(**over):
    c = ffi.new("gdn_config_t *")
    lib.gdn_config_init(c)
    for k, v in dict(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, conv_width=W, num_slots=SLOTS,
                     act_dtype=lib.GDN_DTYPE_F32, ssm_layout=lib.GDN_SSM_KV, conv_layout=lib.GDN_CONV_DIM_MAJOR,
                     conv_spec_layout=lib.GDN_CONV_SPEC_SNAPSHOT, conv_state_len=L, **over).items():
        setattr(c, k, v)
    return c


def _batch_c(validate=0):
    c = ffi.new("gdn_batch_t *")
    lib.gdn_batch_init(c)
    for k in COUNTS:
        setattr(c, k, META[k])
    c.validate = validate
    return c


def workspace_bytes():
    n = ffi.new("size_t *")
    assert lib.gdn_attention_workspace_size(_cfg_c(), _batch_c(), n) == lib.GDN_SUCCESS
    return int(n[0])


def content(name, op):
    """The bytes an array of op starts with (conv_out is gdn_gated_delta_rule's input)."""
    if name == "workspace":
        return np.zeros(workspace_bytes(), np.uint8)
    key = "conv_out_in" if name == "conv_out" and op.startswith("gdn_gated_delta_rule") else name
    return HOST[key].reshape(-1).view(np.uint8)


def item(name):
    return 4 if name == "workspace" else HOST[name].itemsize


class Call:
    """One call of entry point `op`, every array (the batch's 12 and the op's tensors) in an
    allocation of its own of `usm_type`, followed by a canary allocation. layout[name] =
    (allocation bytes, offset of the array in it, contents) changes an array's allocation (default:
    exactly its bytes, at offset 0, its HOST contents)."""

    def __init__(self, queue, op, usm_type="shared", layout=None, cfg=None, validate=0):
        self.q, self.op = queue, op
        layout = layout or {}
        self.names = tuple(BATCH_ARRAYS) + TENSORS[op]
        self.mem, self.canary, self.addr, self.initial = {}, {}, {}, {}
        cls = {"shared": dpmem.MemoryUSMShared, "device": dpmem.MemoryUSMDevice}[usm_type]
        for name in self.names:
            data = content(name, op)
            size, offset, data = layout.get(name, (data.size, 0, data))
            buf = np.zeros(max(size, 1), np.uint8)
            n = max(0, min(data.size, size - offset))
            buf[offset:offset + n] = data[:n]
            self.mem[name] = cls(buf.size, queue=queue)
            self.mem[name].copy_from_host(buf)
            self.initial[name] = buf
            self.canary[name] = cls(CANARY_BYTES, queue=queue)  # the allocation after it
            self.canary[name].copy_from_host(np.full(CANARY_BYTES, CANARY, np.uint8))
            self.addr[name] = self.mem[name]._pointer + offset
        self.c_cfg = cfg or _cfg_c()
        self.c_batch = _batch_c(validate)
        for k in BATCH_ARRAYS:
            setattr(self.c_batch, k, ffi.cast("void *", self.addr[k]))
        self.c_t = ffi.new("gdn_tensors_t *")
        lib.gdn_tensors_init(self.c_t)
        for k in TENSORS[op]:
            setattr(self.c_t, k, ffi.cast("void *", self.addr[k]))
        if "workspace" in TENSORS[op]:
            self.c_t.workspace_bytes = workspace_bytes()

    def run(self):
        """(status name, message) of the C call (the queue waited for)."""
        fn = getattr(lib, self.op.split("(")[0])
        status = fn(ffi.cast("void *", self.q.addressof_ref()), self.c_cfg, self.c_batch, self.c_t)
        message = ffi.string(lib.gdn_last_error()).decode()
        self.q.wait()
        return pygdn.GdnError(status, message).status_name if status else "GDN_SUCCESS", message

    def read(self, name, offset=0, nbytes=None):
        out = np.empty(self.mem[name].nbytes, np.uint8)
        self.mem[name].copy_to_host(out)
        return out[offset:offset + (nbytes if nbytes is not None else out.size)]

    def assert_unchanged(self):
        for name in self.names:
            assert np.array_equal(self.read(name), self.initial[name]), f"a failed call changed {name}"
            got = np.empty(CANARY_BYTES, np.uint8)
            self.canary[name].copy_to_host(got)
            assert np.all(got == CANARY), f"the allocation after {name} was written"

    def fails(self, field, need, have):
        status, message = self.run()
        assert status == "GDN_ERROR_BAD_POINTER", f"{status}: {message}"
        where = "batch" if field in BATCH_ARRAYS else "tensors"
        for needle in (f"{where}->{field} = 0x", f"needs {need} bytes", f"its allocation has {have} bytes from that pointer on"):
            assert needle in message, f"{needle!r} not in {message!r}"
        self.assert_unchanged()
        return message

    def output(self, name, layout=None):
        """An output array as float32 (read from its offset in its allocation)."""
        offset = (layout or {}).get(name, (0, 0))[1]
        return self.read(name, offset, HOST[name].nbytes).view(np.float32).reshape(HOST[name].shape)


def reference(op):
    """The outputs of op by the float64 reference: {name: array}."""
    h = HOST
    if op == "gdn_causal_conv1d":
        out, cs = ref.causal_conv1d(h["mixed_qkv"], h["conv_weight"], h["conv_bias"], h["conv_state"], META)
        return dict(conv_out=out, conv_state=cs)
    if op == "gdn_attention":
        o, cs, ss = ref.gdn_attention(h["mixed_qkv"], h["a"], h["b"], h["conv_weight"], h["conv_bias"], h["A_log"],
                                      h["dt_bias"], h["conv_state"], h["ssm_state"], META, H, HV, K, V, z=h["z"],
                                      norm_weight=h["norm_weight"])
        return dict(core_attn_out=o, conv_state=cs, ssm_state=ss, conv_out=h["conv_out_in"])
    g, beta = (h["g"], h["beta"]) if "(g, beta)" in op else ref.gates(h["a"], h["b"], h["A_log"], h["dt_bias"])
    o, ss = ref.gated_delta_rule(h["conv_out_in"], g, beta, h["ssm_state"], META, H, HV, K, V)
    return dict(core_attn_out=o, ssm_state=ss)


def check_reference(call, layout=None):
    for name, want in reference(call.op).items():
        assert_close(call.output(name, layout), want, RTOL, f"{call.op} {name}")


CASES = [(op, name) for op in TENSORS for name in tuple(BATCH_ARRAYS) + TENSORS[op]]


@pytest.mark.parametrize("usm_type", ["shared", "device"])
@pytest.mark.parametrize("op", list(TENSORS))
def test_exact_fits(queue, op, usm_type):
    call = Call(queue, op, usm_type)
    assert call.run() == ("GDN_SUCCESS", "")
    check_reference(call)


@pytest.mark.parametrize("usm_type", ["shared", "device"])
@pytest.mark.parametrize("op,name", CASES, ids=[f"{op}-{name}" for op, name in CASES])
def test_one_element_short(queue, op, name, usm_type):
    data = content(name, op)
    need = data.size
    short = max(need - item(name), 1)  # (an allocation of 0 bytes cannot be made)
    call = Call(queue, op, usm_type, layout={name: (short, 0, data)})
    call.fails(name, need, short)


@pytest.mark.parametrize("op", list(TENSORS))
def test_views_inside_larger_allocations(queue, op):
    """Every array 64 bytes into an allocation 128 bytes longer than it: fits."""
    layout = {n: (content(n, op).size + 128, 64, content(n, op)) for n in tuple(BATCH_ARRAYS) + TENSORS[op]}
    call = Call(queue, op, "shared", layout)
    assert call.run() == ("GDN_SUCCESS", "")
    check_reference(call, layout)


@pytest.mark.parametrize("name", tuple(BATCH_ARRAYS) + TENSORS["gdn_attention"])
def test_view_running_past_the_end(queue, name):
    """An array 64 bytes into an allocation, running past its end by 64 bytes (by half of
    itself when it is shorter)."""
    data = content(name, "gdn_attention")
    over = min(64, data.size // 2)
    call = Call(queue, "gdn_attention", "shared", {name: (64 + data.size - over, 64, data)})
    call.fails(name, data.size, data.size - over)


@pytest.mark.parametrize("op", ["gdn_attention", "gdn_causal_conv1d"])
def test_counts_mode_checks_extents_too(queue, op):
    data = content("mixed_qkv", op)
    call = Call(queue, op, "device", {"mixed_qkv": (data.size - 4, 0, data)}, validate=lib.GDN_VALIDATE_COUNTS)
    call.fails("mixed_qkv", data.size, data.size - 4)


def _strided(rows, stride):
    """rows [n, width] f32 placed `stride` elements apart: (n-1)*stride + width elements."""
    n, width = rows.shape
    out = np.full((n - 1) * stride + width, -3.0, np.float32)
    for r in range(n):
        out[r * stride:r * stride + width] = rows[r]
    return out


# (field, its stride field in gdn_tensors_t or gdn_config_t, rows as [n, width], the stride)
STRIDED = [("mixed_qkv", "mixed_qkv_stride", HOST["mixed_qkv"], C + 5),
           ("core_attn_out", "out_stride", HOST["core_attn_out"].reshape(T, HV * V), HV * V + 3),
           ("conv_state", "conv_slot_stride", HOST["conv_state"].reshape(SLOTS, C * L), C * L + 16),
           ("ssm_state", "ssm_slot_stride", HOST["ssm_state"].reshape(SLOTS, HV * K * V), HV * K * V + 8)]


@pytest.mark.parametrize("field,stride_field,rows,stride", STRIDED, ids=[s[0] for s in STRIDED])
def test_strided_rows_and_slots(queue, field, stride_field, rows, stride):
    """Rows and slots at a stride above their width: the last one needs only its own elements (a
    cache that is one of several views into engine pages, as vLLM's conv and SSM states are); one
    element less is refused."""
    data = _strided(rows, stride).view(np.uint8)
    cfg = _cfg_c(**({stride_field: stride} if stride_field.endswith("slot_stride") else {}))

    def call(size):
        c = Call(queue, "gdn_attention", "shared", {field: (size, 0, data)}, cfg=cfg)
        if not stride_field.endswith("slot_stride"):
            setattr(c.c_t, stride_field, stride)
        return c
    fits = call(data.size)
    assert fits.run() == ("GDN_SUCCESS", "")
    n, width = rows.shape
    for name, want in reference("gdn_attention").items():
        if name == field:  # the strided one, row by row
            got = fits.read(field).view(np.float32)
            got = np.stack([got[r * stride:r * stride + width] for r in range(n)])
            assert_close(got, np.asarray(want).reshape(n, width), RTOL, field)
        else:
            assert_close(fits.output(name), want, RTOL, name)
    call(data.size - 4).fails(field, data.size, data.size - 4)


def test_reallocation_is_measured_afresh(queue):
    """A call that fit, then its output freed and a smaller allocation made (the allocator may
    well give the same address): the next call is refused."""
    data = content("core_attn_out", "gdn_attention")
    call = Call(queue, "gdn_attention", "shared")
    assert call.run()[0] == "GDN_SUCCESS"
    old = call.mem["core_attn_out"]._pointer
    del call.mem["core_attn_out"]
    call.mem["core_attn_out"] = dpmem.MemoryUSMShared(data.size - 4, queue=queue)
    call.c_t.core_attn_out = ffi.cast("void *", call.mem["core_attn_out"]._pointer)
    call.initial = {k: call.read(k) for k in call.names}  # the first call's results
    call.fails("core_attn_out", data.size, data.size - 4)
    print("same address reused:", call.mem["core_attn_out"]._pointer == old)


# ----------------------------------------------------------------------------- through pygdn
def _claiming(queue, array, usm_type="shared"):
    """A USM array of one element less than `array` whose interface claims array's full shape."""
    flat = np.ascontiguousarray(array).reshape(-1)
    short = pygdn.UsmArray.from_numpy(flat[:-1], queue, usm_type)

    def edit(d):
        d["shape"] = array.shape
    return EditedSUAI(short, edit)


PYGDN_TENSORS = ("mixed_qkv", "a", "b", "conv_weight", "conv_bias", "A_log", "dt_bias", "conv_state", "ssm_state",
                 "core_attn_out", "z", "norm_weight")


@pytest.mark.parametrize("usm_type", ["shared", "device"])
@pytest.mark.parametrize("name", tuple(BATCH_ARRAYS) + PYGDN_TENSORS)
def test_pygdn_producer_describing_more_than_its_allocation(queue, name, usm_type):
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=SLOTS, conv_width=W,
                       act_dtype="f32", ssm_layout="kv", conv_layout="dim_major", conv_spec_layout="snapshot")
    arrays = {k: pygdn.UsmArray.from_numpy(HOST[k], queue, usm_type) for k in tuple(BATCH_ARRAYS) + PYGDN_TENSORS}
    canary = pygdn.UsmArray.from_numpy(np.full(64, CANARY, np.uint8), queue, usm_type)
    arrays[name] = _claiming(queue, HOST[name], usm_type)
    batch = pygdn.Batch(**{k: META[k] for k in COUNTS}, **{k: arrays[k] for k in BATCH_ARRAYS})
    host = lambda a: getattr(a, "base", a).to_numpy()  # noqa: E731 (the short one: its memory)
    before = {k: host(arrays[k]) for k in WRITTEN if k in arrays}
    with pytest.raises(pygdn.GdnError) as e:
        pygdn.attention(queue, cfg, batch, **{k: arrays[k] for k in PYGDN_TENSORS})
    queue.wait()
    assert e.value.status_name == "GDN_ERROR_BAD_POINTER"
    need = HOST[name].nbytes
    assert f"->{name} = 0x" in str(e.value) and f"needs {need} bytes" in str(e.value)
    assert f"has {max(need - HOST[name].itemsize, 1)} bytes" in str(e.value)  # (UsmArray allocates >= 1 byte)
    for k, v in before.items():
        assert np.array_equal(host(arrays[k]), v), f"a failed call changed {k}"
    assert np.all(canary.to_numpy() == CANARY)
