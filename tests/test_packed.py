"""Packed projections (Config.packed_order; gdn_xpu.h gdn_packed_order_t): qkvz and ba as vLLM's
in-projections produce them, read in place by the kernels. Each case runs one step twice from the
same layer state, on the unpacked arrays and on their packed rearrangement (NumPy), and expects the
same bits (the kernels address differently, the arithmetic is the same), and checks both against
the float64 reference; z_out against the z columns. Then the errors, and pygdn.vllm_xpu's
vllm-xpu-kernels signature on torch CPU tensors."""
import dataclasses

import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from pygdn.batch import make_batch, to_device
from helpers import EditedSUAI, assert_close, dequantize, quantize, usm
from op_checks import Layer

W = 4
BATCHES = {
    # prefills (chunked), decodes, spec sequences, a padded sequence, rows in random order
    "mixed": dict(prefill_lens=[37, 5], num_decodes=2, spec_lens=[3, 1], num_spec=2, order="random",
                  pad_non_spec=1, pad_len=1),
    # no prefill: on the CPU device both groups take the fused conv + recurrence kernel
    "decode_spec": dict(num_decodes=3, spec_lens=[3, 2], num_spec=2, order="random"),
}


def pack_qkvz(x, z, order, H, HV, K, V):
    """mixed_qkv rows [T, 2HK + HV*V] and z rows [T, HV*V] -> qkvz rows in `order`."""
    if order == "contiguous":
        return np.concatenate([x, z], axis=1)
    HK, vg = H * K, HV // H * V
    groups = [(x[:, h * K:(h + 1) * K], x[:, HK + h * K:HK + (h + 1) * K], x[:, 2 * HK + h * vg:2 * HK + (h + 1) * vg],
               z[:, h * vg:(h + 1) * vg]) for h in range(H)]
    return np.concatenate([p for g in groups for p in g], axis=1)


def pack_ba(b, a, order, H, HV):
    if order == "contiguous":
        return np.concatenate([b, a], axis=1)
    r = HV // H
    return np.concatenate([p for h in range(H) for p in (b[:, h * r:(h + 1) * r], a[:, h * r:(h + 1) * r])], axis=1)


class Step:
    """One batch, its inputs (storage and float64) and two identical layers (unpacked, packed)."""

    def __init__(self, queue, order, dims, dtype, batch, seed=0, norm=True):
        H, HV, K, V = dims
        rng = np.random.default_rng(seed)
        self.meta = make_batch(rng, num_slots=32, **BATCHES[batch])
        T = self.T = self.meta["num_actual_tokens"]
        self.cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=32, conv_width=W,
                                conv_state_len=W - 1 + self.meta["num_spec"], act_dtype=dtype)
        self.cfg_p = dataclasses.replace(self.cfg, packed_order=order)
        self.layers = [Layer(queue, np.random.default_rng(seed + 1), self.cfg, with_z=norm) for _ in range(2)]
        self.x_s, self.x = quantize(rng.standard_normal((T, self.cfg.conv_dim)), dtype)
        self.a_s, self.a = quantize(rng.standard_normal((T, HV)), dtype)
        self.b_s, self.b = quantize(rng.standard_normal((T, HV)), dtype)
        self.z_s, self.z = quantize(rng.standard_normal((T, HV * V)), dtype)
        self.qkvz_s = pack_qkvz(self.x_s, self.z_s, order, H, HV, K, V)
        self.ba_s = pack_ba(self.b_s, self.a_s, order, H, HV)
        self.queue, self.dims, self.dtype, self.norm = queue, dims, dtype, norm

    def fill(self, value):
        H, HV, K, V = self.dims
        return usm(self.queue, quantize(np.full((self.T + 1, HV, V), value), self.dtype)[0])

    def unpacked(self):
        layer, q = self.layers[0], self.queue
        out = self.fill(5.0)
        pygdn.attention(q, self.cfg, to_device(self.meta, q), mixed_qkv=usm(q, self.x_s), a=usm(q, self.a_s),
                        b=usm(q, self.b_s), z=usm(q, self.z_s) if self.norm else None, **self.weights(layer),
                        core_attn_out=out)
        return out.to_numpy()

    def packed(self, qkvz=None, ba=None, z_out=None):
        layer, q = self.layers[1], self.queue
        out = self.fill(5.0)
        z_out = self.fill(7.0) if z_out is None else z_out
        pygdn.attention(q, self.cfg_p, to_device(self.meta, q), qkvz=usm(q, self.qkvz_s) if qkvz is None else qkvz,
                        ba=usm(q, self.ba_s) if ba is None else ba, z_out=z_out, **self.weights(layer),
                        core_attn_out=out)
        return out.to_numpy(), z_out

    def weights(self, layer):
        return dict(conv_weight=layer.d_w, conv_bias=layer.d_bias, A_log=layer.d_A, dt_bias=layer.d_dt,
                    conv_state=layer.d_conv, ssm_state=layer.d_ssm, norm_weight=layer.d_norm_w if self.norm else None)

    def check_same(self, got_u, got_p, z_out):
        """Packed == unpacked bit for bit (outputs, canary row, both caches); z_out = the z columns."""
        T = self.T
        assert np.array_equal(got_p, got_u), "core_attn_out: packed and unpacked differ"
        assert np.array_equal(dequantize(got_p[T], self.dtype), np.full(got_p.shape[1:], 5.0)), "canary row written"
        for name in ("d_conv", "d_ssm"):
            assert np.array_equal(getattr(self.layers[0], name).to_numpy(), getattr(self.layers[1], name).to_numpy()), name
        zo = np.asarray(z_out.to_numpy() if hasattr(z_out, "to_numpy") else z_out).reshape(T + 1, -1)
        assert np.array_equal(zo[:T], self.z_s), "z_out is not the rows' z columns"
        assert np.all(dequantize(zo[T], self.dtype) == 7.0), "z_out canary row written"

    def check_reference(self, got):
        """The packed run (output got, layers[1]'s caches) against the float64 reference."""
        H, HV, K, V = self.dims
        layer = self.layers[1]
        want_o, _, want_ssm = ref.gdn_attention(
            self.x, self.a, self.b, layer.w, layer.bias, layer.A_log, layer.dt_bias, layer.conv0[1],
            layer.ssm0.astype(np.float64), self.meta, H, HV, K, V, spec_layout=self.cfg.conv_spec_layout,
            z=self.z.reshape(self.T, HV, V) if self.norm else None, norm_weight=layer.norm_w)
        tol = 2e-4 if self.dtype == "f32" else 5e-2
        assert_close(dequantize(got[:self.T], self.dtype), want_o, tol, "core_attn_out vs reference")
        assert_close(layer.ssm_state(), want_ssm, tol, "ssm_state vs reference")


ORDERS = ["grouped", "contiguous"]
# (dims H, HV, K, V; act dtype; batch; generic kernels; fused norm)
CASES = ([(d, t, "mixed", False, True) for d in [(2, 4, 16, 16), (16, 32, 16, 16)] for t in ["f32", "bf16"]]
         + [((2, 4, 16, 16), "f32", "decode_spec", False, False), ((2, 4, 16, 16), "bf16", "decode_spec", True, True),
            ((2, 4, 8, 8), "f32", "mixed", True, False), ((1, 3, 16, 16), "f32", "mixed", False, True)])


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dims,dtype,batch,generic,norm", CASES, ids=[
    f"H{d[0]}-HV{d[1]}-K{d[2]}-{t}-{b}{'-generic' if g else ''}{'-norm' if n else ''}" for d, t, b, g, n in CASES])
def test_packed_equals_unpacked(queue, monkeypatch, order, dims, dtype, batch, generic, norm):
    if generic:
        monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")
    s = Step(queue, order, dims, dtype, batch, norm=norm)
    got_u = s.unpacked()
    got_p, z_out = s.packed()
    s.check_same(got_u, got_p, z_out)
    s.check_reference(got_p)


@pytest.mark.parametrize("order", ORDERS)
def test_grouped_blocks_across_16_lanes(queue, order):
    """K = 8, a group's v part 24 wide: no 16-channel block fits a part of a grouped row, so the
    packed conv takes the generic kernel; checked against the reference (the unpacked call may
    take the CPU variant, whose SiLU rounds differently)."""
    s = Step(queue, order, (2, 6, 8, 8), "f32", "mixed")
    got_p, z_out = s.packed()
    s.check_reference(got_p)
    assert np.array_equal(np.asarray(z_out.to_numpy()).reshape(s.T + 1, -1)[:s.T], s.z_s)


@pytest.mark.parametrize("order", ORDERS)
def test_strided_rows(queue, order):
    """qkvz, ba and z_out as column ranges of wider host rows (row strides != widths)."""
    if not queue.sycl_device.has_aspect_usm_system_allocations:
        pytest.skip("host arrays need a device that addresses host memory")
    s = Step(queue, order, (2, 4, 16, 16), "bf16", "mixed")
    got_u = s.unpacked()
    T, (H, HV, K, V) = s.T, s.dims
    wide = np.zeros((T, s.qkvz_s.shape[1] + 24), s.qkvz_s.dtype)
    wide[:, 8:8 + s.qkvz_s.shape[1]] = s.qkvz_s
    wide_ba = np.zeros((T, 2 * HV + 5), s.ba_s.dtype)
    wide_ba[:, 3:3 + 2 * HV] = s.ba_s
    z_wide = quantize(np.full((T + 1, HV * V + 16), 7.0), "bf16")[0]
    z_out = z_wide[:, 16:]
    got_p, _ = s.packed(qkvz=wide[:, 8:8 + s.qkvz_s.shape[1]], ba=wide_ba[:, 3:3 + 2 * HV], z_out=z_out)
    s.check_same(got_u, got_p, z_out)
    assert np.all(dequantize(z_wide[:, :16], "bf16") == 7.0), "z_out wrote outside its columns"


@pytest.mark.parametrize("order", ORDERS)
def test_conv_and_delta_entry_points(queue, order):
    """gdn_causal_conv1d reads qkvz (and copies z to z_out), gdn_gated_delta_rule reads ba: the same
    conv_out, outputs and caches as from mixed_qkv and a, b."""
    s = Step(queue, order, (2, 4, 16, 16), "bf16", "mixed", norm=False)
    q, T, (H, HV, K, V) = s.queue, s.T, s.dims
    outs = []
    for cfg, layer, packed in ((s.cfg, s.layers[0], False), (s.cfg_p, s.layers[1], True)):
        conv_out = usm(q, np.zeros((T, cfg.conv_dim), np.uint16))
        core = s.fill(5.0)
        z_out = s.fill(7.0) if packed else None
        inputs = dict(qkvz=usm(q, s.qkvz_s), z_out=z_out) if packed else dict(mixed_qkv=usm(q, s.x_s))
        pygdn.causal_conv1d(q, cfg, to_device(s.meta, q), conv_weight=layer.d_w, conv_bias=layer.d_bias,
                            conv_state=layer.d_conv, conv_out=conv_out, **inputs)
        gates = dict(ba=usm(q, s.ba_s)) if packed else dict(a=usm(q, s.a_s), b=usm(q, s.b_s))
        pygdn.gated_delta_rule(q, cfg, to_device(s.meta, q), conv_out=conv_out, A_log=layer.d_A, dt_bias=layer.d_dt,
                               ssm_state=layer.d_ssm, core_attn_out=core, **gates)
        outs.append((conv_out.to_numpy(), core.to_numpy(), z_out))
    assert np.array_equal(outs[0][0], outs[1][0]), "conv_out"
    s.check_same(outs[0][1], outs[1][1], outs[1][2])


# ----------------------------------------------------------------------------- errors
def failing(s, match, status, **kw):
    """A packed call that must fail with `status`, naming `match`, and write nothing."""
    layer = s.layers[1]
    conv0, ssm0 = layer.d_conv.to_numpy(), layer.d_ssm.to_numpy()
    out, z_out = s.fill(5.0), s.fill(7.0)
    q = s.queue
    args = dict(qkvz=usm(q, s.qkvz_s), ba=usm(q, s.ba_s), z_out=z_out, **s.weights(layer), core_attn_out=out)
    cfg = kw.pop("cfg", s.cfg_p)
    mutate = kw.pop("mutate", None)
    args.update(kw)
    with pytest.raises(pygdn.GdnError, match=match) as e:
        if mutate is None:
            pygdn.attention(q, cfg, to_device(s.meta, q), **{k: v for k, v in args.items() if v is not None})
        else:
            call = pygdn.prepare(pygdn.attention, q, cfg, to_device(s.meta, q), **{k: v for k, v in args.items() if v is not None})
            mutate(call)
            call.run()
    assert e.value.status_name == status
    assert np.all(dequantize(out.to_numpy(), s.dtype) == 5.0), "core_attn_out written by a failing call"
    assert np.all(dequantize(z_out.to_numpy(), s.dtype) == 7.0), "z_out written by a failing call"
    assert np.array_equal(layer.d_conv.to_numpy(), conv0) and np.array_equal(layer.d_ssm.to_numpy(), ssm0), "caches written"


@pytest.fixture(scope="module")
def step(queue):
    return Step(queue, "grouped", (2, 4, 16, 16), "f32", "mixed")


def test_error_packed_arrays_without_order(step):
    failing(step, r"tensors->qkvz is given but cfg->packed_order is GDN_PACKED_NONE", "GDN_ERROR_BAD_LAYOUT",
            cfg=step.cfg, mixed_qkv=usm(step.queue, step.x_s), ba=None, z_out=None, a=usm(step.queue, step.a_s),
            b=usm(step.queue, step.b_s))


@pytest.mark.parametrize("field", ["mixed_qkv", "a", "z"])
def test_error_unpacked_array_with_order(step, field):
    arr = {"mixed_qkv": step.x_s, "a": step.a_s, "z": step.z_s}[field]
    failing(step, rf"tensors->{field} is given but cfg->packed_order = 1 reads the packed projections",
            "GDN_ERROR_BAD_LAYOUT", **{field: usm(step.queue, arr)})


@pytest.mark.parametrize("field", ["qkvz", "ba"])
def test_error_packed_array_missing(step, field):
    failing(step, rf"tensors->{field} is NULL but", "GDN_ERROR_NULL_POINTER", **{field: None})


def test_error_packed_order_value(step):
    def mutate(call):
        call._c_cfg = pygdn.ffi.new("gdn_config_t *", call._c_cfg[0])  # (the Config's own struct stays as it is)
        call._c_cfg.packed_order = 3
    failing(step, r"cfg->packed_order = 3 is outside \[0, 2\]", "GDN_ERROR_BAD_LAYOUT", mutate=mutate)


@pytest.mark.parametrize("field,width", [("qkvz_stride", "2*H*K+2*HV*V"), ("ba_stride", "2*HV"), ("z_out_stride", "HV*V")])
def test_error_stride_below_width(step, field, width):
    def mutate(call):
        setattr(call._c_t, field, 3)
    failing(step, rf"tensors->{field} = 3 < row width", "GDN_ERROR_BAD_LAYOUT", mutate=mutate)


@pytest.mark.parametrize("field", ["qkvz", "ba", "z_out"])
def test_error_array_past_its_allocation(step, field):
    """An array whose shape claims more rows than its allocation holds: the extent check names it."""
    H, HV, K, V = step.dims
    width = {"qkvz": step.qkvz_s.shape[1], "ba": 2 * HV, "z_out": HV * V}[field]
    short = usm(step.queue, np.zeros((step.T - 1, width), np.float32))
    claims = EditedSUAI(short, lambda d: d.update(shape=(step.T + 1, width)))
    failing(step, rf"tensors->{field} = 0x[0-9a-f]+ needs \d+ bytes", "GDN_ERROR_BAD_POINTER", **{field: claims})


def test_error_z_out_to_delta_rule(step):
    q, layer = step.queue, step.layers[1]
    call = pygdn.prepare(pygdn.gated_delta_rule, q, step.cfg_p, to_device(step.meta, q), conv_out=usm(q, step.x_s),
                         ba=usm(q, step.ba_s), A_log=layer.d_A, dt_bias=layer.d_dt, ssm_state=layer.d_ssm,
                         core_attn_out=step.fill(5.0))
    call._c_t.z_out = call._c_t.core_attn_out
    with pytest.raises(pygdn.GdnError, match="tensors->z_out is given to gdn_gated_delta_rule"):
        call.run()


# ----------------------------------------------------------------------------- vllm-xpu-kernels' signature
@pytest.mark.parametrize("reorder_input", [False, True])
def test_vllm_xpu_signature_on_torch_cpu(queue, reorder_input):
    """pygdn.vllm_xpu.gdn_attention with vllm-xpu-kernels' positional arguments on torch CPU tensors
    (global heads with tp_size 2: this rank holds half), against the unpacked call on the same data."""
    torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
    if not queue.sycl_device.has_aspect_usm_system_allocations:
        pytest.skip("torch CPU tensors need a device that addresses host memory")
    from pygdn import vllm_xpu
    order = "contiguous" if reorder_input else "grouped"
    s = Step(queue, order, (2, 4, 16, 16), "f32", "mixed", norm=False)
    s.cfg.conv_spec_layout = "snapshot"  # vllm-xpu-kernels' spec conv windows (vk / time_major: Config's defaults)
    got_u = s.unpacked()
    m, layer, T = s.meta, s.layers[1], s.T
    H, HV, K, V = s.dims
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    conv, ssm = t(layer.d_conv.to_numpy()), t(layer.d_ssm.to_numpy())
    out, z = torch.full((T + 1, HV, V), 5.0), torch.full((T + 1, HV, V), 7.0)
    vllm_xpu.gdn_attention(
        out, z, t(s.qkvz_s), t(s.ba_s), 2 * H, 2 * HV, K, V, conv, ssm, t(layer.w_s), t(layer.bias_s), "silu",
        t(layer.A_log), t(layer.dt_bias), m["num_prefills"], m["num_decodes"], m["num_spec_decodes"],
        t(m["has_initial_state"]).bool(), t(m["non_spec_query_start_loc"]), t(m["non_spec_token_indx"]),
        t(m["non_spec_state_indices"]), t(m["spec_query_start_loc"]), t(m["spec_token_indx"]),
        t(m["spec_state_indices"]), t(m["num_accepted_tokens"]), T, 2, reorder_input, queue=queue)
    assert np.array_equal(out.numpy(), got_u), "core_attn_out differs from the unpacked call"
    assert np.array_equal(z.numpy().reshape(T + 1, -1)[:T], s.z_s) and np.all(z.numpy()[T] == 7.0), "z"
    assert np.array_equal(conv.numpy(), s.layers[0].d_conv.to_numpy()), "conv_state"
    assert np.array_equal(ssm.numpy(), s.layers[0].d_ssm.to_numpy()), "ssm_state"
