"""pygdn.vllm's parts that need no engine run, in the integration environment (torch, vLLM):
which platform gets what (a monkeypatched platform: there is no XPU here), the dtypes a layer is
served with, and torch CPU tensors read without DLPack giving what DLPack gives."""
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
