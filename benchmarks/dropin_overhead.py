"""Host cost of the vLLM glue per layer call, against the prepared call it makes (pygdn.prepare of the
same op on the same arrays, whose run() pays the C call, the kernels and the wait):

- the XPU drop-in, pygdn.vllm_xpu.gdn_attention, called as vLLM's _gdn_attention_core_xpu_impl calls
  it, on torch CPU tensors (vllm-xpu-kernels' layout: packed qkvz/ba, vk SSM state, bf16, f32 state);
- the CPU plugin's per-layer path, pygdn.vllm.gdn_attention_core minus vLLM's forward-context lookup:
  the step's batch looked up (_step_batch) and the layer's prepared call rebound and run;
- the floor of any glue: the prepared call with the step tensors' addresses written before each run,
  nothing looked up or checked.

Decode steps of B = 1 and 8 sequences, H = 2, HV = 4, K = V = 128 (a small rank of Qwen3-Next: the
host work does not depend on the head counts). Each round times `calls` calls of: the glue with the
prepared call's launch left out (the C call and the wait: pygdn.PreparedCall._launch made a no-op
for that loop), the host work the glue adds, alone; the glue; the prepared call; the prepared call
after a spin of Python as long as that host work (and the spin alone, subtracted). Reported are
medians over rounds of wall time and of the calling thread's CPU time per call; the CPU time is not
charged for waiting or for being preempted, so it reads about the same on a busy host, where wall
times do not.

Glue minus prepared call, both with the kernels, is more than the host work alone. The prepared
call itself costs more after a gap between two calls than back to back (the last column), and in an
engine every call comes after one; and the glue's Python costs more run between the kernels' runs,
which the SYCL CPU device does on the host's own cores, than in a loop of its own (on a GPU the
kernels run elsewhere).

Needs torch (the suite's environment has none; the integration environment does):

    python benchmarks/dropin_overhead.py [--calls 300] [--rounds 9]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types

import numpy as np

import pygdn
from pygdn import vllm, vllm_xpu
from pygdn._lib import ffi
from pygdn.batch import make_batch
from pygdn.ops import _POINTER_WORDS

H, HV, K, V, W, SLOTS = 2, 4, 128, 128, 4, 64
C = 2 * H * K + HV * V


def _loop(fn, calls):
    for _ in range(20):
        fn()
    t, c = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6, (time.thread_time() - c) / calls * 1e6


def _spin(us):
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _rounds(glue, prepared, calls, rounds):
    """{"wall"|"cpu": {host_us, glue_us, prepared_us, added_us (median of the rounds' differences),
    gap_us (the prepared call after a spin as long as the host work)}}."""
    names = ("host_us", "glue_us", "prepared_us", "gap_us")
    res = {"wall": {n: [] for n in names}, "cpu": {n: [] for n in names}}
    launch = pygdn.PreparedCall._launch
    for _ in range(rounds):
        pygdn.PreparedCall._launch = lambda self, c_batch, c_t, wait: None
        try:
            host = _loop(glue, calls)
        finally:
            pygdn.PreparedCall._launch = launch
        spin = _loop(lambda: _spin(host[0]), calls)
        gap = _loop(lambda: (_spin(host[0]), prepared()), calls)
        for clock, values in enumerate(zip(host, _loop(glue, calls), _loop(prepared, calls),
                                           (g - s for g, s in zip(gap, spin)))):
            for n, v in zip(names, values):
                res[("wall", "cpu")[clock]][n].append(v)
    out = {}
    for clock, r in res.items():
        out[clock] = {n: statistics.median(v) for n, v in r.items()}
        out[clock]["added_us"] = statistics.median(g - p for g, p in zip(r["glue_us"], r["prepared_us"]))
    return out


def dropin_case(torch, B, calls, rounds, floor=False):
    """vllm_xpu.gdn_attention of a decode step of B sequences against pygdn.prepare of it. floor: in place
    of the drop-in, the prepared call with its four step tensors' addresses written before each run
    (torch's data_ptr() into its gdn_tensors_t): what any glue pays at least, vLLM's 29-argument call
    to it left out."""
    meta = make_batch(np.random.default_rng(B), num_slots=SLOTS, num_decodes=B, order="grouped",
                      identity_indices=True)
    bf = torch.bfloat16
    qkvz, ba = torch.randn(B, C + HV * V).to(bf), torch.randn(B, 2 * HV).to(bf)
    out, z = torch.zeros(B, HV, V, dtype=bf), torch.zeros(B, HV, V, dtype=bf)
    conv_state, ssm_state = torch.randn(SLOTS, W - 1, C).to(bf), torch.randn(SLOTS, HV, V, K)
    weight = torch.nn.Parameter((torch.randn(C, 1, W) * 0.5).to(bf))
    A_log, dt_bias = torch.nn.Parameter(torch.randn(HV)), torch.nn.Parameter(torch.randn(HV).to(bf))
    qsl, slots = torch.from_numpy(meta["non_spec_query_start_loc"]), torch.from_numpy(meta["non_spec_state_indices"])

    # (vLLM views the conv weight anew at every call; that view is vLLM's work, the same for
    # vllm-xpu-kernels, and not timed here)
    conv_weights = weight.view(weight.size(0), weight.size(2))

    def glue():  # (as vllm/_xpu_ops.py calls it)
        vllm_xpu.gdn_attention(
            out, z, qkvz, ba, H, HV, K, V, conv_state=conv_state, ssm_state=ssm_state,
            conv_weights=conv_weights, conv_bias=None, activation="silu", A_log=A_log,
            dt_bias=dt_bias, num_prefills=0, num_decodes=B, num_spec_decodes=0, has_initial_state=None,
            non_spec_query_start_loc=qsl, non_spec_token_indx=None, non_spec_state_indices_tensor=slots,
            spec_query_start_loc=None, spec_token_indx=None, spec_state_indices_tensor=None, num_accepted_tokens=None,
            num_actual_tokens=B, tp_size=1, reorder_input=False)

    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=SLOTS, conv_width=W,
                       act_dtype="bf16", ssm_layout="vk", conv_layout="time_major", conv_spec_layout="snapshot",
                       packed_order="grouped")
    batch = pygdn.Batch(num_actual_tokens=B, num_decodes=B, non_spec_token_count=B, validate="counts",
                        non_spec_query_start_loc=qsl, non_spec_state_indices=slots)
    prepared = pygdn.prepare(pygdn.attention, vllm_xpu.cpu_queue(), cfg, batch, qkvz=qkvz, ba=ba, z_out=z,
                             core_attn_out=out, conv_weight=weight.detach().view(C, W), A_log=A_log.detach(),
                             dt_bias=dt_bias.detach(), conv_state=conv_state, ssm_state=ssm_state)
    if floor:
        words = ffi.cast("uintptr_t *", prepared._c_t)
        step = [(_POINTER_WORDS[f], t) for f, t in (("qkvz", qkvz), ("ba", ba), ("z_out", z), ("core_attn_out", out))]

        def addresses_only():
            for word, t in step:
                words[word] = t.data_ptr()
            prepared.run()
    try:
        return _rounds(addresses_only if floor else glue, prepared.run, calls, rounds)
    finally:
        vllm_xpu.release()


def plugin_case(torch, B, calls, rounds):
    """pygdn.vllm's per-layer path (step batch, the step's arrays rebound and run) against pygdn.prepare of the
    step."""
    bf = torch.bfloat16
    md = types.SimpleNamespace(num_actual_tokens=B, num_prefills=0, num_decodes=B, num_prefill_tokens=0,
                               num_decode_tokens=B, non_spec_query_start_loc=torch.arange(B + 1, dtype=torch.int32),
                               non_spec_state_indices_tensor=torch.arange(B, dtype=torch.int32) * 2,
                               has_initial_state=None, spec_sequence_masks=None, num_spec_decodes=0)
    mixed_qkv, ab = torch.randn(B, C).to(bf), torch.randn(B, 2 * HV).to(bf)
    b, a = ab[:, :HV], ab[:, HV:]  # (vLLM's b and a: columns of one projection's rows)
    out = torch.zeros(B, HV, V, dtype=bf)
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=SLOTS, conv_width=W,
                       act_dtype="bf16", ssm_layout="kv", conv_layout="dim_major", conv_spec_layout="rolled",
                       l2norm_eps=vllm.L2NORM_EPS)
    weights = dict(conv_weight=(torch.randn(C, W) * 0.5).to(bf), A_log=torch.randn(HV), dt_bias=torch.randn(HV),
                   conv_state=torch.randn(SLOTS, C, W - 1).to(bf), ssm_state=torch.randn(SLOTS, HV, K, V))
    empty = dict(mixed_qkv=mixed_qkv[:0], a=a[:0], b=b[:0], core_attn_out=out[:0])
    q = vllm_xpu.cpu_queue()
    # (as pygdn.vllm._Served prepares a layer: empty step arrays, rebound at every step)
    served = pygdn.prepare(pygdn.attention, q, cfg, pygdn.Batch(num_actual_tokens=0, validate="counts"),
                           **weights, **empty)

    def glue():
        batch = vllm._step_batch(md)
        served._run_step(batch, True, dict(mixed_qkv=mixed_qkv, a=a, b=b, core_attn_out=out))

    prepared = pygdn.prepare(pygdn.attention, q, cfg, vllm._step_batch(md), **weights, mixed_qkv=mixed_qkv, a=a, b=b,
                             core_attn_out=out)
    return _rounds(glue, prepared.run, calls, rounds)


def measure(calls=300, rounds=9):
    """{case: {"wall"|"cpu": {host_us, glue_us, prepared_us, added_us, gap_us}}}, or {"skipped": why} without
    torch."""
    try:
        import torch
    except ImportError as e:
        return {"skipped": f"torch is not installed ({e})"}
    torch.set_num_threads(1)
    res = {}
    for B in (1, 8):
        res[f"XPU drop-in, decode B={B}"] = dropin_case(torch, B, calls, rounds)
    for B in (1, 8):
        res[f"addresses only (the floor of a glue), decode B={B}"] = dropin_case(torch, B, calls, rounds, floor=True)
    for B in (1, 8):
        res[f"CPU plugin per layer, decode B={B}"] = plugin_case(torch, B, calls, rounds)
    return res


def table(res):
    lines = ["| glue | host work alone, CPU / wall µs per call | with the call: glue / prepared, wall µs | "
             "added, wall / CPU µs | the prepared call after a gap as long as the host work, wall µs |",
             "| --- | --- | --- | --- | --- |"]
    for name, r in res.items():
        w, c = r["wall"], r["cpu"]
        lines.append(f"| {name} | {c['host_us']:.1f} / {w['host_us']:.1f} | {w['glue_us']:.1f} / {w['prepared_us']:.1f} | "
                     f"{w['added_us']:.1f} / {c['added_us']:.1f} | {w['gap_us']:.1f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    res = measure(args.calls, args.rounds)
    if "skipped" in res:
        sys.exit(res["skipped"])
    from machine import cpu_model
    load = os.getloadavg()
    print(f"pygdn {pygdn.__version__}, {cpu_model()}, {os.cpu_count()} cores, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
    print(table(res))


if __name__ == "__main__":
    main()
