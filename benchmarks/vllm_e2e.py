"""vLLM's CPU GDN core vs libgdn_xpu through the plugin (pygdn.vllm), inside vLLM, at Qwen3-Next's GDN shapes
(TP=1: 16 k-heads, 32 v-heads, dims 128, conv width 4; dummy weights). 16 layers, every 4th full attention,
as Qwen3-Next's 48: vLLM puts the 12 GDN layers in 3 KV-cache groups of 4 (Qwen3-Next-80B: 3 of 12), and
the layers of a group share one step's metadata, which the plugin maps once per group.

Per-call times: in each case a vLLM engine (in-process, plugin on) generates; every GDN core call is run by
both implementations on the same inputs and cache contents, in alternating order (the touched cache slots
are restored in between, the engine goes on with the plugin's results). The plugin's time is what vLLM
runs: pygdn.vllm's glue (metadata mapping, DLPack intake, the wait) included. Cases: decode B=1/8/32, MTP
k=2 at B=8 (verifier acceptance cycling 1..3), prefill of 512 and 2048 tokens. Then generate tokens/s of
the same model, plugin off and on, alternating processes.

    python benchmarks/vllm_e2e.py [--rounds N] [--quick]

Run in the environment of `tests/setup_and_run.sh integration`. Medians with the 25th-75th percentile;
the host's memory speed swings for minutes at a time: compare rows of one run only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
from conftest import CONFIG, engine_env  # noqa: E402
from models import speculative_config  # noqa: E402

SHAPES = dict(hidden_size=1024, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
              linear_value_head_dim=128, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
              intermediate_size=512, moe_intermediate_size=128, shared_expert_intermediate_size=128,
              max_position_embeddings=8192, num_hidden_layers=16)
KV_CACHE_GIB = 4
CASES = {  # name: (prompt lengths, tokens to generate, MTP draft tokens, generate calls)
    "decode B=1": ([16], 48, 0, 1), "decode B=8": ([16] * 8, 32, 0, 1), "decode B=32": ([16] * 32, 24, 0, 1),
    "MTP k=2 B=8": ([16] * 8, 32, 2, 1), "prefill 512": ([512], 1, 0, 7), "prefill 2048": ([2048], 1, 0, 5),
}  # (a prefill is one call per layer: repeated generate calls give the prefill rows their samples)


def child(spec):
    """In the engine's process: time both cores on every GDN call (spec: case settings)."""
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as cpu_ops
    from vllm.plugins import load_general_plugins
    from vllm.utils.torch_utils import LayerNameType
    from pygdn.vllm import layer_step
    import run_vllm
    native = cpu_ops.cpu_gdn_attention_core
    load_general_plugins()
    served = cpu_ops.cpu_gdn_attention_core
    assert served is not native, "the plugin did not register (GDN_XPU_VLLM=1?)"
    times, flip = [], [False]

    def timed(mixed_qkv, b, a, core_attn_out, layer_name):
        layer, md = layer_step(layer_name)
        if md is None:
            return served(mixed_qkv, b, a, core_attn_out, layer_name)
        conv, ssm = layer.kv_cache
        slots = torch.cat([t.reshape(-1)[:k] for t, k in ((md.non_spec_state_indices_tensor,
                                                            md.num_prefills + md.num_decodes),
                                                           (md.spec_state_indices_tensor, None)) if t is not None])
        slots = slots.long().unique()
        before = conv[slots].clone(), ssm[slots].clone()
        order = [(native, "vllm"), (served, "plugin")]
        flip[0] = not flip[0]
        got = {}
        for fn, name in (order if flip[0] else order[::-1]):
            conv[slots], ssm[slots] = before
            o = torch.zeros_like(core_attn_out)
            t0 = time.perf_counter()
            fn(mixed_qkv, b, a, o, layer_name)
            got[name] = (time.perf_counter() - t0, o, conv[slots].clone(), ssm[slots].clone())
        _, o, c, s = got["plugin"]
        core_attn_out.copy_(o)
        conv[slots], ssm[slots] = c, s
        times.append((md.num_actual_tokens, md.num_prefills, md.num_decodes, md.num_spec_decodes, got["vllm"][0],
                      got["plugin"][0]))
    timed.__annotations__ = dict(mixed_qkv=torch.Tensor, b=torch.Tensor, a=torch.Tensor, core_attn_out=torch.Tensor,
                                 layer_name=LayerNameType, **{"return": None})
    cpu_ops.cpu_gdn_attention_core = timed
    run_vllm.widen_dummy_weights()
    kw = dict(model=spec["model"], load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
              max_model_len=4096, max_num_seqs=32, max_num_batched_tokens=4096,
              kv_cache_memory_bytes=KV_CACHE_GIB << 30,
              enable_prefix_caching=False)
    if spec["mtp"]:
        kw["speculative_config"] = speculative_config(spec["mtp"])
        run_vllm.cycle_acceptance()
    llm = LLM(**kw)
    prompts = [TokensPrompt(prompt_token_ids=[(7 * i + j) % 1000 + 1 for j in range(n)])
               for i, n in enumerate(spec["prompts"])]
    for _ in range(spec["repeats"]):
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=spec["tokens"], ignore_eos=True),
                     use_tqdm=False)
    json.dump(times, open(spec["out"], "w"))


def tokens_per_s(spec):
    """In the engine's process: generate tokens/s (decode B=8, 64 tokens) with whichever core is on."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    import run_vllm
    run_vllm.widen_dummy_weights()
    llm = LLM(model=spec["model"], load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              enforce_eager=True, max_model_len=1024, max_num_seqs=8, kv_cache_memory_bytes=KV_CACHE_GIB << 30,
              enable_prefix_caching=False)
    prompts = [TokensPrompt(prompt_token_ids=[(5 * i + j) % 1000 + 1 for j in range(32)]) for i in range(8)]
    sp = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    json.dump(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0), open(spec["out"], "w"))


def spawn(fn, spec, plugin=True):
    # (vLLM's CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE, GiB, over kv_cache_memory_bytes:
    # 32 sequences of 16 layers need more than the tests' 1)
    env = dict(engine_env(plugin), VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_GIB))
    p = subprocess.run([sys.executable, __file__, "--child", fn, json.dumps(spec)], env=env,
                       capture_output=True, text=True, timeout=3600)
    if p.returncode:
        sys.exit(f"{fn} failed:\n{(p.stdout + p.stderr)[-5000:]}")
    return json.load(open(spec["out"]))


def stats(xs):
    import numpy as np
    q = np.percentile(np.asarray(xs) * 1e3, [25, 50, 75])
    return q[1], q[0], q[2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3, help="tokens/s: processes per side, alternating")
    p.add_argument("--quick", action="store_true", help="fewer cases (decode B=1, MTP, prefill 512)")
    p.add_argument("--child", nargs=2)
    args = p.parse_args()
    if args.child:
        return {"child": child, "tokens_per_s": tokens_per_s}[args.child[0]](json.loads(args.child[1]))
    import platform
    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "model")
    os.makedirs(model)
    json.dump(dict(CONFIG, **SHAPES), open(os.path.join(model, "config.json"), "w"))
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = open("/proc/cpuinfo").read()
    print(f"host: {cpu} ({platform.machine()}), avx512f={'avx512f' in flags}, avx512_bf16={'avx512_bf16' in flags}, "
          f"amx_tile={'amx_tile' in flags}, {os.cpu_count()} CPUs")
    print("| case | calls | vLLM CPU core ms (p25-p75) | libgdn_xpu via plugin ms (p25-p75) | vLLM / plugin |")
    print("|---|---|---|---|---|")
    cases = {k: v for k, v in CASES.items() if not args.quick or k in ("decode B=1", "MTP k=2 B=8", "prefill 512")}
    for name, (prompts, tokens, mtp, repeats) in cases.items():
        times = spawn("child", dict(model=model, prompts=prompts, tokens=tokens, mtp=mtp, repeats=repeats,
                                    out=os.path.join(tmp, "t.json")))
        want = ((sum(prompts), 1, 0, 0) if name.startswith("prefill") else (None, 0, 0, len(prompts)) if mtp
                else (len(prompts), 0, len(prompts), 0))  # (tokens, prefills, decodes, spec decodes) of a call
        rows = [t for t in times if all(w is None or w == g for w, g in zip(want, t))]
        if not rows:  # (e.g. the KV cache held fewer sequences than asked for)
            print(f"| {name} | 0 | - | - | - |", flush=True)
            continue
        v, p_ = stats([r[4] for r in rows]), stats([r[5] for r in rows])
        print(f"| {name} | {len(rows)} | {v[0]:.3f} ({v[1]:.3f}-{v[2]:.3f}) | {p_[0]:.3f} ({p_[1]:.3f}-{p_[2]:.3f}) "
              f"| {v[0] / p_[0]:.2f}x |", flush=True)
    tps = {"vllm": [], "plugin": []}
    for _ in range(args.rounds):
        for side in ("vllm", "plugin"):
            tps[side].append(spawn("tokens_per_s", dict(model=model, out=os.path.join(tmp, "s.json")), side == "plugin"))
    med = {k: sorted(v)[len(v) // 2] for k, v in tps.items()}
    print(f"\ngenerate, decode B=8 x 64 tokens: vLLM CPU core {med['vllm']:.1f} tok/s ({min(tps['vllm']):.1f}-"
          f"{max(tps['vllm']):.1f}), plugin {med['plugin']:.1f} tok/s ({min(tps['plugin']):.1f}-{max(tps['plugin']):.1f}), "
          f"{args.rounds} alternating processes each")


if __name__ == "__main__":
    main()
