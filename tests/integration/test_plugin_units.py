"""pygdn.vllm's parts that need no engine run, in the integration environment (torch, vLLM):
which platform gets what (a monkeypatched platform: there is no XPU here), the dtypes a layer is
served with, torch CPU tensors read without DLPack giving what DLPack gives, and the CPU core on a
layer and metadata as vLLM makes them: its null block as padding inside the counted rows (eager and in
a recorded graph), and both of vLLM's conv-state layouts."""
import sys
import types

import pytest
import torch

import pygdn
import pygdn.vllm as plugin
from pygdn import _dlpack, _usm


class Platform:
    def __init__(self, kind):
        self.kind, self.device_name = kind, kind

    def is_cpu(self):
        return self.kind == "cpu"

    def is_xpu(self):
        return self.kind == "xpu"


@pytest.fixture
def platform(monkeypatch):
    """Sets vLLM's current platform to a fake of the given kind, with the plugin switched on and its
    registration state fresh."""
    import vllm.platforms
    monkeypatch.setenv(plugin.ENV, "1")
    monkeypatch.setattr(plugin, "_state", dict(plugin._state, registered=False))

    def use(kind):
        monkeypatch.setattr(vllm.platforms, "_current_platform", Platform(kind))
    return use


def test_xpu_platform_ends_in_pygdn_vllm_xpu(platform, monkeypatch):
    fake = types.ModuleType("pygdn.vllm_xpu")
    fake.gdn_attention = lambda *args, **kwargs: ("pygdn", args, kwargs)
    monkeypatch.setitem(sys.modules, "pygdn.vllm_xpu", fake)
    monkeypatch.delattr(pygdn, "vllm_xpu", raising=False)
    platform("xpu")
    try:
        plugin.register()
        # what vLLM's XPU op body (vllm/_xpu_ops.py, _gdn_attention_core_xpu_impl) calls, looked up as it does
        assert torch.ops._xpu_C.gdn_attention is fake.gdn_attention
        assert torch.ops._xpu_C.gdn_attention(1, z=2) == ("pygdn", (1,), {"z": 2})
        assert plugin._state["registered"]
    finally:
        if "gdn_attention" in vars(torch.ops._xpu_C):
            delattr(torch.ops._xpu_C, "gdn_attention")


def test_cpu_platform_replaces_the_cpu_core(platform, monkeypatch):
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn_layer
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as cpu_ops
    cls = gdn_layer.QwenGatedDeltaNetAttention
    monkeypatch.setattr(cls, "__init__", cls.__init__)  # restored afterwards
    monkeypatch.setattr(cpu_ops, "cpu_gdn_attention_core", cpu_ops.cpu_gdn_attention_core)
    platform("cpu")
    plugin.register()
    assert cpu_ops.cpu_gdn_attention_core is plugin.gdn_attention_core
    assert "_xpu_C" not in vars(torch.ops) or "gdn_attention" not in vars(torch.ops._xpu_C)


def test_other_platforms_are_left_alone(platform, caplog):
    platform("cuda")
    with caplog.at_level("WARNING", logger="vllm.pygdn"):
        plugin.register()
    assert not plugin._state["registered"] and "not serving" in caplog.text


def test_off_without_the_setting(platform, monkeypatch):
    monkeypatch.setenv(plugin.ENV, "0")
    platform("xpu")
    plugin.register()
    assert not plugin._state["registered"]


def layer(weights, conv, ssm):
    return types.SimpleNamespace(prefix="model.layers.0.linear_attn", conv1d=types.SimpleNamespace(
        weight=torch.zeros(8, 1, 4, dtype=weights)), get_state_dtype=lambda: (conv, ssm))


@pytest.mark.parametrize("weights, ssm, want", [
    (torch.bfloat16, torch.float32, ("bf16", "f32")), (torch.bfloat16, torch.bfloat16, ("bf16", "bf16")),
    (torch.float16, torch.float16, ("f16", "f16")), (torch.float32, torch.float32, ("f32", "f32")),
    (torch.float16, torch.float32, ("f16", "f32"))])
def test_dtypes_follow_the_weights_and_the_ssm_cache(weights, ssm, want):
    assert plugin._dtypes(layer(weights, weights, ssm)) == want


def test_dtypes_the_library_cannot_serve_are_named():
    with pytest.raises(TypeError, match="model.layers.0.linear_attn: .* torch.float64 weights"):
        plugin._dtypes(layer(torch.float64, torch.float64, torch.float32))
    with pytest.raises(TypeError, match="conv state cache is torch.float32 .* activations torch.bfloat16"):
        plugin._dtypes(layer(torch.bfloat16, torch.float32, torch.float32))
    with pytest.raises(TypeError, match="linear_attn: SSM cache dtype torch.int8: an 8-bit SSM cache needs one f32 scale"):
        plugin._dtypes(layer(torch.bfloat16, torch.bfloat16, torch.int8))


@pytest.fixture(scope="module")
def queue():
    import dpctl
    q = dpctl.SyclQueue("cpu", property="in_order")
    if not q.sycl_device.has_aspect_usm_system_allocations:
        pytest.skip("the device cannot address host memory")
    return q


@pytest.mark.parametrize("make", [
    lambda: torch.arange(24, dtype=torch.bfloat16).reshape(4, 6),
    lambda: torch.arange(48, dtype=torch.float32).reshape(4, 12)[:, 2:5],   # strided rows
    lambda: torch.arange(40, dtype=torch.int32)[3:],                        # an offset
    lambda: torch.ones(5, dtype=torch.bool), lambda: torch.zeros(3, dtype=torch.int64),
    lambda: torch.zeros(2, 3, dtype=torch.float16).t()])
def test_torch_tensors_read_directly_as_dlpack_reads_them(make, queue):
    t = make()
    fast = _usm.usm_view(t, "x", queue)
    held, address, shape, strides, dtype = _dlpack.consume(t, "x", queue)
    assert fast[0] == address == t.data_ptr() and fast[1] == shape and fast[2] == dtype
    assert tuple(fast[3]) == tuple(strides) and fast[6] is None
    held.release()


def test_torch_tensors_dlpack_would_refuse_go_through_dlpack(queue):
    for t in (torch.zeros(3, requires_grad=True), torch.zeros(3, dtype=torch.complex64).conj()):
        assert _dlpack.torch_host_view(t, queue) is None
    with pytest.raises(Exception, match="(?i)grad"):
        _usm.usm_view(torch.zeros(3, requires_grad=True), "x", queue)


def decode_metadata(B, first_slot):
    return types.SimpleNamespace(
        num_actual_tokens=B, num_prefills=0, num_decodes=B, num_prefill_tokens=0, num_decode_tokens=B,
        non_spec_query_start_loc=torch.arange(B + 1, dtype=torch.int32),
        non_spec_state_indices_tensor=torch.arange(first_slot, first_slot + 2 * B, dtype=torch.int32).reshape(B, 2)[:, 0],
        has_initial_state=None, spec_sequence_masks=None, num_spec_decodes=0)


def test_a_steps_batches_are_made_once_per_kv_cache_group(monkeypatch, queue):
    """vLLM gives each KV-cache group of GDN layers its own metadata object and runs the layers of the
    groups in turn (layer i in group i % groups): each object's batch is made once a step."""
    monkeypatch.setattr(plugin, "_state", dict(plugin._state, steps={}))
    made = []
    monkeypatch.setattr(pygdn, "Batch", lambda **kw: made.append(pygdn.batch.Batch(**kw)) or made[-1])
    groups = [decode_metadata(4, 10 * g) for g in range(3)]
    for layer in range(12):
        batch = plugin._step_batch(groups[layer % 3])
        assert batch is made[layer % 3]
    assert len(made) == 3
    # the block-table column became int32 contiguous, its values kept
    assert made[1].non_spec_state_indices.tolist() == [10, 12, 14, 16]
    for g in range(plugin.STEP_GROUPS):  # later steps' objects push the first step's out
        plugin._step_batch(decode_metadata(1, g))
    plugin._step_batch(groups[0])
    assert len(made) == 3 + plugin.STEP_GROUPS + 1


# ----------------------------------------------------------------------------- the CPU core and vLLM's conventions
H, HV, K, V, W, S, SLOTS = 2, 4, 16, 16, 4, 2, 40
C = 2 * H * K + HV * V
NULL_BLOCK_ID = 0


def cpu_layer(seed, name):
    """What the CPU core reads of a QwenGatedDeltaNetAttention layer (f32), its caches as vLLM allocates them
    in the conv layout it runs with (get_state_shape: W - 1 + S rows)."""
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator
    g = torch.Generator().manual_seed(seed)
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(1, H, HV, K, V, W, S)
    conv = torch.randn(SLOTS, W - 1 + S, C, generator=g)  # time-major contents, either layout's memory below
    return types.SimpleNamespace(
        prefix=name, num_k_heads=H, num_v_heads=HV, tp_size=1, head_k_dim=K, head_v_dim=V, conv_kernel_size=W,
        activation="silu", conv1d=types.SimpleNamespace(weight=torch.randn(C, 1, W, generator=g) * 0.5,
                                                        bias=torch.randn(C, generator=g) * 0.1),
        A_log=torch.log(torch.rand(HV, generator=g) * 7.5 + 0.5), dt_bias=torch.rand(HV, generator=g) * 2 - 1,
        kv_cache=[conv if shapes[0][0] == W - 1 + S else conv.transpose(1, 2).contiguous(),
                  torch.randn(SLOTS, *shapes[1], generator=g) * 0.5],
        get_state_dtype=lambda: (torch.float32, torch.float32), get_state_shape=lambda: shapes)


def twin_of(layer, name):
    other = types.SimpleNamespace(**{k: v for k, v in vars(layer).items() if k != "_pygdn"})
    other.prefix, other.kv_cache = name, [t.clone() for t in layer.kv_cache]
    return other


def cpu_metadata(ns=None, spec=None):
    """A GDNAttentionMetadata-like object: ns (qsl, slots) of decodes, spec (qsl, blocks, accepted)."""
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    md = types.SimpleNamespace(num_prefills=0, num_prefill_tokens=0, num_decodes=0, num_decode_tokens=0,
                               num_spec_decodes=0, num_spec_decode_tokens=0, has_initial_state=None,
                               spec_sequence_masks=None, non_spec_token_indx=None, spec_token_indx=None)
    if ns:
        md.num_decodes, md.num_decode_tokens = len(ns[1]), ns[0][-1]
        md.non_spec_query_start_loc, md.non_spec_state_indices_tensor = i32(ns[0]), i32(ns[1])
    if spec:
        md.num_spec_decodes, md.num_spec_decode_tokens = len(spec[1]), spec[0][-1]
        md.spec_sequence_masks = torch.ones(len(spec[1]), dtype=torch.bool)
        md.spec_query_start_loc, md.spec_state_indices_tensor, md.num_accepted_tokens = (i32(v) for v in spec)
    md.num_actual_tokens = md.num_decode_tokens + md.num_spec_decode_tokens
    return md


def core_step(monkeypatch, layer, md, x):
    """The CPU core's call of one layer step (forward context: this layer and metadata)."""
    monkeypatch.setattr(plugin, "layer_step", lambda name: (layer, md))
    plugin.gdn_attention_core(x["mixed_qkv"], x["b"], x["a"], x["out"], layer.prefix)


def core_inputs(seed, T):
    g = torch.Generator().manual_seed(seed)
    return dict(mixed_qkv=torch.randn(T, C, generator=g), b=torch.randn(T, HV, generator=g),
                a=torch.randn(T, HV, generator=g), out=torch.full((T, HV, V), 5.0))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_cpu_core_takes_the_null_block_as_padding(monkeypatch, queue, graph):
    """Decode and MTP steps whose counted rows hold vLLM's null block: a stale decode row with a token and
    block 0, zero-length rows of block 0 and -1; a stale spec row of block 0 with 3 tokens (accepted 0),
    zero-length rows of block 0 and -1 (accepted 1). Their rows come out zero, block 0 of both caches stays
    as it was, the real rows and every cache slot are what the step without them gives, bit for bit; eager,
    and recorded once (pygdn.Graph on the plugin's queue) and replayed on new inputs."""
    monkeypatch.setattr(plugin, "_state", dict(plugin._state, steps={}, announced=True))
    layer = cpu_layer(3, "padded")
    twin = twin_of(layer, "unpadded")
    block0 = [t[NULL_BLOCK_ID].clone() for t in layer.kv_cache]
    steps = [  # (padded metadata, its real rows, its stale rows, unpadded metadata)
        (cpu_metadata(ns=([0, 1, 2, 3, 4, 4, 4], [30, NULL_BLOCK_ID, 31, 32, NULL_BLOCK_ID, -1])), [0, 2, 3], [1],
         cpu_metadata(ns=([0, 1, 2, 3], [30, 31, 32]))),
        (cpu_metadata(spec=([0, 3, 6, 8, 8, 8], [[33, 34, 35], [NULL_BLOCK_ID] * 3, [36, 37, 38], [NULL_BLOCK_ID] * 3,
                                                [-1] * 3], [2, 0, 3, 1, 1])), [0, 1, 2, 6, 7], [3, 4, 5],
         cpu_metadata(spec=([0, 3, 5], [[33, 34, 35], [36, 37, 38]], [2, 3])))]
    for md, real, stale, unpadded in steps:
        T = md.num_actual_tokens
        x = core_inputs(10, T)
        if graph:
            core_step(monkeypatch, layer, md, {k: v.clone() for k, v in x.items()})
            core_step(monkeypatch, twin, unpadded, {k: v[real].clone() for k, v in x.items()})
            with pygdn.Graph(plugin._queue()) as recorded:
                core_step(monkeypatch, layer, md, x)
        for i in range(1, 3):
            fresh = core_inputs(10 + i, T)
            for k in x:
                x[k].copy_(fresh[k])
            y = {k: v[real].clone() for k, v in x.items()}
            if graph:
                recorded.replay()
            else:
                core_step(monkeypatch, layer, md, x)
            core_step(monkeypatch, twin, unpadded, y)
            assert torch.equal(x["out"][real], y["out"]), "the real rows"
            assert torch.all(x["out"][stale] == 0), "the stale rows' outputs are zeros"
            for got, want, name in zip(layer.kv_cache, twin.kv_cache, ("conv", "ssm")):
                assert torch.equal(got, want), f"{name} state"
            for got, want in zip(layer.kv_cache, block0):
                assert torch.equal(got[NULL_BLOCK_ID], want), "block 0 changed"


@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_cpu_core_follows_vllms_conv_state_layout(monkeypatch, queue, layout):
    """VLLM_SSM_CONV_STATE_LAYOUT picks the conv state's layout vLLM allocates (DS: [blocks, conv_dim,
    state_len], SD: [blocks, state_len, conv_dim]): the CPU core's config follows it, and a decode and an
    MTP step give the bits of the other layout's layer (its conv state transposed)."""
    from vllm.model_executor.layers.mamba import mamba_utils
    monkeypatch.setattr(plugin, "_state", dict(plugin._state, steps={}, announced=True))
    other = "SD" if layout == "DS" else "DS"
    layers, outs = {}, {}
    try:
        for name in (other, layout):  # each layer made and served under its own setting
            monkeypatch.setenv("VLLM_SSM_CONV_STATE_LAYOUT", name)
            mamba_utils.get_conv_state_layout.cache_clear()
            layers[name], outs[name] = cpu_layer(5, name), []
            assert plugin._config(layers[name]).conv_layout == ("dim_major" if name == "DS" else "time_major")
            assert plugin._config(layers[name]).conv_state_len == W - 1 + S
            for md, T in ((cpu_metadata(ns=([0, 1, 2], [11, 12])), 2),
                          (cpu_metadata(spec=([0, 3, 6], [[13, 14, 15], [16, 17, 18]], [1, 3])), 6)):
                outs[name].append(core_inputs(T, T))
                core_step(monkeypatch, layers[name], md, outs[name][-1])
        for a, b in zip(outs["DS"], outs["SD"]):
            assert torch.equal(a["out"], b["out"]), "outputs"
        ds, sd = layers["DS"].kv_cache, layers["SD"].kv_cache
        assert torch.equal(ds[0].transpose(1, 2), sd[0]), "conv state"
        assert torch.equal(ds[1], sd[1]), "ssm state"
    finally:
        monkeypatch.delenv("VLLM_SSM_CONV_STATE_LAYOUT")
        mamba_utils.get_conv_state_layout.cache_clear()
