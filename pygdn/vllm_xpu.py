"""vllm-xpu-kernels' GDN op on libgdn_xpu: `gdn_attention(...)` with the positional signature of
`torch.ops._xpu_C.gdn_attention` (vllm-xpu-kernels, csrc/xpu/torch_bindings.cpp; called by vLLM's
`_gdn_attention_core_xpu_impl` in vllm/_xpu_ops.py), as one pygdn.attention call.

What it maps (docs/op.md "Packed projections" has the sources):
- projected_states_qkvz / projected_states_ba are the in-projections' rows, read in place:
  reorder_input=False is Qwen3-Next's k-head-grouped order (Config.packed_order "grouped"),
  reorder_input=True Qwen3.5's contiguous [q|k|v|z], [b|a] ("contiguous");
- num_k_heads / num_v_heads are the model's; a rank holds num_heads / tp_size of each, and its
  projections, caches and z / core_attn_out hold those;
- z receives the rows' z columns [T, HV, V] for the caller's gated norm; core_attn_out the core's
  output (no norm here);
- caches as vllm-xpu-kernels keeps them: conv_state [slots, state_len, conv_dim] (time-major), spec
  windows per accepted token ("snapshot"), ssm_state [slots, HV, V, K] ("vk"); slot strides free;
- counts: the non-spec tokens are len(non_spec_token_indx) when given, else the rows not taken by
  spec tokens; the spec tokens len(spec_token_indx) when given, else the rows not taken by non-spec
  tokens; num_spec = spec_state_indices_tensor.shape[1] - 1;
- nothing is read back to the host (validation "counts"; with prefills the library still reads
  non_spec_query_start_loc, gdn_xpu.h).

Tensors: torch XPU tensors (DLPack kDLOneAPI; queue = torch.xpu.current_stream().sycl_queue unless
`queue=` is given; the call returns without waiting, ordered on that stream) or torch CPU tensors
(host memory, on an in-order queue of the SYCL CPU device unless `queue=` is given; the call waits,
as vLLM's CPU kernels return finished). Index arrays are int32, as vllm-xpu-kernels requires (vLLM
converts its int64 token indices before the call; pygdn refuses int64 by name); A_log and dt_bias
f32. num_accepted_tokens must be >= 1 (vllm-xpu-kernels clamps 0 to 1; the library, validating
counts only here, trusts it). This module imports torch only to find an XPU tensor's stream.
"""
from __future__ import annotations

_ACT = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}
_configs: dict = {}
_cpu_queue = []


def dtype_name(dtype):
    """pygdn's name of a torch dtype ("f32", "f16", "bf16"), None for the others (pygdn.vllm too)."""
    return _ACT.get(str(dtype))


def cpu_queue():
    """The process's one in-order queue on the SYCL CPU device for torch CPU tensors (pygdn.vllm too)."""
    if not _cpu_queue:
        import dpctl
        _cpu_queue.append(dpctl.SyclQueue("cpu", property="in_order"))
    return _cpu_queue[0]


def _dtype(t, name):
    d = dtype_name(getattr(t, "dtype", None))
    if d is None:
        raise TypeError(f"{name}: dtype {getattr(t, 'dtype', None)}, expected float32, float16 or bfloat16")
    return d


def _queue_of(t):
    """The queue for tensor t: its XPU device's current stream, or an in-order SYCL CPU queue."""
    device = getattr(t, "device", None)
    if getattr(device, "type", None) == "xpu":
        import torch
        return torch.xpu.current_stream(device).sycl_queue
    return cpu_queue()


def _config(qkvz, conv_state, ssm_state, conv_weights, H, HV, K, V, reorder_input):
    import pygdn
    key = (H, HV, K, V, conv_weights.shape[-1], str(qkvz.dtype), str(ssm_state.dtype), tuple(conv_state.shape),
           conv_state.stride(0), tuple(ssm_state.shape), ssm_state.stride(0), bool(reorder_input))
    cfg = _configs.get(key)
    if cfg is None:
        cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=conv_state.shape[0],
                           conv_width=conv_weights.shape[-1], act_dtype=_dtype(qkvz, "projected_states_qkvz"),
                           state_dtype=_dtype(ssm_state, "ssm_state"), ssm_layout="vk", conv_layout="time_major",
                           conv_spec_layout="snapshot", conv_state_len=conv_state.shape[1],
                           conv_slot_stride=conv_state.stride(0), ssm_slot_stride=ssm_state.stride(0),
                           packed_order="contiguous" if reorder_input else "grouped")
        _configs[key] = cfg
    return cfg


def gdn_attention(core_attn_out, z, projected_states_qkvz, projected_states_ba, num_k_heads, num_v_heads, head_k_dim,
                  head_v_dim, conv_state, ssm_state, conv_weights, conv_bias, activation, A_log, dt_bias, num_prefills,
                  num_decodes, num_spec_decodes, has_initial_state, non_spec_query_start_loc, non_spec_token_indx,
                  non_spec_state_indices_tensor, spec_query_start_loc, spec_token_indx, spec_state_indices_tensor,
                  num_accepted_tokens, num_actual_tokens, tp_size, reorder_input, *, queue=None) -> None:
    """torch.ops._xpu_C.gdn_attention's arguments, in its order; writes core_attn_out, z and the caches."""
    import pygdn
    if activation not in ("silu", "swish"):
        raise ValueError(f"activation={activation!r}: vllm-xpu-kernels' gdn_attention takes 'silu' or 'swish'")
    if tp_size < 1 or num_k_heads % tp_size or num_v_heads % tp_size:
        raise ValueError(f"tp_size={tp_size}: must divide num_k_heads={num_k_heads} and num_v_heads={num_v_heads}")
    H, HV = num_k_heads // tp_size, num_v_heads // tp_size
    cfg = _config(projected_states_qkvz, conv_state, ssm_state, conv_weights, H, HV, head_k_dim, head_v_dim,
                  reorder_input)
    ns, sp = num_prefills + num_decodes, num_spec_decodes
    T = num_actual_tokens
    ns_count = len(non_spec_token_indx) if non_spec_token_indx is not None else None
    sp_count = len(spec_token_indx) if spec_token_indx is not None else None
    if ns == 0:
        ns_count = 0
    if sp == 0:
        sp_count = 0
    if ns_count is None:
        ns_count = T - (sp_count or 0)
    if sp_count is None:
        sp_count = T - ns_count
    batch = pygdn.Batch(
        num_actual_tokens=T, num_prefills=num_prefills, num_decodes=num_decodes, num_spec_decodes=sp,
        num_spec=spec_state_indices_tensor.shape[1] - 1 if sp else 0, non_spec_token_count=ns_count,
        spec_token_count=sp_count, validate="counts",
        non_spec_query_start_loc=non_spec_query_start_loc if ns else None,
        non_spec_state_indices=non_spec_state_indices_tensor if ns else None,
        has_initial_state=has_initial_state if ns else None, non_spec_token_indx=non_spec_token_indx if ns else None,
        spec_query_start_loc=spec_query_start_loc if sp else None,
        spec_state_indices=spec_state_indices_tensor if sp else None,
        num_accepted_tokens=num_accepted_tokens if sp else None, spec_token_indx=spec_token_indx if sp else None)
    # XPU tensors: ordered on torch's stream, no wait. Host tensors are read by host code right after
    # the call, as after vLLM's own CPU kernels: the call finishes first.
    on_xpu = getattr(getattr(projected_states_qkvz, "device", None), "type", None) == "xpu"
    pygdn.attention(queue if queue is not None else _queue_of(projected_states_qkvz), cfg, batch,
                    qkvz=projected_states_qkvz, ba=projected_states_ba, z_out=z, conv_weight=conv_weights,
                    conv_bias=conv_bias, A_log=A_log, dt_bias=dt_bias, conv_state=conv_state, ssm_state=ssm_state,
                    core_attn_out=core_attn_out, wait=not on_xpu)
