# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vllm-xpu-kernels' own gdn_attention tests, run through pygdn.vllm_xpu.gdn_attention on torch CPU
tensors, with their arguments unchanged.

Ported from github.com/vllm-project/vllm-xpu-kernels at commit
4543b580fecca68a7dd54ddaf6e444dc5f11a6a4 (2026-08-21), Apache-2.0:
- tests/gdn_attn/test_gdn_attn.py: the references ref_gdn_attention, _extract_qkv_b_a_z and
  ref_gdn_attention_spec and the helper simple_random_distribute, verbatim; the input builders and
  checks of test_gdn_attention_legacy, test_gdn_attention_mtp, test_gdn_attention_mixed_spec_non_spec,
  test_gdn_attention_gqa_ratio3_prefill, test_chunk_prepare_vhead_oob_guard and
  test_causal_conv1d_conv_elems_oob_guard;
- tests/gdn_attn/test_gdn_attn_padded.py: _build_inputs and
  test_gdn_attention_accepts_padded_leading_dim.
What differs from theirs: device "cpu" for "xpu"; the op called is pygdn.vllm_xpu.gdn_attention, with
the arguments of their torch.ops._xpu_C.gdn_attention call as they write them (the first eight by
position, the rest by keyword, as vLLM calls it); where theirs calls the split ops
(causal_conv1d_spec + gated_delta_rule_spec, the *_non_spec pair), this calls the fused op with the
same arguments (the others None, as vLLM passes them); the tensors their tests draw alike, the calls
they write alike and the checks their MTP and mixed tests share are written once here
(_layer_tensors, _dropin, _reference, _spec_reference, _check_outputs_and_spec_slots), with the same
values and arguments, and their three single-prefill tests are one; the parameter grids are cut to
cases that cover both reorder_input values, f16 and bf16, an SSM state in f32 and in the activation
dtype, non-spec / MTP / mixed batches, GQA 3, HV = 48, tp_size 2 and 4 and padded leading dims
(their NUM_TOKENS' 8192 is left out: the float64-free torch reference walks it token by token); their
cache slots are drawn from 1 on (block 0 is vLLM's null block, which the drop-in treats as padding and
vLLM never gives a request).

Their tests are of vllm-xpu-kernels at 4543b580, whose spec sequences keep one conv window per token in
that token's block ("snapshot"): every test here runs with GDN_XPU_XK_CONV=snapshot. The MTP and mixed
tests also run in the drop-in's default convention, vllm-xpu-kernels #544's ("rolled", xk_conv="rolled"):
the same call on the conv cache as vLLM allocates it then (W - 1 + num_spec rows), each spec sequence's
line in its column-0 block holding, at rows A-1 .., the window their reference reads; outputs and SSM
slots are checked against their reference as they are, and the line afterwards holds, at rows K-1 ..,
the window their reference stores for the last of the K tokens (what vLLM's get_conv_copy_spec copies
from row A-1 on, A = K).
Needs torch (tests/setup_and_run.sh integration runs this file; the suite skips it without torch).
"""

import math
import random

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
import torch.nn.functional as F  # noqa: E402

from pygdn import vllm_xpu  # noqa: E402


@pytest.fixture(autouse=True)
def _forget_layers(monkeypatch):
    """Each case's caches and weights are a layer of their own: drop the prepared layers after it. Their
    conv convention (vllm-xpu-kernels at 4543b580): snapshot."""
    monkeypatch.setenv(vllm_xpu.XK_CONV_ENV, "snapshot")
    yield
    vllm_xpu.release()


# ----------------------------------------------------------------------------- their references, verbatim
def ref_gdn_attention(
    core_attn_out,
    z,
    projected_states_qkvz,
    projected_states_ba,
    num_k_heads,
    num_v_heads,
    head_k_dim,
    head_v_dim,
    conv_state,
    ssm_state,
    conv_weights,
    conv_bias,
    activation,
    A_log,
    dt_bias,
    num_prefills,
    num_decodes,
    has_initial_state,
    non_spec_query_start_loc,
    non_spec_state_indices_tensor,
    num_actual_tokens,
    tp_size,
    reorder_input,
):
    eps = 0.000001
    scale = 1.0 / math.sqrt(head_k_dim)
    dtype = projected_states_qkvz.dtype
    batch_size = non_spec_query_start_loc.shape[0] - 1

    qkv, b, a, z_global = _extract_qkv_b_a_z(
        projected_states_qkvz, projected_states_ba, num_actual_tokens,
        num_k_heads, num_v_heads, head_k_dim, head_v_dim, tp_size,
        reorder_input)
    qkv_elems_size = qkv.shape[-1]
    z.copy_(z_global)

    A_log_exp = -torch.exp(A_log)
    softplus = torch.nn.Softplus(beta=1.0, threshold=20.0)
    if conv_bias is not None:
        conv_bias = conv_bias.to(torch.float)

    for batch in range(batch_size):
        if has_initial_state[batch]:
            conv_state_batch = conv_state[non_spec_state_indices_tensor[batch]]
        else:
            conv_state_batch = torch.zeros_like(conv_state[0])

        batch_start_id = non_spec_query_start_loc[batch]
        batch_end_id = non_spec_query_start_loc[batch + 1]
        batch_num_tokens = batch_end_id - batch_start_id

        qkv_batch = qkv[batch_start_id:batch_end_id]
        qkv_conv_input = torch.cat([conv_state_batch, qkv_batch], dim=0)
        conv_state[non_spec_state_indices_tensor[batch]] = qkv_conv_input[
            batch_num_tokens:]

        qkv_conv_input = qkv_conv_input.transpose(0, 1).unsqueeze(0)

        qkv_conv_out = F.conv1d(qkv_conv_input.to(torch.float32),
                                conv_weights.unsqueeze(1).to(torch.float32),
                                conv_bias,
                                padding=0,
                                groups=qkv_elems_size)
        qkv_conv_out = (qkv_conv_out if activation is None else
                        F.silu(qkv_conv_out)).to(dtype=dtype)
        qkv_conv_out = qkv_conv_out.transpose(-2, -1).reshape(
            batch_num_tokens, qkv_elems_size)

        split_arg_list_qkv = [
            num_k_heads // tp_size * head_k_dim,
            num_k_heads // tp_size * head_k_dim,
            num_k_heads // tp_size * num_v_heads // num_k_heads * head_v_dim,
        ]
        (q_out, k_out, v_out) = torch.split(qkv_conv_out,
                                            split_arg_list_qkv,
                                            dim=-1)
        q_out = q_out.reshape(batch_num_tokens, num_k_heads // tp_size,
                              head_k_dim)
        k_out = k_out.reshape(batch_num_tokens, num_k_heads // tp_size,
                              head_k_dim)
        v_out = v_out.reshape(batch_num_tokens, num_v_heads // tp_size,
                              head_v_dim)

        if has_initial_state[batch]:
            ssm_state_batch = ssm_state[
                non_spec_state_indices_tensor[batch]].to(
                    torch.float32
                )  # [num_v_heads // tp_size, head_v_dim, head_k_dim]
        else:
            ssm_state_batch = torch.zeros_like(ssm_state[0],
                                               dtype=torch.float32)

        # ------------------------------------------------------------------
        # Hoist all per-token elementwise work out of the recurrence loop.
        # Only the SSM state update itself is sequential.
        # ------------------------------------------------------------------
        rep = num_v_heads // num_k_heads
        b_batch = b[batch_start_id:batch_end_id].to(
            torch.float32)  # [T, NV]
        a_batch = a[batch_start_id:batch_end_id].to(torch.float32)
        beta_batch = torch.sigmoid(b_batch)  # [T, NV]
        g_batch = torch.exp(A_log_exp *
                            softplus(a_batch + dt_bias))  # [T, NV]

        q_all = q_out.to(torch.float32)  # [T, NK, Hk]
        k_all = k_out.to(torch.float32)
        v_all = v_out.to(torch.float32)  # [T, NV, Hv]

        # l2norm along head dim, then scale q.
        q_all = q_all * torch.rsqrt(q_all.pow(2).sum(-1, keepdim=True) + eps)
        k_all = k_all * torch.rsqrt(k_all.pow(2).sum(-1, keepdim=True) + eps)
        q_all = q_all * scale

        # GQA: replicate K/Q heads NK -> NV.
        if rep > 1:
            q_all = q_all.repeat_interleave(rep, dim=1)  # [T, NV, Hk]
            k_all = k_all.repeat_interleave(rep, dim=1)

        out_buf = torch.empty(batch_num_tokens,
                              num_v_heads // tp_size,
                              head_v_dim,
                              dtype=torch.float32,
                              device=core_attn_out.device)

        # O(t) = S(t) * q(t)
        # S(t) = g(t)*S(t - 1) + (v(t) - g(t)*S(t - 1)*k(t))*beta(t)*k(t)
        for token_id in range(batch_num_tokens):
            g_t = g_batch[token_id]  # [NV]
            beta_t = beta_batch[token_id]  # [NV]
            q_t = q_all[token_id]  # [NV, Hk]
            k_t = k_all[token_id]  # [NV, Hk]
            v_t = v_all[token_id]  # [NV, Hv]

            ssm_state_batch *= g_t.unsqueeze(-1).unsqueeze(-1)

            # kv_mem_t[v, h] = sum_k S[v, h, k] * k_t[v, k]
            kv_mem_t = torch.einsum("vhk,vk->vh", ssm_state_batch, k_t)
            delta_t = (v_t - kv_mem_t) * beta_t.unsqueeze(-1)  # [NV, Hv]

            # outer product update: S[v, h, k] += delta[v, h] * k_t[v, k]
            ssm_state_batch.add_(
                torch.einsum("vh,vk->vhk", delta_t, k_t))

            out_buf[token_id] = torch.einsum("vhk,vk->vh", ssm_state_batch,
                                             q_t)

        core_attn_out[batch_start_id:batch_end_id] = out_buf.to(dtype)
        ssm_state[non_spec_state_indices_tensor[batch]] = ssm_state_batch.to(
            ssm_state.dtype)


def simple_random_distribute(N, batch_size):
    distribution = torch.ones([batch_size])
    for i in range(N - batch_size):
        selected_idx = random.randint(0, batch_size - 1)
        distribution[selected_idx] += 1

    return distribution




def _extract_qkv_b_a_z(projected_states_qkvz, projected_states_ba,
                       num_actual_tokens, num_k_heads, num_v_heads,
                       head_k_dim, head_v_dim, tp_size, reorder_input):
    """Replicate the qkv/ba split done in `ref_gdn_attention` and return
    the post-reorder qkv (for conv1d), b, a, z tensors plus split sizes."""
    if reorder_input:
        key_dim = head_k_dim * num_k_heads
        value_dim = head_v_dim * num_v_heads
        q_size = key_dim // tp_size
        k_size = q_size
        v_size = value_dim // tp_size
        z_size = v_size
        q_tmp, k_tmp, v_tmp, z_tmp = projected_states_qkvz.split(
            [q_size, k_size, v_size, z_size], dim=-1)
        q_tmp = q_tmp.reshape(q_tmp.size(0), -1, head_k_dim)
        k_tmp = k_tmp.reshape(k_tmp.size(0), -1, head_k_dim)
        v_tmp = v_tmp.reshape(v_tmp.size(0), -1,
                              num_v_heads // num_k_heads * head_v_dim)
        z_tmp = z_tmp.reshape(z_tmp.size(0), -1,
                              num_v_heads // num_k_heads * head_v_dim)
        projected_states_qkvz = torch.cat(
            [q_tmp, k_tmp, v_tmp, z_tmp],
            dim=-1).reshape(q_tmp.size(0), -1).contiguous()

        b, a = projected_states_ba.chunk(2, dim=-1)
        b = b.reshape(b.size(0), -1, num_v_heads // num_k_heads)
        a = a.reshape(a.size(0), -1, num_v_heads // num_k_heads)
        projected_states_ba = torch.cat(
            [b, a], dim=-1).reshape(b.size(0), -1).contiguous()

    projected_states_ba = projected_states_ba.reshape(
        num_actual_tokens, num_k_heads // tp_size,
        (2 * num_v_heads // num_k_heads))
    b, a = torch.split(
        projected_states_ba,
        [num_v_heads // num_k_heads, num_v_heads // num_k_heads],
        dim=-1)
    b = b.reshape(num_actual_tokens, num_v_heads // tp_size)
    a = a.reshape(num_actual_tokens, num_v_heads // tp_size)

    split_qkvz = [
        head_k_dim,
        head_k_dim,
        num_v_heads // num_k_heads * head_v_dim,
        num_v_heads // num_k_heads * head_v_dim,
    ]
    projected_states_qkvz = projected_states_qkvz.reshape(
        num_actual_tokens, num_k_heads // tp_size,
        (2 * head_k_dim + 2 * num_v_heads // num_k_heads * head_v_dim))
    q_split, k_split, v_split, z_split = torch.split(
        projected_states_qkvz, split_qkvz, dim=-1)
    q_split = q_split.reshape(num_actual_tokens,
                              num_k_heads // tp_size * head_k_dim)
    k_split = k_split.reshape(num_actual_tokens,
                              num_k_heads // tp_size * head_k_dim)
    v_split = v_split.reshape(
        num_actual_tokens,
        num_k_heads // tp_size * num_v_heads // num_k_heads * head_v_dim)
    qkv = torch.cat((q_split, k_split, v_split), dim=-1).reshape(
        num_actual_tokens,
        num_k_heads // tp_size *
        (2 * head_k_dim + num_v_heads // num_k_heads * head_v_dim))
    z_global = z_split.reshape(num_actual_tokens, num_v_heads // tp_size,
                               head_v_dim)
    return qkv, b, a, z_global


def ref_gdn_attention_spec(
    core_attn_out,
    z,
    projected_states_qkvz,
    projected_states_ba,
    num_k_heads,
    num_v_heads,
    head_k_dim,
    head_v_dim,
    conv_state,
    ssm_state,
    conv_weights,
    conv_bias,
    activation,
    A_log,
    dt_bias,
    num_spec_decodes,
    spec_query_start_loc,
    spec_token_indx,
    spec_state_indices_tensor,
    num_accepted_tokens,
    num_actual_tokens,
    tp_size,
    reorder_input,
):
    """Spec-decode reference. Mirrors the non-spec ref but routes gather/
    scatter through spec_token_indx and writes per-step ssm-state + final
    conv-state into spec_state_indices_tensor."""
    eps = 0.000001
    scale = 1.0 / math.sqrt(head_k_dim)
    dtype = projected_states_qkvz.dtype
    width = conv_weights.shape[-1]
    rep = num_v_heads // num_k_heads
    K = spec_state_indices_tensor.shape[1]
    qkv_elems_size = num_k_heads // tp_size * (
        2 * head_k_dim + num_v_heads // num_k_heads * head_v_dim)

    qkv, b, a, z_global = _extract_qkv_b_a_z(
        projected_states_qkvz, projected_states_ba, num_actual_tokens,
        num_k_heads, num_v_heads, head_k_dim, head_v_dim, tp_size,
        reorder_input)

    # Scatter z into output at the spec token positions.
    spec_indx_long = spec_token_indx.to(torch.long)
    z[spec_indx_long] = z_global[spec_indx_long]

    A_log_exp = -torch.exp(A_log)
    softplus = torch.nn.Softplus(beta=1.0, threshold=20.0)
    conv_bias_f = (conv_bias.to(torch.float)
                   if conv_bias is not None else None)

    split_qkv = [
        num_k_heads // tp_size * head_k_dim,
        num_k_heads // tp_size * head_k_dim,
        num_k_heads // tp_size * num_v_heads // num_k_heads * head_v_dim,
    ]

    for n in range(num_spec_decodes):
        start = int(spec_query_start_loc[n].item())
        end = int(spec_query_start_loc[n + 1].item())
        assert end - start == K, (end - start, K)
        globals_ = spec_token_indx[start:end].to(torch.long)

        naccepted = int(num_accepted_tokens[n].item())
        init_col = max(naccepted - 1, 0)
        init_slot = int(spec_state_indices_tensor[n, init_col].item())
        final_conv_slot = int(spec_state_indices_tensor[n, K - 1].item())

        # ---- conv1d on the K gathered tokens (with Width-1 history) ----
        conv_state_batch = conv_state[init_slot].clone()
        qkv_batch = qkv[globals_]  # [K, qkv_elems]
        qkv_conv_input = torch.cat([conv_state_batch, qkv_batch], dim=0)
        # Final conv state goes ONLY to the last cache slot.
        conv_state[final_conv_slot] = qkv_conv_input[-(width - 1):]

        qkv_conv_in = qkv_conv_input.transpose(0, 1).unsqueeze(0).to(
            torch.float32)
        qkv_conv_out = F.conv1d(qkv_conv_in,
                                conv_weights.unsqueeze(1).to(torch.float32),
                                conv_bias_f,
                                padding=0,
                                groups=qkv_elems_size)
        qkv_conv_out = (qkv_conv_out if activation is None else
                        F.silu(qkv_conv_out)).to(dtype=dtype)
        qkv_conv_out = qkv_conv_out.transpose(-2, -1).reshape(
            K, qkv_elems_size)

        q_out, k_out, v_out = torch.split(qkv_conv_out, split_qkv, dim=-1)
        q_out = q_out.reshape(K, num_k_heads // tp_size, head_k_dim)
        k_out = k_out.reshape(K, num_k_heads // tp_size, head_k_dim)
        v_out = v_out.reshape(K, num_v_heads // tp_size, head_v_dim)

        # ---- SSM recurrence (same as non-spec, just per-step writeback) ----
        ssm_state_batch = ssm_state[init_slot].to(torch.float32).clone()

        b_batch = b[globals_].to(torch.float32)
        a_batch = a[globals_].to(torch.float32)
        beta_batch = torch.sigmoid(b_batch)
        g_batch = torch.exp(A_log_exp * softplus(a_batch + dt_bias))

        q_all = q_out.to(torch.float32)
        k_all = k_out.to(torch.float32)
        v_all = v_out.to(torch.float32)
        q_all = q_all * torch.rsqrt(q_all.pow(2).sum(-1, keepdim=True) + eps)
        k_all = k_all * torch.rsqrt(k_all.pow(2).sum(-1, keepdim=True) + eps)
        q_all = q_all * scale
        if rep > 1:
            q_all = q_all.repeat_interleave(rep, dim=1)
            k_all = k_all.repeat_interleave(rep, dim=1)

        for t in range(K):
            g_t = g_batch[t]
            beta_t = beta_batch[t]
            q_t = q_all[t]
            k_t = k_all[t]
            v_t = v_all[t]

            ssm_state_batch *= g_t.unsqueeze(-1).unsqueeze(-1)
            kv_mem_t = torch.einsum("vhk,vk->vh", ssm_state_batch, k_t)
            delta_t = (v_t - kv_mem_t) * beta_t.unsqueeze(-1)
            ssm_state_batch.add_(torch.einsum("vh,vk->vhk", delta_t, k_t))

            out_t = torch.einsum("vhk,vk->vh", ssm_state_batch, q_t).to(dtype)
            core_attn_out[globals_[t]] = out_t
            # Per-step ssm-state writeback to cache_indices[n, t].
            ssm_state[int(spec_state_indices_tensor[n, t].item())] = (
                ssm_state_batch.to(ssm_state.dtype))



# ----------------------------------------------------------------------------- their tests, ported
def _layer_tensors(tokens, num_k_heads, num_v_heads, head_k_dim, head_v_dim, width, tp_size, cache_batch_size,
                   dtype, ssm_state_dtype, has_bias, device):
    """Their tests' projections, caches (with the reference's copies) and layer parameters, drawn in
    their order: (projected_states_qkvz, projected_states_ba, conv_state, ref_conv_state, ssm_state,
    ref_ssm_state, conv_weights, conv_bias, A_log, dt_bias)."""
    mixed_qkvz_size = num_k_heads // tp_size * (
        2 * head_k_dim + 2 * head_v_dim * num_v_heads // num_k_heads)
    mixed_ba_size = num_k_heads // tp_size * (2 * num_v_heads // num_k_heads)
    mixed_qkv_size = num_k_heads // tp_size * (
        2 * head_k_dim + head_v_dim * num_v_heads // num_k_heads)
    projected_states_qkvz = torch.randn((tokens, mixed_qkvz_size), dtype=dtype, device=device)
    projected_states_ba = torch.randn((tokens, mixed_ba_size), dtype=dtype, device=device)
    conv_state = torch.randn((cache_batch_size, width - 1, mixed_qkv_size), dtype=dtype, device=device)
    ssm_state = torch.randn((cache_batch_size, num_v_heads // tp_size, head_v_dim, head_k_dim),
                            dtype=ssm_state_dtype, device=device)
    conv_weights = torch.randn((mixed_qkv_size, width), dtype=dtype, device=device)
    conv_bias = torch.randn((mixed_qkv_size), dtype=dtype, device=device) if has_bias else None
    A_log = torch.randn((num_v_heads // tp_size), dtype=torch.float32, device=device)
    dt_bias = torch.randn((num_v_heads // tp_size), dtype=dtype, device=device)
    return (projected_states_qkvz, projected_states_ba, conv_state, conv_state.clone(), ssm_state, ssm_state.clone(),
            conv_weights, conv_bias, A_log, dt_bias)


ATOL = RTOL = 5e-2  # their tests' tolerance, on every output and cache slot they compare

# Their torch.ops._xpu_C.gdn_attention calls pass these by keyword, in this order (the first
# eight by position); and their ref_gdn_attention calls these.
_DROPIN_KWARGS = ("conv_state", "ssm_state", "conv_weights", "conv_bias", "activation", "A_log", "dt_bias",
                  "num_prefills", "num_decodes", "num_spec_decodes", "has_initial_state",
                  "non_spec_query_start_loc", "non_spec_token_indx", "non_spec_state_indices_tensor",
                  "spec_query_start_loc", "spec_token_indx", "spec_state_indices_tensor", "num_accepted_tokens",
                  "num_actual_tokens", "tp_size", "reorder_input")
_REFERENCE_KWARGS = ("conv_weights", "conv_bias", "activation", "A_log", "dt_bias", "num_prefills", "num_decodes",
                     "has_initial_state", "non_spec_query_start_loc", "non_spec_state_indices_tensor",
                     "num_actual_tokens", "tp_size", "reorder_input")
# What their calls of a batch without spec sequences, or of spec sequences only, pass for the other group
_NON_SPEC_ONLY = dict(num_spec_decodes=0, non_spec_token_indx=None, spec_query_start_loc=None, spec_token_indx=None,
                      spec_state_indices_tensor=None, num_accepted_tokens=None)
_SPEC_ONLY = dict(num_prefills=0, num_decodes=0, has_initial_state=None, non_spec_query_start_loc=None,
                  non_spec_token_indx=None, non_spec_state_indices_tensor=None)


def _dropin(core_attn_out, z, projected_states_qkvz, projected_states_ba, v, **given):
    """pygdn.vllm_xpu.gdn_attention called as their tests call torch.ops._xpu_C.gdn_attention: the
    first eight arguments by position, the rest by keyword, each the test's variable of that name
    (v: its locals, or its argument dict) unless given; in the rolled convention (v["rolled"] given) on
    that conv cache."""
    if v.get("rolled") is not None:
        given = dict(given, conv_state=v["rolled"], xk_conv="rolled")
    vllm_xpu.gdn_attention(core_attn_out, z, projected_states_qkvz, projected_states_ba, v["num_k_heads"],
                           v["num_v_heads"], v["head_k_dim"], v["head_v_dim"],
                           **{k: given[k] if k in given else v[k] for k in _DROPIN_KWARGS},
                           **({"xk_conv": given["xk_conv"]} if "xk_conv" in given else {}))


def _as_rolled(conv, conv_state, spec_state_indices_tensor, num_accepted_tokens):
    """conv "rolled": their conv cache as vLLM allocates it for vllm-xpu-kernels #544, W - 1 + num_spec
    rows: rows 0..W-2 theirs, the rest random, and each spec sequence's line (block [n][0]) holding at rows
    A-1 .. A+W-3 the window their reference reads (block [n][A-1], A clamped to [1, 1 + num_spec] as
    both read it). conv "snapshot": None (their cache as it is)."""
    if conv == "snapshot":
        return None
    slots, w1, dim = conv_state.shape
    cols = spec_state_indices_tensor.shape[1]
    rolled = torch.randn(slots, w1 + cols - 1, dim, dtype=conv_state.dtype)
    rolled[:, :w1] = conv_state
    for n in range(spec_state_indices_tensor.shape[0]):
        a = min(max(int(num_accepted_tokens[n]), 1), cols)
        rolled[int(spec_state_indices_tensor[n, 0]), a - 1:a - 1 + w1] = conv_state[int(spec_state_indices_tensor[n, a - 1])]
    return rolled


def _conv_slot(v, slot):
    """A slot's conv window as their checks compare it: rows 0..W-2 of the rolled cache in the rolled runs."""
    rolled = v.get("rolled")
    return v["conv_state"][slot] if rolled is None else rolled[slot, :v["conv_state"].shape[1]]


def _reference(ref_core_attn_out, ref_z, projected_states_qkvz, projected_states_ba, v, **given):
    """ref_gdn_attention as their tests call it: on the reference's copies of the caches
    (ref_conv_state, ref_ssm_state), the other arguments the test's variables unless given."""
    ref_gdn_attention(ref_core_attn_out, ref_z, projected_states_qkvz, projected_states_ba, v["num_k_heads"],
                      v["num_v_heads"], v["head_k_dim"], v["head_v_dim"], conv_state=v["ref_conv_state"],
                      ssm_state=v["ref_ssm_state"], **{k: given[k] if k in given else v[k] for k in _REFERENCE_KWARGS})


def _tc(val):
    return repr(val).split(".")[1] if isinstance(val, torch.dtype) else str(val)


# (num_actual_tokens, tp_size, has_bias, mode, reorder_input, dtype, ssm_state_is_fp32); batch_size 32, heads
# and dims of theirs (Qwen3-Next: 16 k-heads, 32 v-heads, K = V = 128, width 4).
LEGACY_CASES = [
    (1, 1, False, "prefill", False, torch.float16, True),
    (32, 1, True, "decode", True, torch.bfloat16, False),
    (32, 2, True, "mix_mode", False, torch.float16, False),
    (1024, 1, False, "mix_mode", True, torch.bfloat16, True),
]


@pytest.mark.parametrize("num_actual_tokens,tp_size,has_bias,mode,reorder_input,dtype,ssm_state_is_fp32",
                         LEGACY_CASES, ids=["-".join(map(_tc, c)) for c in LEGACY_CASES])
@torch.inference_mode()
def test_gdn_attention_legacy(num_actual_tokens, tp_size, has_bias, mode, reorder_input, dtype, ssm_state_is_fp32):
    batch_size, num_k_heads, head_k_dim, num_v_heads, head_v_dim, width, activation = 32, 16, 128, 32, 128, 4, "silu"
    device = "cpu"
    random.seed(42)
    torch.manual_seed(42)
    ssm_state_dtype = torch.float32 if ssm_state_is_fp32 else dtype

    assert head_k_dim == head_v_dim

    if batch_size > num_actual_tokens:
        batch_size = num_actual_tokens

    if mode == "prefill":
        num_prefills = batch_size
    elif mode == "decode":
        num_prefills = 0
        if batch_size < num_actual_tokens:
            return
    else:
        num_prefills = random.randint(1, batch_size -
                                      1) if batch_size > 1 else 1

    num_decodes = batch_size - num_prefills
    cache_batch_size = 200

    (projected_states_qkvz, projected_states_ba, conv_state, ref_conv_state, ssm_state, ref_ssm_state, conv_weights,
     conv_bias, A_log, dt_bias) = _layer_tensors(num_actual_tokens, num_k_heads, num_v_heads, head_k_dim, head_v_dim, width, tp_size,
                                                 cache_batch_size, dtype, ssm_state_dtype, has_bias, device)

    prefill_batches = simple_random_distribute(num_actual_tokens - num_decodes,
                                               batch_size - num_decodes)
    token_batches = torch.cat([torch.ones([num_decodes]),
                               prefill_batches]).to(device)
    perm = torch.randperm(token_batches.size(0)).to(device)
    shuffled_tensor = token_batches[perm]
    non_spec_query_start_loc = torch.cat([
        torch.zeros([1], device=device),
        torch.cumsum(shuffled_tensor, dim=0)
    ]).to(torch.int32)
    has_initial_state = perm >= num_decodes
    non_spec_state_indices_tensor = torch.tensor(random.sample(
        range(1, cache_batch_size), batch_size),
                                                 device=device,
                                                 dtype=torch.int32)

    core_attn_out = torch.zeros(
        (num_actual_tokens, num_v_heads // tp_size, head_v_dim),
        dtype=dtype,
        device=device,
    )
    z = torch.empty_like(core_attn_out)

    _dropin(core_attn_out, z, projected_states_qkvz, projected_states_ba, locals(), **_NON_SPEC_ONLY)

    ref_core_attn_out = torch.zeros_like(core_attn_out)
    ref_z = torch.empty_like(core_attn_out)

    _reference(ref_core_attn_out, ref_z, projected_states_qkvz, projected_states_ba, locals())

    _check_outputs(core_attn_out, z, ref_core_attn_out, ref_z)
    for i in range(batch_size):
        state_id = non_spec_state_indices_tensor[i]
        torch.testing.assert_close(conv_state[state_id],
                                   ref_conv_state[state_id],
                                   atol=ATOL,
                                   rtol=RTOL)
        torch.testing.assert_close(ssm_state[state_id],
                                   ref_ssm_state[state_id],
                                   atol=ATOL,
                                   rtol=RTOL)


# (num_spec_decodes, num_spec_tokens, has_bias, reorder_input, dtype, ssm_state_is_fp32); heads as theirs.
MTP_CASES = [
    (4, 3, True, False, torch.bfloat16, True),
    (1, 2, False, True, torch.float16, False),
    (4, 2, False, True, torch.bfloat16, False),
]


def _spec_reference(ref_core_attn_out, ref_z, v):
    """Their spec reference as the MTP and mixed tests call it, on the test's tensors (v: its locals)."""
    ref_gdn_attention_spec(
        ref_core_attn_out,
        ref_z,
        v["projected_states_qkvz"],
        v["projected_states_ba"],
        v["num_k_heads"],
        v["num_v_heads"],
        v["head_k_dim"],
        v["head_v_dim"],
        conv_state=v["ref_conv_state"],
        ssm_state=v["ref_ssm_state"],
        conv_weights=v["conv_weights"],
        conv_bias=v["conv_bias"],
        activation=v["activation"],
        A_log=v["A_log"],
        dt_bias=v["dt_bias"],
        num_spec_decodes=v["num_spec_decodes"],
        spec_query_start_loc=v["spec_query_start_loc"],
        spec_token_indx=v["spec_token_indx"],
        spec_state_indices_tensor=v["spec_state_indices_tensor"],
        num_accepted_tokens=v["num_accepted_tokens"],
        num_actual_tokens=v["num_actual_tokens"],
        tp_size=v["tp_size"],
        reorder_input=v["reorder_input"],
    )


def _check_outputs(core_attn_out, z, ref_core_attn_out, ref_z):
    """Their checks of the outputs (z, then core_attn_out, NaN matching NaN)."""
    torch.testing.assert_close(z, ref_z, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(core_attn_out,
                               ref_core_attn_out,
                               atol=ATOL,
                               rtol=RTOL,
                               equal_nan=True)


def _check_outputs_and_spec_slots(core_attn_out, z, ref_core_attn_out, ref_z, v):
    """Their checks of the MTP and mixed tests: outputs, then each spec sequence's final conv slot
    (column K-1) and all K per-step SSM slots (v: the test's locals)."""
    _check_outputs(core_attn_out, z, ref_core_attn_out, ref_z)

    conv_state, ref_conv_state, ssm_state, ref_ssm_state = (v["conv_state"], v["ref_conv_state"], v["ssm_state"],
                                                            v["ref_ssm_state"])
    spec_state_indices_tensor, K = v["spec_state_indices_tensor"], v["K"]
    for n in range(v["num_spec_decodes"]):
        final_slot = int(spec_state_indices_tensor[n, K - 1].item())
        if v.get("rolled") is not None:  # the line: the last token's window at rows K-1 .. K+W-3
            line, w1 = v["rolled"][int(spec_state_indices_tensor[n, 0])], conv_state.shape[1]
            torch.testing.assert_close(line[K - 1:K - 1 + w1], ref_conv_state[final_slot], atol=ATOL, rtol=RTOL)
        else:
            torch.testing.assert_close(conv_state[final_slot],
                                       ref_conv_state[final_slot],
                                       atol=ATOL,
                                       rtol=RTOL)
        for t in range(K):
            slot = int(spec_state_indices_tensor[n, t].item())
            torch.testing.assert_close(ssm_state[slot],
                                       ref_ssm_state[slot],
                                       atol=ATOL,
                                       rtol=RTOL)


@pytest.mark.parametrize("conv", ["snapshot", "rolled"])
@pytest.mark.parametrize("num_spec_decodes,num_spec_tokens,has_bias,reorder_input,dtype,ssm_state_is_fp32",
                         MTP_CASES, ids=["-".join(map(_tc, c)) for c in MTP_CASES])
@torch.inference_mode()
def test_gdn_attention_mtp(num_spec_decodes, num_spec_tokens, has_bias, reorder_input, dtype, ssm_state_is_fp32, conv):
    """Pure spec-decode batch: num_prefills == num_decodes == 0,
    num_spec_decodes sequences each contributing num_spec_tokens tokens.
    Token positions are shuffled in the global buffer via spec_token_indx
    so the kernel's gather/scatter is exercised."""
    num_k_heads, head_k_dim, num_v_heads, head_v_dim, width, tp_size, activation = 16, 128, 32, 128, 4, 1, "silu"
    device = "cpu"
    random.seed(123)
    torch.manual_seed(123)
    ssm_state_dtype = torch.float32 if ssm_state_is_fp32 else dtype

    assert head_k_dim == head_v_dim
    K = num_spec_tokens
    num_actual_tokens = num_spec_decodes * K
    cache_batch_size = 200

    (projected_states_qkvz, projected_states_ba, conv_state, ref_conv_state, ssm_state, ref_ssm_state, conv_weights,
     conv_bias, A_log, dt_bias) = _layer_tensors(num_actual_tokens, num_k_heads, num_v_heads, head_k_dim, head_v_dim, width, tp_size,
                                                 cache_batch_size, dtype, ssm_state_dtype, has_bias, device)

    # Each spec seq owns K consecutive cache slots (cols 0..K-1).
    state_slots = random.sample(range(1, cache_batch_size), num_spec_decodes * K)
    spec_state_indices_tensor = torch.tensor(state_slots,
                                             dtype=torch.int32,
                                             device=device).reshape(
                                                 num_spec_decodes, K)
    # Mix of acceptance counts including the 0 edge case.
    num_accepted_tokens = torch.tensor(
        [random.randint(0, K) for _ in range(num_spec_decodes)],
        dtype=torch.int32,
        device=device)

    # Shuffle global token positions across the K-tokens-per-seq layout.
    perm = torch.randperm(num_actual_tokens, device=device).to(torch.int32)
    spec_token_indx = perm.contiguous()
    spec_query_start_loc = (torch.arange(
        num_spec_decodes + 1, dtype=torch.int32, device=device) * K)
    rolled = _as_rolled(conv, conv_state, spec_state_indices_tensor, num_accepted_tokens)

    core_attn_out = torch.zeros(num_actual_tokens,
                                num_v_heads // tp_size,
                                head_v_dim,
                                dtype=dtype,
                                device=device)
    z = torch.zeros_like(core_attn_out)

    # (theirs: causal_conv1d_spec then gated_delta_rule_spec with these arguments)
    _dropin(core_attn_out, z, projected_states_qkvz, projected_states_ba, locals(), **_SPEC_ONLY)

    ref_core_attn_out = torch.zeros_like(core_attn_out)
    ref_z = torch.zeros_like(core_attn_out)
    _spec_reference(ref_core_attn_out, ref_z, locals())
    _check_outputs_and_spec_slots(core_attn_out, z, ref_core_attn_out, ref_z, locals())


# (num_spec_decodes, num_spec_tokens, non_spec_num_tokens, has_bias, mode, reorder_input, dtype, ssm_state_is_fp32)
MIXED_CASES = [
    (4, 3, 257, True, "mix_mode", False, torch.bfloat16, True),
    (1, 2, 32, False, "decode", True, torch.float16, False),
    (4, 2, 1, True, "prefill", True, torch.bfloat16, False),
]


@pytest.mark.parametrize("conv", ["snapshot", "rolled"])
@pytest.mark.parametrize("num_spec_decodes,num_spec_tokens,non_spec_num_tokens,has_bias,mode,reorder_input,dtype,"
                         "ssm_state_is_fp32", MIXED_CASES, ids=["-".join(map(_tc, c)) for c in MIXED_CASES])
@torch.inference_mode()
def test_gdn_attention_mixed_spec_non_spec(num_spec_decodes, num_spec_tokens, non_spec_num_tokens, has_bias, mode,
                                           reorder_input, dtype, ssm_state_is_fp32, conv):
    """Mixed batch exercising the fused gdn_attention with BOTH a non-spec
    (prefill + decode) group AND a spec-decode group in a single call.

    Layout in the global token buffer:
      - non-spec tokens occupy the leading segment [0, non_spec_token)
        contiguously (validated with ref_gdn_attention);
      - spec tokens occupy the trailing segment [non_spec_token,
        num_actual_tokens), addressed through spec_token_indx with the
        per-seq order shuffled to exercise gather/scatter (validated with
        ref_gdn_attention_spec).
    The two groups use disjoint conv/ssm cache slots so their execution order
    inside the fused op cannot interfere.
    """
    num_k_heads, head_k_dim, num_v_heads, head_v_dim, width, tp_size, activation = 16, 128, 32, 128, 4, 1, "silu"
    device = "cpu"
    random.seed(7)
    torch.manual_seed(7)
    ssm_state_dtype = torch.float32 if ssm_state_is_fp32 else dtype

    assert head_k_dim == head_v_dim

    # ---- non-spec segment sizing (prefill / decode split) ----
    non_spec_batch = min(32, non_spec_num_tokens)
    if mode == "prefill":
        num_prefills = non_spec_batch
    elif mode == "decode":
        num_prefills = 0
        # decode means one token per sequence; only valid when tokens == batch.
        if non_spec_batch != non_spec_num_tokens:
            pytest.skip("decode mode requires non_spec_num_tokens == batch")
    else:
        num_prefills = (random.randint(1, non_spec_batch - 1)
                        if non_spec_batch > 1 else 1)
    num_decodes = non_spec_batch - num_prefills

    K = num_spec_tokens
    spec_token = num_spec_decodes * K
    non_spec_token = non_spec_num_tokens
    num_actual_tokens = non_spec_token + spec_token
    cache_batch_size = 400

    (projected_states_qkvz, projected_states_ba, conv_state, ref_conv_state, ssm_state, ref_ssm_state, conv_weights,
     conv_bias, A_log, dt_bias) = _layer_tensors(num_actual_tokens, num_k_heads, num_v_heads, head_k_dim, head_v_dim, width, tp_size,
                                                 cache_batch_size, dtype, ssm_state_dtype, has_bias, device)

    # ---- disjoint cache slots for the two groups ----
    all_slots = random.sample(range(1, cache_batch_size),
                              non_spec_batch + spec_token)
    non_spec_slots = all_slots[:non_spec_batch]
    spec_slots = all_slots[non_spec_batch:]

    # ---- non-spec indexing: leading segment [0, non_spec_token) ----
    prefill_batches = simple_random_distribute(non_spec_token - num_decodes,
                                               non_spec_batch - num_decodes)
    token_batches = torch.cat([torch.ones([num_decodes]),
                               prefill_batches]).to(device)
    perm = torch.randperm(token_batches.size(0)).to(device)
    shuffled_tensor = token_batches[perm]
    non_spec_query_start_loc = torch.cat([
        torch.zeros([1], device=device),
        torch.cumsum(shuffled_tensor, dim=0)
    ]).to(torch.int32)
    has_initial_state = perm >= num_decodes
    non_spec_state_indices_tensor = torch.tensor(non_spec_slots,
                                                 device=device,
                                                 dtype=torch.int32)
    # Non-spec tokens are laid out contiguously at the front; the identity
    # token index maps kernel writes to the same rows the reference uses.
    non_spec_token_indx = torch.arange(non_spec_token,
                                       dtype=torch.int32,
                                       device=device)

    # ---- spec indexing: trailing segment [non_spec_token, num_actual_tokens)
    spec_state_indices_tensor = torch.tensor(spec_slots,
                                             dtype=torch.int32,
                                             device=device).reshape(
                                                 num_spec_decodes, K)
    num_accepted_tokens = torch.tensor(
        [random.randint(0, K) for _ in range(num_spec_decodes)],
        dtype=torch.int32,
        device=device)
    # Shuffle spec token positions WITHIN the trailing segment.
    spec_perm = torch.randperm(spec_token, device=device)
    spec_token_indx = (non_spec_token +
                       spec_perm).to(torch.int32).contiguous()
    spec_query_start_loc = (torch.arange(
        num_spec_decodes + 1, dtype=torch.int32, device=device) * K)
    rolled = _as_rolled(conv, conv_state, spec_state_indices_tensor, num_accepted_tokens)

    core_attn_out = torch.zeros(
        (num_actual_tokens, num_v_heads // tp_size, head_v_dim),
        dtype=dtype,
        device=device,
    )
    z = torch.zeros_like(core_attn_out)

    _dropin(core_attn_out, z, projected_states_qkvz, projected_states_ba, locals())

    # ---- reference: run non-spec ref on the leading segment and spec ref on
    # the trailing segment, into a shared reference buffer ----
    ref_core_attn_out = torch.zeros_like(core_attn_out)
    ref_z = torch.zeros_like(core_attn_out)

    # Non-spec reference consumes only the leading [0, non_spec_token) rows.
    _reference(ref_core_attn_out[:non_spec_token], ref_z[:non_spec_token],
               projected_states_qkvz[:non_spec_token].contiguous(), projected_states_ba[:non_spec_token].contiguous(),
               locals(), num_actual_tokens=non_spec_token)

    # Spec reference scatters through spec_token_indx (trailing rows).
    _spec_reference(ref_core_attn_out, ref_z, locals())
    _check_outputs_and_spec_slots(core_attn_out, z, ref_core_attn_out, ref_z, locals())

    # non-spec conv/ssm cache slots.
    for i in range(non_spec_batch):
        slot = non_spec_state_indices_tensor[i]
        torch.testing.assert_close(_conv_slot(locals(), slot),
                                   ref_conv_state[slot],
                                   atol=ATOL,
                                   rtol=RTOL)
        torch.testing.assert_close(ssm_state[slot],
                                   ref_ssm_state[slot],
                                   atol=ATOL,
                                   rtol=RTOL)


# Three single-prefill cases of theirs with one body (their three tests differ in the shapes only):
# - test_gdn_attention_gqa_ratio3_prefill: GQA ratio num_v_heads/num_k_heads == 3 (H 2, HV 6), a
#   prefill of 16 tokens (>= their conv1d_tile_size, 8); ratio 3 gives a z gate of 384 features,
#   more than their tiled conv's 256-feature pass (the 3rd v-head of every k-group was not written);
#   both reorder_input values;
# - test_chunk_prepare_vhead_oob_guard: HV 48 over H 16 (Qwen3.6-27B), 64 tokens (several chunks):
#   their chunk_prepare's sub-group range is not a multiple of 48 on their GPUs;
# - test_causal_conv1d_conv_elems_oob_guard: the same model at tp_size 4 (local H 4, HV 12), 64
#   tokens: conv_elems 2560 is not a multiple of their work-group's 1024 elements.
SINGLE_PREFILLS = {  # name: (num_k_heads, num_v_heads, tp_size, tokens, reorder_input values)
    "gqa_ratio3_prefill": (2, 6, 1, 16, (True, False)),
    "chunk_prepare_vhead_oob_guard": (16, 48, 1, 64, (False,)),
    "causal_conv1d_conv_elems_oob_guard": (16, 48, 4, 64, (False,)),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_tc)
@pytest.mark.parametrize("case,reorder_input", [(case, r) for case, v in SINGLE_PREFILLS.items() for r in v[4]])
@torch.inference_mode()
def test_gdn_attention_single_prefill(case, reorder_input, dtype):
    device = "cpu"
    random.seed(0)
    torch.manual_seed(0)

    num_k_heads, num_v_heads, tp_size, num_actual_tokens, _ = SINGLE_PREFILLS[case]
    head_k_dim = head_v_dim = 128
    local_num_k_heads, local_num_v_heads = num_k_heads // tp_size, num_v_heads // tp_size
    width = 4
    activation = "silu"
    num_prefills, num_decodes = 1, 0
    cache_batch_size = 4

    (projected_states_qkvz, projected_states_ba, conv_state, ref_conv_state, ssm_state, ref_ssm_state, conv_weights,
     conv_bias, A_log, dt_bias) = _layer_tensors(num_actual_tokens, num_k_heads, num_v_heads, head_k_dim, head_v_dim, width, tp_size,
                                                 cache_batch_size, dtype, dtype, True, device)

    non_spec_query_start_loc = torch.tensor([0, num_actual_tokens],
                                            dtype=torch.int32, device=device)
    has_initial_state = torch.tensor([True], dtype=torch.bool, device=device)
    non_spec_state_indices_tensor = torch.tensor([1], dtype=torch.int32,
                                                 device=device)

    core_attn_out = torch.zeros((num_actual_tokens, local_num_v_heads, head_v_dim),
                                dtype=dtype, device=device)
    z = torch.empty_like(core_attn_out)

    _dropin(core_attn_out, z, projected_states_qkvz, projected_states_ba, locals(), **_NON_SPEC_ONLY)

    ref_core_attn_out = torch.zeros_like(core_attn_out)
    ref_z = torch.empty_like(core_attn_out)
    _reference(ref_core_attn_out, ref_z, projected_states_qkvz, projected_states_ba, locals())

    torch.testing.assert_close(z, ref_z, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(core_attn_out, ref_core_attn_out, atol=ATOL,
                               rtol=RTOL)


# ----------------------------------------------------------------------------- tests/gdn_attn/test_gdn_attn_padded.py
def _build_inputs(num_actual_tokens, padded_size, dtype, device):
    """Allocate a minimal decode-only call shape with a padded leading dim."""
    num_k_heads = 1
    num_v_heads = 1
    head_k_dim = 32
    head_v_dim = 32
    width = 2
    tp_size = 1
    cache_batch_size = 16

    mixed_qkvz_size = num_k_heads // tp_size * (
        2 * head_k_dim + 2 * head_v_dim * num_v_heads // num_k_heads)
    mixed_ba_size = num_k_heads // tp_size * (2 * num_v_heads // num_k_heads)
    mixed_qkv_size = num_k_heads // tp_size * (
        2 * head_k_dim + head_v_dim * num_v_heads // num_k_heads)

    qkvz_padded = torch.randn(padded_size, mixed_qkvz_size,
                              dtype=dtype, device=device)
    ba_padded = torch.randn(padded_size, mixed_ba_size,
                            dtype=dtype, device=device)
    # Zero out the padded tail so the kernel can't accidentally pick up
    # uninitialized values from the dummy padding region.
    qkvz_padded[num_actual_tokens:].zero_()
    ba_padded[num_actual_tokens:].zero_()

    conv_state = torch.randn(cache_batch_size, width - 1, mixed_qkv_size,
                             dtype=dtype, device=device)
    ssm_state = torch.randn(cache_batch_size, num_v_heads // tp_size,
                            head_v_dim, head_k_dim,
                            dtype=dtype, device=device)
    conv_weights = torch.randn(mixed_qkv_size, width,
                               dtype=dtype, device=device)
    A_log = torch.randn(num_v_heads // tp_size,
                        dtype=torch.float32, device=device)
    dt_bias = torch.randn(num_v_heads // tp_size,
                          dtype=dtype, device=device)

    # Decode-only: one token per batch entry, num_prefills == 0.
    num_decodes = num_actual_tokens
    num_prefills = 0
    batch_size = num_decodes
    non_spec_query_start_loc = torch.arange(batch_size + 1, dtype=torch.int32,
                                            device=device)
    has_initial_state = torch.ones(batch_size, dtype=torch.bool, device=device)
    non_spec_state_indices_tensor = torch.tensor(
        random.sample(range(1, cache_batch_size), batch_size),
        device=device, dtype=torch.int32)

    return dict(
        projected_states_qkvz=qkvz_padded,
        projected_states_ba=ba_padded,
        num_k_heads=num_k_heads,
        num_v_heads=num_v_heads,
        head_k_dim=head_k_dim,
        head_v_dim=head_v_dim,
        conv_state=conv_state,
        ssm_state=ssm_state,
        conv_weights=conv_weights,
        conv_bias=None,
        activation="silu",
        A_log=A_log,
        dt_bias=dt_bias,
        num_prefills=num_prefills,
        num_decodes=num_decodes,
        has_initial_state=has_initial_state,
        non_spec_query_start_loc=non_spec_query_start_loc,
        non_spec_state_indices_tensor=non_spec_state_indices_tensor,
        num_actual_tokens=num_actual_tokens,
        tp_size=tp_size,
        reorder_input=False,
        head_v_dim_for_alloc=head_v_dim,
        num_v_heads_for_alloc=num_v_heads,
    )


@pytest.mark.parametrize("num_actual_tokens,padded_size", [
    (1, 4),
    (3, 4),
    (5, 8),
])
@torch.inference_mode()
def test_gdn_attention_accepts_padded_leading_dim(num_actual_tokens,
                                                  padded_size):
    """Padded inputs should not crash, and the active prefix should match
    the result of the same call made with exact-size inputs."""
    device = "cpu"
    random.seed(0)
    torch.manual_seed(0)
    dtype = torch.bfloat16

    args = _build_inputs(num_actual_tokens, padded_size, dtype, device)
    head_v = args.pop("head_v_dim_for_alloc")
    nvh = args.pop("num_v_heads_for_alloc")

    core_attn_out_padded = torch.zeros(padded_size, nvh, head_v,
                                       dtype=dtype, device=device)
    z_padded = torch.empty_like(core_attn_out_padded)
    z_padded[num_actual_tokens:].zero_()

    # Clone storage for the reference run so the two calls are independent.
    args_padded = dict(args)
    args_padded.update(
        projected_states_qkvz=args["projected_states_qkvz"].clone(),
        projected_states_ba=args["projected_states_ba"].clone(),
        conv_state=args["conv_state"].clone(),
        ssm_state=args["ssm_state"].clone(),
    )

    # (theirs, here and below: causal_conv1d_non_spec then gated_delta_rule_non_spec with these arguments)
    _dropin(core_attn_out_padded, z_padded, args_padded["projected_states_qkvz"], args_padded["projected_states_ba"],
            args_padded, **_NON_SPEC_ONLY)

    # Reference call with exact-size tensors. Note the kernel mutates
    # projected_states_qkvz / projected_states_ba internally (caller passes
    # them as const refs but inner kernels read them) — so we use the same
    # un-cloned exact-size slice we'd pass under the vLLM workaround in
    # PR #42383.
    core_attn_out_ref = torch.zeros(num_actual_tokens, nvh, head_v,
                                    dtype=dtype, device=device)
    z_ref = torch.empty_like(core_attn_out_ref)

    _dropin(core_attn_out_ref, z_ref, args["projected_states_qkvz"][:num_actual_tokens].contiguous(),
            args["projected_states_ba"][:num_actual_tokens].contiguous(), args, **_NON_SPEC_ONLY)

    torch.testing.assert_close(
        core_attn_out_padded[:num_actual_tokens],
        core_attn_out_ref,
        atol=ATOL, rtol=RTOL,
    )
    torch.testing.assert_close(
        z_padded[:num_actual_tokens],
        z_ref,
        atol=ATOL, rtol=RTOL,
    )

    # The padded tail must remain at its zero init.
    tail = core_attn_out_padded[num_actual_tokens:]
    assert torch.all(tail == 0), (
        f"padded tail of core_attn_out was written by the kernel: "
        f"max abs = {tail.abs().max().item():.3e}")
    z_tail = z_padded[num_actual_tokens:]
    assert torch.all(z_tail == 0), (
        f"padded tail of z was written by the kernel: "
        f"max abs = {z_tail.abs().max().item():.3e}")
