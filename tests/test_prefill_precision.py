"""cfg.prefill_precision (gdn_xpu.h gdn_prefill_precision_t, docs/op.md "Prefill precision"): the
chunked prefill's products with bf16 operands and f32 accumulators, held to a float64 model of the
same rounding (pygdn.reference.chunked_gated_delta_rule_bf16); "f32" and "auto" computing what they
always did; the decision whether a device's matrix engine can be used (src/matrix.cpp, with facts
given by hand, and this host under a JIT target with AMX); the path the library names; the field's
validation and struct versions.

On a device without a matrix engine the library can use (the CPU device here) "bf16" runs the same
tile products emulated on FMA units (src/kernels/tiles.hpp), which read and write what joint_matrix
would: the data movement of the XMX / AMX builds is what these tests check, their arithmetic the
engine's."""
import dataclasses
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import pygdn
from pygdn import ffi, lib, reference as ref
from pygdn.batch import to_device
from helpers import dequantize, quantize, ssm_from_canonical, ssm_to_canonical, usm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAD = -1
FORMATS = {"f32": 24, "bf16": 8, "f16": 11}  # significant bits


def half_ulp(x, dtype):
    """Half a unit in the last place of |x| in dtype (what one rounding to it may move x)."""
    _, e = np.frexp(np.abs(np.asarray(x, np.float64)))
    return np.ldexp(0.5, e - FORMATS[dtype])


def batch_meta(rng, lens, decodes, start_pos, interval, num_slots):
    """Prefills of `lens` tokens (and 1-token decodes) in rows shuffled across the step, each read from
    a slot of its own and written to another, with block checkpoints every `interval` tokens of the
    request (start_pos: tokens each already holds)."""
    n = len(lens) + decodes
    all_lens = list(lens) + [1] * decodes
    slots = rng.permutation(num_slots).astype(np.int32)
    T = sum(all_lens)
    loc = np.concatenate([[0], np.cumsum(all_lens)]).astype(np.int32)
    starts = np.array(list(start_pos) + [0] * decodes, np.int32)
    meta = dict(num_prefills=len(lens), num_decodes=decodes, num_actual_tokens=T, non_spec_token_count=T,
                non_spec_query_start_loc=loc, non_spec_state_indices=slots[:n].copy(),
                non_spec_read_state_indices=slots[n:2 * n].copy(), has_initial_state=np.ones(n, np.uint8),
                non_spec_token_indx=rng.permutation(T).astype(np.int32), non_spec_start_pos=starts)
    if interval:
        cols = max((s + L) // interval - s // interval for s, L in zip(starts, all_lens))
        ck = np.full((n, max(cols, 1)), PAD, np.int32)
        free = list(slots[2 * n:])
        for i, (s, L) in enumerate(zip(starts, all_lens)):
            for c in range((s + L) // interval - s // interval):
                ck[i, c] = free.pop()
        meta.update(checkpoint_interval=interval, checkpoint_cols=ck.shape[1], checkpoint_state_indices=ck)
    return meta


class Case:
    """One gdn_gated_delta_rule call on prefills (and decodes) against the exact float64 reference
    and the model of the bf16 path's rounding."""

    def __init__(self, queue, seed, *, gate="head", H=1, HV=2, K=32, V=32, act="bf16", state="f32", layout="vk",
                 lens=(512,), decodes=0, start_pos=None, interval=0, precision="bf16", num_slots=24):
        rng = np.random.default_rng(seed)
        self.queue, self.H, self.HV, self.K, self.V, self.act, self.state = queue, H, HV, K, V, act, state
        self.gk = K if gate == "channel" else 1
        self.cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=num_slots,
                                act_dtype=act, state_dtype=state, ssm_layout=layout, gate_mode=gate,
                                prefill_precision=precision)
        self.meta = batch_meta(rng, lens, decodes, start_pos or [0] * len(lens), interval, num_slots)
        T = self.meta["num_actual_tokens"]
        self.x_s, self.x = quantize(rng.standard_normal((T, self.cfg.conv_dim)), act)
        self.a_s, self.a = quantize(rng.standard_normal((T, HV * self.gk)), act)
        self.b_s, self.b = quantize(rng.standard_normal((T, HV)), act)
        self.A_log = np.log(rng.uniform(0.5, 4.0 if gate == "channel" else 8.0, HV)).astype(np.float32)
        self.dt_bias = rng.uniform(-1.0, 1.0, HV * self.gk).astype(np.float32)
        s0_s, s0 = quantize(rng.standard_normal((num_slots, HV, K, V)) * 0.5, state)
        self.s0_s, self.s0 = ssm_from_canonical(s0_s, layout), s0

    def run(self, precision=None, workspace=None):
        """The library's outputs [T, HV, V] and states (canonical [slots, HV, K, V]), as float64."""
        cfg = self.cfg if precision is None else dataclasses.replace(self.cfg, prefill_precision=precision)
        T = self.meta["num_actual_tokens"]
        d_ssm = usm(self.queue, self.s0_s)
        d_out = usm(self.queue, quantize(np.zeros((T, self.HV, self.V)), self.act)[0])
        kw = {} if workspace is None else dict(workspace=usm(self.queue, np.zeros(workspace, np.uint8)))
        pygdn.gated_delta_rule(self.queue, cfg, to_device(self.meta, self.queue), conv_out=usm(self.queue, self.x_s),
                               ssm_state=d_ssm, core_attn_out=d_out, a=usm(self.queue, self.a_s),
                               b=usm(self.queue, self.b_s), A_log=usm(self.queue, self.A_log),
                               dt_bias=usm(self.queue, self.dt_bias), **kw)
        ssm = dequantize(ssm_to_canonical(d_ssm.to_numpy(), self.cfg.ssm_layout), self.state)
        return dequantize(d_out.to_numpy(), self.act), ssm

    def exact(self):
        g, beta = ref.gates(self.a, self.b, self.A_log, self.dt_bias)
        return ref.gated_delta_rule(self.x, g, beta, self.s0, self.meta, self.H, self.HV, self.K, self.V,
                                    state_dtype=None if self.state == "f32" else self.state)

    def model(self):
        """The bf16 path's outputs and stored states by the model; the decodes' as the recurrence's."""
        H, HV, K, V = self.H, self.HV, self.K, self.V
        g, beta = ref.gates(self.a, self.b, self.A_log, self.dt_bias)
        o, new = self.exact()
        q = ref.l2norm(self.x[:, :H * K].reshape(-1, H, K)) * K ** -0.5
        k = ref.l2norm(self.x[:, H * K:2 * H * K].reshape(-1, H, K))
        v = self.x[:, 2 * H * K:].reshape(-1, HV, V)
        interval = self.meta.get("checkpoint_interval", 0)
        store = lambda S: ref.round_state(S, None if self.state == "f32" else self.state)  # noqa: E731
        for i, slot, read, rows, _, checkpoints in ref._non_spec_sequences(self.meta):
            if len(rows) < 2:
                continue
            start = int(self.meta["non_spec_start_pos"][i])
            first = GDN_CHUNK - start % GDN_CHUNK if interval else None
            at = dict(checkpoints)
            for h in range(HV):
                kh = h // (HV // H)
                o_h, S, ends = ref.chunked_gated_delta_rule_bf16(q[rows, kh], k[rows, kh], v[rows, h], g[rows, h],
                                                                 beta[rows, h], self.s0[read, h], first=first)
                o[rows, h] = o_h
                new[slot, h] = store(S)
                for j, Sj in ends:
                    if at.get(j, PAD) != PAD:
                        new[at[j], h] = store(Sj)
        return o, new


GDN_CHUNK = lib.GDN_CHUNK_SIZE


def check_bf16_path(case, got=None, alpha=1.0):
    """The library's bf16 path within the model of its rounding: per element
    |lib - model| <= alpha max|model - exact| + the output's (state's) rounding to its dtype + f32 slack,
    for the outputs and every state; unaddressed slots unchanged. The library's f32 sums and its f32
    operands before rounding (l2norm, the solve, the decays) flip an operand's bf16 rounding now and
    then, which moves an output by up to a bf16 step of one of its terms: alpha = 1 leaves room for
    that next to the model's own error. Returns the relative errors (lib - model, model - exact,
    lib - exact)."""
    got_o, got_s = got or case.run()
    exact_o, exact_s = case.exact()
    model_o, model_s = case.model()
    T = case.meta["num_actual_tokens"]
    errs = {}
    for what, lib_v, model_v, exact_v, dtype in (("outputs", got_o[:T], model_o, exact_o, case.act),
                                                 ("states", got_s, model_s, exact_s, case.state)):
        scale = np.max(np.abs(exact_v))
        e_model = np.max(np.abs(model_v - exact_v))
        bound = alpha * e_model + half_ulp(model_v, dtype) + 2e-5 * scale
        over = np.abs(lib_v - model_v) - bound
        assert np.all(np.isfinite(lib_v)), f"{what}: non-finite values"
        worst = np.unravel_index(np.argmax(over), over.shape)
        assert np.all(over <= 0), (f"{what}: |lib - model| = {abs(lib_v - model_v)[worst]:.3g} at {worst} exceeds "
                                   f"{bound[worst]:.3g} (the model's own error is {e_model / scale:.3g} of max |exact| "
                                   f"{scale:.3g})")
        errs[what] = (np.max(np.abs(lib_v - model_v)) / scale, e_model / scale, np.max(np.abs(lib_v - exact_v)) / scale)
    written = {int(s) for s in case.meta["non_spec_state_indices"]}
    ck = case.meta.get("checkpoint_state_indices")
    written |= {int(s) for s in np.asarray(ck).ravel() if s != PAD} if ck is not None else set()
    for s in range(case.cfg.num_slots):
        if s not in written:
            assert np.array_equal(got_s[s], case.s0[s]), f"slot {s} is not written by the call but changed"
    return errs


# ----------------------------------------------------------------------------- the bf16 path's values
@pytest.mark.parametrize("act,state,layout", [("bf16", "f32", "vk"), ("bf16", "bf16", "kv"), ("f16", "f16", "vk")])
def test_bf16_prefills_gdn(queue, act, state, layout):
    """Three prefills (one starting mid-chunk: its checkpoints cut the chunks at the request's
    multiples of 128) and two decodes in shuffled rows, every state dtype and both layouts."""
    case = Case(queue, 610, act=act, state=state, layout=layout, lens=(512, 300, 77), decodes=2,
                start_pos=[100, 0, 64], interval=128)
    assert pygdn.prefill_path(queue, case.cfg)[0] in ("bf16-emulated", "amx", "xmx")
    check_bf16_path(case)


@pytest.mark.parametrize("state,layout", [("f32", "kv"), ("bf16", "vk")])
def test_bf16_prefills_kda(queue, state, layout):
    """KDA (a decay per key channel): W, U and the scan's products as tiles, A and Aqk by the f32
    per-channel walks; with block checkpoints."""
    case = Case(queue, 611, gate="channel", H=2, HV=2, state=state, layout=layout, lens=(512, 130), decodes=1,
                start_pos=[0, 30], interval=128)
    check_bf16_path(case)


def test_bf16_prefill_f32_activations_is_not_the_f32_path(queue):
    """f32 activations and state (nothing rounded but the products' operands): 2048 tokens at
    K = V = 64 within the model, and measurably off the f32 path's accuracy, which "f32" keeps."""
    case = Case(queue, 612, act="f32", K=64, V=64, lens=(2048,), start_pos=[0], interval=256)
    errs = check_bf16_path(case)
    assert errs["outputs"][2] > 1e-4, f"the bf16 path is as accurate as f32 ({errs}): is it rounding its operands?"
    f32_o, f32_s = case.run("f32")
    exact_o, exact_s = case.exact()
    assert np.max(np.abs(f32_o - exact_o)) <= 2e-5 * np.max(np.abs(exact_o)), "prefill_precision f32 outputs"


def test_bf16_prefill_32768_tokens(queue):
    """One long prefill: 512 chunks carrying the f32 state, each rounded to bf16 only as an operand."""
    case = Case(queue, 613, K=64, V=64, lens=(32768,), start_pos=[0], interval=4096, num_slots=16)
    check_bf16_path(case)


def test_bf16_prefill_in_a_given_workspace(queue):
    """gdn_attention_workspace_size covers the matrix form's operands: a call given exactly that many
    bytes runs the bf16 path (and "auto", which takes it on a device with XMX)."""
    case = Case(queue, 614, lens=(200, 90), decodes=1, start_pos=[0, 0])
    sizes = {p: pygdn.workspace_size(dataclasses.replace(case.cfg, prefill_precision=p), case.meta)
             for p in ("f32", "bf16", "auto")}
    assert sizes["bf16"] > sizes["f32"] and sizes["auto"] == sizes["bf16"], sizes
    check_bf16_path(case, case.run(workspace=sizes["bf16"]))


# ----------------------------------------------------------------------------- "f32" and "auto"
@pytest.mark.parametrize("kernels", ["cpu_kernels", "generic_kernels"])
@pytest.mark.parametrize("gate", ["head", "channel"])
def test_f32_and_auto_are_the_f32_path(queue, monkeypatch, kernels, gate):
    """On the CPU device "auto" is "f32" (no matrix form of the CPU kernels): the same bits, within f32
    of the exact reference; "bf16" gives other bits."""
    if not queue.sycl_device.is_cpu:
        pytest.skip("auto takes the device's matrix engine on a GPU")
    if kernels == "generic_kernels":
        monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")
    case = Case(queue, 615, gate=gate, H=2, HV=2, lens=(150, 70), decodes=1, start_pos=[0, 0], precision="auto")
    assert pygdn.prefill_path(queue, case.cfg)[0] == "f32"
    auto_o, auto_s = case.run("auto")
    f32_o, f32_s = case.run("f32")
    assert np.array_equal(auto_o, f32_o) and np.array_equal(auto_s, f32_s), "auto and f32 differ"
    exact_o, exact_s = case.exact()
    tol = 5e-2 if case.act == "bf16" else 2e-4  # (outputs rounded to bf16)
    assert np.max(np.abs(f32_o - exact_o)) <= tol * np.max(np.abs(exact_o))
    assert np.max(np.abs(f32_s - exact_s)) <= 2e-5 * np.max(np.abs(exact_s))
    bf16_o, _ = case.run("bf16")
    assert not np.array_equal(bf16_o, f32_o), "bf16 computed the f32 path's bits"


# ----------------------------------------------------------------------------- the path and the decision
def test_prefill_path_on_this_device(queue):
    base = dict(num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=64, num_slots=4)
    engine, text = pygdn.prefill_path(queue, pygdn.Config(**base))
    on_cpu = queue.sycl_device.is_cpu
    if on_cpu:
        assert engine == "f32" and text.startswith("f32 products"), text
    assert pygdn.prefill_path(queue, pygdn.Config(**base, prefill_precision="f32")) == (
        "f32", "f32 products on FMA units (prefill_precision f32)")
    engine, text = pygdn.prefill_path(queue, pygdn.Config(**base, prefill_precision="bf16"))
    assert engine in ("xmx", "amx", "bf16-emulated"), text
    assert "8x" in text and "sub-group" in text, text
    engine, text = pygdn.prefill_path(queue, pygdn.Config(**dict(base, head_k_dim=40), prefill_precision="bf16"))
    assert engine == "f32" and "multiples of 16" in text, text
    engine, text = pygdn.prefill_path(queue, pygdn.Config(**base, prefill_precision="bf16", force_recurrent=True))
    assert engine == "f32" and "FORCE_RECURRENT" in text, text
    engine, text = pygdn.prefill_path(queue, pygdn.Config(**base, act_dtype="f32"))
    assert engine == "f32", text


def cxx():
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


@pytest.mark.skipif(cxx() is None, reason="no C++ compiler")
def test_matrix_decision_with_given_facts(tmp_path):
    """src/matrix.cpp's decision on devices and hosts given by hand (tests/c/test_matrix_decision.cpp):
    XMX tiles from what Xe2 and dg2 report, AMX only with every fact of the CPU (CPUID, XCR0, the
    device's aspect, a JIT target naming an AMX CPU) -- the aspect without such a target, and such a
    target without AMX in CPUID, decide against it."""
    exe = str(tmp_path / "decision")
    built = subprocess.run([cxx(), "-std=c++17", "-O1", "-Wall", "-I", os.path.join(REPO, "src"), "-I",
                            os.path.join(REPO, "include"), os.path.join(REPO, "tests", "c", "test_matrix_decision.cpp"),
                            os.path.join(REPO, "src", "matrix.cpp"), "-o", exe], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    r = subprocess.run([exe], capture_output=True, text=True)
    assert r.returncode == 0 and "0 failures" in r.stdout, r.stdout + r.stderr


def host_has_amx():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_tile" in flags and "amx_bf16" in flags


_SUBPROCESS_PREFILL = r"""
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, pygdn
from helpers import default_queue
from test_prefill_precision import Case, check_bf16_path
q = default_queue()
case = Case(q, 616, lens=(300,), decodes=1, start_pos=[0])
print("path", *pygdn.prefill_path(q, case.cfg), sep="|")
print("errors", check_bf16_path(case))
"""


def test_jit_target_with_amx_on_this_host(queue):
    """CL_CONFIG_CPU_TARGET_ARCH=sapphirerapids in a process of its own: the CPU runtime then compiles
    joint_matrix to AMX and reports the matrix aspect whatever the host. On a host whose CPUID has no
    AMX that code dies of SIGILL, so the library takes the emulation there; the process survives a
    bf16 prefill and its values are the bf16 path's. (On a host with AMX it takes AMX.)"""
    if not queue.sycl_device.is_cpu:
        pytest.skip("the CPU device's JIT target")
    env = dict(os.environ, CL_CONFIG_CPU_TARGET_ARCH="sapphirerapids")
    env.pop("GDN_XPU_GENERIC_KERNELS", None)
    r = subprocess.run([sys.executable, "-P", "-c", _SUBPROCESS_PREFILL, os.path.dirname(os.path.abspath(__file__))],
                       env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-4000:]}"
    path = next(line for line in r.stdout.splitlines() if line.startswith("path|")).split("|")
    if host_has_amx():
        assert path[1] == "amx", path
    else:
        assert path[1] == "bf16-emulated" and "CPUID" in path[2], path


# ----------------------------------------------------------------------------- the field
def config_c(**kw):
    cfg = pygdn.Config(num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=64, num_slots=4)
    c = ffi.new("gdn_config_t *", cfg._to_c()[0])
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def path_c(queue, c):
    engine, buf = ffi.new("int32_t *"), ffi.new("char[]", 256)
    status = lib.gdn_prefill_path(ffi.cast("void *", queue.addressof_ref()), c, engine, buf, 256)
    return status, engine[0], ffi.string(lib.gdn_last_error()).decode()


@pytest.mark.parametrize("value", [3, -1, 0x7FFFFFFF])
def test_bad_prefill_precision_names_the_field(queue, value):
    status, _, message = path_c(queue, config_c(prefill_precision=value))
    assert status == lib.GDN_ERROR_BAD_DTYPE, message
    assert f"cfg->prefill_precision = {value}" in message and "gdn_prefill_precision_t" in message, message
    with pytest.raises(ValueError, match="prefill_precision"):
        pygdn.Config(num_k_heads=1, num_v_heads=1, head_k_dim=16, head_v_dim=16, num_slots=1,
                     prefill_precision="tf32")._to_c()


def test_reserved_field_must_be_zero(queue):
    status, _, message = path_c(queue, config_c(reserved1=1))
    assert status == lib.GDN_ERROR_UNSUPPORTED and "cfg->reserved1 = 1" in message, message


def test_version_3_config_gets_auto(queue):
    """A caller of the 0.3 header: its gdn_config_t ends at gate_lower_bound (108 bytes on LP64),
    padded to 112; the padding (garbage here) is not read as prefill_precision, which is AUTO."""
    end = ffi.offsetof("gdn_config_t", "prefill_precision")
    size = (end + 7) // 8 * 8
    n = ffi.sizeof("gdn_config_t")
    buf = ffi.new("unsigned char[]", n)
    ffi.memmove(buf, b"\xa5" * n, n)
    ffi.memmove(buf, config_c(prefill_precision=lib.GDN_PREFILL_BF16), end)
    c = ffi.cast("gdn_config_t *", buf)
    c.struct_size = size
    status, engine, message = path_c(queue, c)
    assert status == lib.GDN_SUCCESS, message
    want_engine, _ = pygdn.prefill_path(queue, pygdn.Config(num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=64,
                                                            num_slots=4))
    assert {0: "f32", 1: "xmx", 2: "amx", 3: "bf16-emulated"}[engine] == want_engine
    if ffi.sizeof("void *") == 8:
        assert (end, size) == (108, 112) and n > size
