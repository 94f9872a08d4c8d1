"""vllm-xpu-kernels' GDN op on libgdn_xpu: `gdn_attention(...)` with the signature of
`torch.ops._xpu_C.gdn_attention` (vllm-xpu-kernels, csrc/xpu/torch_bindings.cpp; called by vLLM's
`_gdn_attention_core_xpu_impl` in vllm/_xpu_ops.py with the first eight arguments by position and
the rest by keyword), as one prepared pygdn.attention call per layer.

What it maps (docs/op.md "Packed projections" has the sources):
- projected_states_qkvz / projected_states_ba are the in-projections' rows, read in place:
  reorder_input=False is Qwen3-Next's k-head-grouped order (Config.packed_order "grouped"),
  reorder_input=True Qwen3.5's contiguous [q|k|v|z], [b|a] ("contiguous");
- num_k_heads / num_v_heads are the model's; a rank holds num_heads / tp_size of each, and its
  projections, caches and z / core_attn_out hold those;
- z receives the rows' z columns [T, HV, V] for the caller's gated norm; core_attn_out the core's
  output (no norm here);
- caches as vLLM allocates them for vllm-xpu-kernels: ssm_state [slots, HV, V, K] ("vk"); conv_state
  [slots, state_len, conv_dim] ("time_major"), or [slots, conv_dim, state_len] ("dim_major") when vLLM
  runs with VLLM_SSM_CONV_STATE_LAYOUT=DS (is_conv_state_dim_first()); slot strides free;
- spec sequences' conv history as vllm-xpu-kernels keeps it since its #544 (merged 2026-08-25): one
  sliding window per sequence in the block of its column 0, read at row offset num_accepted - 1, of
  state_len = W - 1 + num_spec rows as vLLM allocates it (Config.conv_spec_layout "rolled"; vLLM's
  get_conv_copy_spec moves that window between blocks). GDN_XPU_XK_CONV=snapshot in the environment
  (read when a layer is prepared) or xk_conv="snapshot" (a keyword of the call, before the environment)
  selects the per-token windows of vllm-xpu-kernels up to 4543b580 ("snapshot": the window after token
  t in the block of column t), for a deployment pinned before #544;
- padding: vLLM's null block (NULL_BLOCK_ID, 0 in vLLM 0.32, read from the installed vLLM) is the
  batch's pad_slot_id, so a 0 in any index array, like any negative index, is neither read nor written
  (gdn_xpu.h "State caches": vLLM's metadata builder writes it into padded and stale rows);
- dt_bias f32 or in the activations' dtype (vLLM's parameter is in the model's dtype), read as it
  is by the gate kernels (gdn_tensors_t.dt_bias_dtype); A_log f32; parameters that require grad
  are taken (their memory, detached);
- counts, as vllm-xpu-kernels derives them: non-spec tokens len(non_spec_token_indx) when given, else
  num_decodes for a batch of decodes only (one token each: rows past them are graph padding, as
  vLLM pads a captured decode step's num_actual_tokens), else the rows not taken by spec tokens;
  spec tokens len(spec_token_indx) when given, else the rows not taken by non-spec tokens;
  num_spec = spec_state_indices_tensor.shape[1] - 1. The library's num_actual_tokens is their sum:
  rows past it (padded leading dims) are not touched. Metadata arrays may be longer than the
  counts (vLLM's graph-padded sequences after the real ones are not read);
- num_accepted_tokens outside [1, 1 + num_spec] reads as the nearest value in that range (0 as 1,
  as vllm-xpu-kernels clamps it), in the kernels;
- nothing is read back to the host (validation "counts"; with prefills the library still reads
  non_spec_query_start_loc, gdn_xpu.h).

Per layer -- its caches, weights and settings -- the first call prepares one pygdn.PreparedCall
(config, weights and caches checked and bound once; LAYERS of them are kept, the oldest dropped
beyond); each call rebinds the step's activations and batch. The batch is made and checked once per
set of metadata tensors: vLLM passes one metadata object's tensors to the layers of a step (its
KV-cache group), and the last STEPS sets are kept. Both hold the tensors they were made from, so an
identity seen again is the same tensor. release() drops them all.

Tensors: torch XPU tensors (queue = torch.xpu.current_stream().sycl_queue unless `queue=` is given;
the call returns without waiting, ordered on that stream) or torch CPU tensors (host memory, on an
in-order queue of the SYCL CPU device unless `queue=` is given; the call waits, as vLLM's CPU kernels
return finished). Index arrays are int32, as vllm-xpu-kernels requires (vLLM converts its int64
token indices before the call; pygdn refuses int64 by name). This module imports torch only to
find an XPU tensor's stream, and vLLM, where it is installed, for its null block and conv-state layout
(_vllm_shared.vllm_conventions).
"""
from __future__ import annotations

import os

from ._vllm_shared import (STATE_8BIT_REFUSED, _cpu_queue, cpu_queue, dtype_name, prepare_layer, remember, state_8bit,
                           vllm_conventions)

XK_CONV_ENV = "GDN_XPU_XK_CONV"  # "snapshot": vllm-xpu-kernels up to 4543b580; "rolled" (default): #544 on
XK_CONV = ("rolled", "snapshot")

LAYERS = 256  # prepared layers kept (a rank's GDN layers: Qwen3-Next 36, plus the MTP layers)
STEPS = 8     # batches kept: more than a step's KV-cache groups of GDN layers
_layers: dict = {}
_steps: dict = {}
# sycl::queue* (an XPU stream's, or queue= as an int) -> its dpctl.SyclQueue, made once: torch's XPU
# streams live as long as the process, so an address names one queue
_queues: dict = {}


def release() -> None:
    """Drops the prepared layers and kept batches (and the tensors they hold)."""
    _layers.clear()
    _steps.clear()


def _dtype(t, name):
    d = dtype_name(getattr(t, "dtype", None))
    if d is None and name == "ssm_state" and state_8bit(getattr(t, "dtype", None)):
        raise TypeError(f"ssm_state: dtype {t.dtype}: {STATE_8BIT_REFUSED}")
    if d is None:
        raise TypeError(f"{name}: dtype {getattr(t, 'dtype', None)}, expected float32, float16 or bfloat16")
    return d


def _queue(t, queue):
    """The queue object of a call: queue= (the same object for the same sycl::queue*), else tensor t's
    XPU device's current stream, else the SYCL CPU queue."""
    if queue is None:
        device = t.device
        if device.type != "xpu":
            return cpu_queue()
        import torch
        queue = torch.xpu.current_stream(device).sycl_queue
    if hasattr(queue, "__index__") and not isinstance(queue, bool):
        q = _queues.get(int(queue))
        if q is None:
            from ._usm import as_queue as _as_queue
            q = _queues[int(queue)] = _as_queue(queue)
        return q
    return queue


def _xk_conv(xk_conv):
    """The spec conv layout of a layer: xk_conv, else GDN_XPU_XK_CONV, else "rolled"."""
    mode = xk_conv if xk_conv is not None else os.environ.get(XK_CONV_ENV) or "rolled"
    if mode not in XK_CONV:
        what = f"xk_conv={xk_conv!r}" if xk_conv is not None else f"{XK_CONV_ENV}={mode!r}"
        raise ValueError(f"{what}: 'rolled' (vllm-xpu-kernels #544 and later) or 'snapshot' (up to 4543b580)")
    return mode


def _prepare(q, qkvz, ba, z, core_attn_out, conv_state, ssm_state, conv_weights, conv_bias, activation, A_log,
             dt_bias, H, HV, K, V, tp_size, reorder_input, xk_conv):
    """A layer's PreparedCall: config, weights and caches bound, empty activations (each call rebinds them)."""
    import pygdn
    if activation not in ("silu", "swish"):
        raise ValueError(f"activation={activation!r}: vllm-xpu-kernels' gdn_attention takes 'silu' or 'swish'")
    if tp_size < 1 or H % tp_size or HV % tp_size:
        raise ValueError(f"tp_size={tp_size}: must divide num_k_heads={H} and num_v_heads={HV}")
    H, HV = H // tp_size, HV // tp_size
    layout = vllm_conventions()[1]
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=conv_state.shape[0],
                       conv_width=conv_weights.shape[-1], act_dtype=_dtype(qkvz, "projected_states_qkvz"),
                       state_dtype=_dtype(ssm_state, "ssm_state"), ssm_layout="vk", conv_layout=layout,
                       conv_spec_layout=_xk_conv(xk_conv),
                       conv_state_len=conv_state.shape[1 if layout == "time_major" else 2],
                       conv_slot_stride=conv_state.stride(0), ssm_slot_stride=ssm_state.stride(0),
                       packed_order="contiguous" if reorder_input else "grouped")
    return prepare_layer(q, cfg, dict(qkvz=qkvz, ba=ba, z_out=z, core_attn_out=core_attn_out),
                         conv_weight=conv_weights, conv_bias=conv_bias, A_log=A_log, dt_bias=dt_bias,
                         conv_state=conv_state, ssm_state=ssm_state)


def _batch(q, num_prefills, num_decodes, num_spec_decodes, T, has_initial_state, ns_qsl, ns_tok, ns_slots, s_qsl,
           s_tok, s_slots, accepted):
    """The step's pygdn.Batch, checked once (Batch.bind) for the queue."""
    import pygdn
    ns, sp = num_prefills + num_decodes, num_spec_decodes
    ns_count = (0 if ns == 0 else len(ns_tok) if ns_tok is not None else
                num_decodes if num_prefills == 0 and sp == 0 else None)
    sp_count = 0 if sp == 0 else len(s_tok) if s_tok is not None else None
    if ns_count is None:
        ns_count = T - (sp_count or 0)
    if sp_count is None:
        sp_count = T - ns_count
    batch = pygdn.Batch(
        num_actual_tokens=ns_count + sp_count, num_prefills=num_prefills, num_decodes=num_decodes,
        num_spec_decodes=sp, num_spec=s_slots.shape[1] - 1 if sp else 0, non_spec_token_count=ns_count,
        spec_token_count=sp_count, validate="counts", pad_slot_id=vllm_conventions()[0],
        non_spec_query_start_loc=ns_qsl if ns else None,
        non_spec_state_indices=ns_slots if ns else None, has_initial_state=has_initial_state if ns else None,
        non_spec_token_indx=ns_tok if ns else None, spec_query_start_loc=s_qsl if sp else None,
        spec_state_indices=s_slots if sp else None, num_accepted_tokens=accepted if sp else None,
        spec_token_indx=s_tok if sp else None)
    return batch.bind(q)


def gdn_attention(core_attn_out, z, projected_states_qkvz, projected_states_ba, num_k_heads, num_v_heads, head_k_dim,
                  head_v_dim, conv_state, ssm_state, conv_weights, conv_bias, activation, A_log, dt_bias, num_prefills,
                  num_decodes, num_spec_decodes, has_initial_state, non_spec_query_start_loc, non_spec_token_indx,
                  non_spec_state_indices_tensor, spec_query_start_loc, spec_token_indx, spec_state_indices_tensor,
                  num_accepted_tokens, num_actual_tokens, tp_size, reorder_input, *, queue=None,
                  xk_conv=None) -> None:
    """torch.ops._xpu_C.gdn_attention's arguments; writes core_attn_out, z and the caches. xk_conv: the
    spec conv convention, "rolled" or "snapshot" (None: GDN_XPU_XK_CONV, else "rolled")."""
    if queue is None and _cpu_queue and projected_states_qkvz.is_cpu:
        q = _cpu_queue[0]
    else:
        q = _queue(projected_states_qkvz, queue)
    # The layer: its tensors by identity (held by the entry, so never another's id); the conv weights,
    # which vLLM views anew at every call, by address and shape.
    key = (id(q), id(conv_state), id(ssm_state), conv_weights.data_ptr(), conv_weights.shape, id(conv_bias), id(A_log),
           id(dt_bias), projected_states_qkvz.dtype, num_k_heads, num_v_heads, head_k_dim, head_v_dim, activation,
           tp_size, reorder_input, xk_conv)
    layer = _layers.get(key)
    if layer is None:
        call = _prepare(q, projected_states_qkvz, projected_states_ba, z, core_attn_out, conv_state, ssm_state,
                        conv_weights, conv_bias, activation, A_log, dt_bias, num_k_heads, num_v_heads, head_k_dim,
                        head_v_dim, tp_size, reorder_input, xk_conv)
        # (the call's wait: XPU tensors are ordered on torch's stream, host tensors are read by host
        # code right after the call, as after vLLM's own CPU kernels)
        wait = conv_state.device.type != "xpu"
        layer = remember(_layers, key, (call, wait, q, conv_state, ssm_state, conv_bias, A_log, dt_bias), LAYERS)
    # The step: its metadata tensors by identity (held by the batch).
    meta = (id(q), num_prefills, num_decodes, num_spec_decodes, num_actual_tokens, id(has_initial_state),
            id(non_spec_query_start_loc), id(non_spec_token_indx), id(non_spec_state_indices_tensor),
            id(spec_query_start_loc), id(spec_token_indx), id(spec_state_indices_tensor), id(num_accepted_tokens))
    batch = _steps.get(meta)
    if batch is None:
        batch = remember(_steps, meta, _batch(q, num_prefills, num_decodes, num_spec_decodes, num_actual_tokens,
                                              has_initial_state, non_spec_query_start_loc, non_spec_token_indx,
                                              non_spec_state_indices_tensor, spec_query_start_loc, spec_token_indx,
                                              spec_state_indices_tensor, num_accepted_tokens), STEPS)
    layer[0]._run_step(batch, layer[1], dict(qkvz=projected_states_qkvz, ba=projected_states_ba, z_out=z,
                                             core_attn_out=core_attn_out))
