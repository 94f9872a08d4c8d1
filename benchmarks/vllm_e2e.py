"""vLLM's CPU GDN core vs libgdn_xpu through the plugin (pygdn.vllm), inside vLLM as users run it, at
Qwen3-Next's GDN shapes (TP=1: 16 k-heads, 32 v-heads, dims 128, conv width 4; bf16 activations; dummy
weights). 16 layers, every 4th full attention, as Qwen3-Next's 48: vLLM puts the 12 GDN layers in 3
KV-cache groups of 4 (Qwen3-Next-80B: 3 of 12), and the layers of a group share one step's metadata.

vLLM's default deployment: the multiprocess engine (`vllm serve`, or LLM(...) without
VLLM_ENABLE_V1_MULTIPROCESSING=0) with Intel OpenMP preloaded (LD_PRELOAD=<venv>/lib/libiomp5.so, as
vLLM's CPU docs ask), so the model runs in vLLM's worker process with the OpenMP settings vLLM gives it
(vllm/utils/ompmultiprocessing.py: OMP_NUM_THREADS = the worker's cores minus one reserved for the
scheduler, KMP_AFFINITY to them, KMP_BLOCKTIME=5, KMP_TPAUSE=0). The run prints what the worker got.

Per call: in the process that runs the model (vLLM's worker), every GDN core call is run by both
implementations on the same inputs and cache contents, in alternating order (the touched cache slots are
restored in between; the engine goes on with the plugin's results), each timed with time.perf_counter.
The plugin's time is what vLLM runs: pygdn.vllm's glue (metadata, DLPack intake, the wait) included.
Then the plugin's call is repeated back to back, ALONE_REPEATS times, its first repeat untimed: "alone" is
the median of the others, the same call with nothing of vLLM's between calls. Cases: decode B=1/8/32,
prefill of 512 and 2048 tokens (one engine), MTP k=2 at B=8 (verifier acceptance cycling 1..3; a second
engine). Then generate tokens/s at concurrency 1 and 8 (64 tokens a sequence), with and without MTP k=2,
plugin off and on, in alternating processes.

    python benchmarks/vllm_e2e.py [--rounds N] [--quick] [--inprocess] [--skip-generate] [--cases A,B]

--inprocess: also the per-call table with the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), a
setting vLLM's CPU platform does not support for speed (it cannot set the OpenMP environment there).
Run in the environment of `tests/setup_and_run.sh integration`. Medians with the 25th-75th percentile;
the host's memory speed swings for minutes at a time: compare rows of one run only.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import run_vllm  # noqa: E402  (its module-level hooks widen dummy weights in vLLM's worker processes)
from conftest import CONFIG, engine_env  # noqa: E402
from models import speculative_config  # noqa: E402

SHAPES = dict(hidden_size=1024, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
              linear_value_head_dim=128, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
              intermediate_size=512, moe_intermediate_size=128, shared_expert_intermediate_size=128,
              max_position_embeddings=8192, num_hidden_layers=16)
KV_CACHE_GIB = 4
ALONE_REPEATS = 4  # back-to-back plugin calls after each timed pair; the first is untimed
# name: (prompt lengths, tokens to generate, generate calls, MTP draft tokens); a prefill is one call per
# layer, so repeated generate calls give the prefill rows their samples
CASES = {
    "decode B=1": ([16], 48, 1, 0), "decode B=8": ([16] * 8, 32, 1, 0), "decode B=32": ([16] * 32, 24, 1, 0),
    "MTP k=2 B=8": ([16] * 8, 32, 1, 2), "prefill 512": ([512], 1, 7, 0), "prefill 2048": ([2048], 1, 5, 0),
}
QUICK = ("decode B=1", "decode B=8", "MTP k=2 B=8", "prefill 512")
ROWS_ENV = "VLLM_E2E_ROWS"           # the folder where the model's process writes its rows (timer)
PROFILE_ENV = "VLLM_E2E_PROFILE"      # "1": the pieces of each plugin call timed too (profile_pieces)
ACCEPT_ENV = "VLLM_E2E_ACCEPT_CYCLE"  # "1": the verifier accepts 0..K drafts in turn (run_vllm.cycle_acceptance)
OMP_VARS = ("OMP_NUM_THREADS", "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_TPAUSE", "OMP_PLACES", "OMP_PROC_BIND",
            "CL_CONFIG_CPU_TBB_NUM_WORKERS", "SYCL_CPU_NUM_CUS", "SYCL_CPU_CU_AFFINITY", "SYCL_CPU_PLACES")


def threads_by_cpus():
    """{allowed CPUs: number of this process's threads} (/proc/self/task), the calling thread apart."""
    out = {}
    for t in glob.glob("/proc/self/task/*"):
        try:
            cpus = next(ln.split()[1] for ln in open(t + "/status") if ln.startswith("Cpus_allowed_list"))
        except (OSError, StopIteration):
            continue
        key = f"{cpus} (this thread)" if int(os.path.basename(t)) == threading.get_native_id() else cpus
        out[key] = out.get(key, 0) + 1
    return out


def install_timer(folder):
    """In the process that runs the model: time both cores on every GDN call (module docstring). Writes
    a JSON line per call, [tokens, prefills, decodes, spec decodes, vLLM s, plugin s, plugin alone s], and
    after the first call one {"facts": ...} line (the process's OpenMP settings and threads)."""
    import torch
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as cpu_ops
    from vllm.plugins import load_general_plugins
    from vllm.utils.torch_utils import LayerNameType
    native = cpu_ops.cpu_gdn_attention_core
    load_general_plugins()
    served = cpu_ops.cpu_gdn_attention_core
    if served is native:  # (a process of the engine that does not serve: plugin off)
        return
    from pygdn.vllm import layer_step
    out = open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a", buffering=1)
    flip, calls = [False], [0]
    pieces = profile_pieces()

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
            pieces.clear()
            t0 = time.perf_counter()
            fn(mixed_qkv, b, a, o, layer_name)
            got[name] = (time.perf_counter() - t0, o, conv[slots].clone(), ssm[slots].clone(), dict(pieces))
        alone, scratch = [], torch.empty_like(core_attn_out)
        for _ in range(ALONE_REPEATS):  # (each repeat advances the state again: the same work)
            pieces.clear()
            t0 = time.perf_counter()
            served(mixed_qkv, b, a, scratch, layer_name)
            alone.append((time.perf_counter() - t0, dict(pieces)))
        _, o, c, s, _ = got["plugin"]
        core_attn_out.copy_(o)
        conv[slots], ssm[slots] = c, s
        alone = sorted(alone[1:], key=lambda x: x[0])[(ALONE_REPEATS - 1) // 2]  # (the median's pieces with it)
        out.write(json.dumps([md.num_actual_tokens, md.num_prefills, md.num_decodes, md.num_spec_decodes,
                              got["vllm"][0], got["plugin"][0], alone[0], got["plugin"][4], alone[1]]) + "\n")
        calls[0] += 1
        if calls[0] == 1:
            from pygdn.vllm import _queue
            out.write(json.dumps({"facts": dict(
                pid=os.getpid(), env={k: os.environ[k] for k in OMP_VARS if k in os.environ},
                iomp_preloaded="libiomp5" in os.environ.get("LD_PRELOAD", ""), torch_threads=torch.get_num_threads(),
                compute_units=_queue().sycl_device.max_compute_units, threads_by_cpus=threads_by_cpus(),
                ssm_dtype=str(ssm.dtype))}) + "\n")
    timed.__annotations__ = dict(mixed_qkv=torch.Tensor, b=torch.Tensor, a=torch.Tensor, core_attn_out=torch.Tensor,
                                 layer_name=LayerNameType, **{"return": None})  # the op's schema
    cpu_ops.cpu_gdn_attention_core = timed


def profile_pieces():
    """With PROFILE_ENV: time the pieces of each plugin call (pygdn.vllm's step batch, the arrays rebound,
    the C call, the wait) into the returned dict, by wrapping them in this process (the library is not
    changed). Without it: an empty dict that stays empty."""
    pieces = {}
    if not os.environ.get(PROFILE_ENV):
        return pieces
    import pygdn.ops as ops
    from pygdn._c import check
    import pygdn.vllm as pv

    def timing(name, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            r = fn(*args, **kwargs)
            pieces[name] = pieces.get(name, 0.0) + time.perf_counter() - t0
            return r
        return timed

    def launch(self, c_batch, c_t, wait):  # PreparedCall._launch, the C call and the wait timed apart
        t0 = time.perf_counter()
        check(self._fn(self._q, self._c_cfg, c_batch, c_t))
        t1 = time.perf_counter()
        if wait:
            self._queue.wait()
        pieces["C call"], pieces["wait"] = t1 - t0, time.perf_counter() - t1
    run_step = ops.PreparedCall._run_step

    def rebind_and_launch(self, batch, wait, arrays):  # "rebind": the step's arrays and batch, the launch left out
        t0 = time.perf_counter()
        run_step(self, batch, wait, arrays)
        pieces["rebind"] = time.perf_counter() - t0 - pieces["C call"] - pieces["wait"]
    pv._step_batch = timing("step batch", pv._step_batch)
    ops.PreparedCall._run_step = rebind_and_launch
    ops.PreparedCall._launch = launch
    return pieces


def engine_kwargs(model, mtp, **kw):
    kw = dict(model=model, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
              kv_cache_memory_bytes=KV_CACHE_GIB << 30, enable_prefix_caching=False, **kw)
    if mtp:
        kw["speculative_config"] = speculative_config(mtp)
    return kw


def prompts_of(lengths, seed):
    from vllm.inputs import TokensPrompt
    return [TokensPrompt(prompt_token_ids=[(seed * i + j) % 1000 + 1 for j in range(n)]) for i, n in enumerate(lengths)]


def per_call(spec):
    """In the engine's main process: generate the cases of spec (one engine); the timer writes the rows."""
    from vllm import LLM, SamplingParams
    llm = LLM(**engine_kwargs(spec["model"], spec["mtp"], max_model_len=4096, max_num_seqs=32,
                              max_num_batched_tokens=4096))
    for prompts, tokens, repeats in spec["cases"]:
        for _ in range(repeats):
            llm.generate(prompts_of(prompts, 7), SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True),
                         use_tqdm=False)
    json.dump("done", open(spec["out"], "w"))


def tokens_per_s(spec):
    """In the engine's main process: generate tokens/s at each concurrency of spec (64 tokens a sequence)."""
    from vllm import LLM, SamplingParams
    llm = LLM(**engine_kwargs(spec["model"], spec["mtp"], max_model_len=1024, max_num_seqs=8))
    result = {}
    for conc in spec["concurrency"]:
        prompts = prompts_of([32] * conc, 5)
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True), use_tqdm=False)
        result[str(conc)] = sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)
    json.dump(result, open(spec["out"], "w"))


def spawn(fn, spec, plugin, multiprocess, rows=None, profile=False):
    """Runs fn(spec) in an engine process of its own; returns what it wrote to spec["out"]."""
    # (vLLM's CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE, GiB, over kv_cache_memory_bytes:
    # 32 sequences of 16 layers need more than the tests' 1)
    env = dict(engine_env(plugin), VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_GIB), **{run_vllm.WIDE_ENV: "1"})
    if multiprocess:
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    if rows:
        env[ROWS_ENV] = rows
    if profile:
        env[PROFILE_ENV] = "1"
    if spec.get("mtp"):
        env[ACCEPT_ENV] = "1"
    p = subprocess.run([sys.executable, __file__, "--child", fn, json.dumps(spec)], env=env,
                       capture_output=True, text=True, timeout=3600)
    if p.returncode:
        sys.exit(f"{fn} failed:\n{(p.stdout + p.stderr)[-5000:]}")
    return json.load(open(spec["out"]))


def quartiles_ms(xs):
    import numpy as np
    q = np.percentile(np.asarray(xs) * 1e3, [25, 50, 75])
    return q[1], q[0], q[2]


def per_call_table(model, tmp, names, multiprocess, profile=False):
    """Runs the per-call cases (one engine without MTP, one with) and prints their table (profile: and
    where the plugin's calls spend their time, in the engine and alone)."""
    rows, facts = [], []
    for mtp in (0, 2):
        cases = [n for n in names if CASES[n][3] == mtp]
        if not cases:
            continue
        folder = tempfile.mkdtemp(dir=tmp)
        spawn("per_call", dict(model=model, mtp=mtp, out=os.path.join(tmp, "done.json"),
                               cases=[CASES[n][:3] for n in cases]), True, multiprocess, rows=folder, profile=profile)
        for path in glob.glob(os.path.join(folder, "*.jsonl")):
            for line in open(path):
                r = json.loads(line)
                (facts if isinstance(r, dict) else rows).append(r)
    for f in facts:
        f = f["facts"]
        print(f"the model's process (pid {f['pid']}): {' '.join(f'{k}={v}' for k, v in f['env'].items()) or 'no OpenMP'}"
              f" settings; libiomp5 preloaded: {f['iomp_preloaded']}; torch threads {f['torch_threads']}; SYCL CPU "
              f"device {f['compute_units']} compute units; threads by allowed CPUs {f['threads_by_cpus']}; SSM cache "
              f"{f['ssm_dtype']}")
    print("| case | calls | vLLM CPU core ms (p25-p75) | libgdn_xpu via plugin ms (p25-p75) | plugin alone ms | "
          "vLLM / plugin | plugin / alone |")
    print("|---|---|---|---|---|---|---|")
    by_case = {}
    for name in names:
        prompts, _, _, mtp = CASES[name]
        want = ((sum(prompts), 1, 0, 0) if name.startswith("prefill") else (None, 0, 0, len(prompts)) if mtp
                else (len(prompts), 0, len(prompts), 0))  # (tokens, prefills, decodes, spec decodes) of a call
        got = by_case[name] = [r for r in rows if all(w is None or w == g for w, g in zip(want, r))]
        if not got:  # (e.g. the KV cache held fewer sequences than asked for)
            print(f"| {name} | 0 | - | - | - | - | - |", flush=True)
            continue
        v, p, a = (quartiles_ms([r[i] for r in got]) for i in (4, 5, 6))
        print(f"| {name} | {len(got)} | {v[0]:.3f} ({v[1]:.3f}-{v[2]:.3f}) | {p[0]:.3f} ({p[1]:.3f}-{p[2]:.3f}) | "
              f"{a[0]:.3f} | {v[0] / p[0]:.2f}x | {p[0] / a[0]:.2f}x |", flush=True)
    if profile:
        print("\nwhere a plugin call's time goes, in the engine / alone (medians, ms; glue: the rest of the call)")
        print("| case | " + " | ".join(PIECES) + " | whole call |")
        print("|---" * (len(PIECES) + 2) + "|")
        for name, got in by_case.items():
            if got:
                cells = [f"{statistics.median(piece(r[i], r[5 if i == 7 else 6], k) for r in got) * 1e3:.3f}"
                         for k in PIECES for i in (7, 8)]
                whole = [f"{statistics.median(r[i] for r in got) * 1e3:.3f}" for i in (5, 6)]
                print(f"| {name} | " + " | ".join(f"{cells[2 * j]} / {cells[2 * j + 1]}" for j in range(len(PIECES)))
                      + f" | {whole[0]} / {whole[1]} |", flush=True)


PIECES = ("step batch", "rebind", "C call", "wait", "glue")


def piece(pieces, whole, name):
    """Seconds of one piece of a plugin call (profile_pieces); "glue": what the others leave of the whole."""
    return whole - sum(pieces.get(k, 0.0) for k in PIECES[:-1]) if name == "glue" else pieces.get(name, 0.0)


def generate_table(model, tmp, rounds, concurrency):
    tps = {}  # (mtp, side, concurrency) -> [tokens/s]
    for r in range(rounds):
        for mtp in (0, 2):
            for side in (("vllm", "plugin") if r % 2 == 0 else ("plugin", "vllm")):
                got = spawn("tokens_per_s", dict(model=model, mtp=mtp, concurrency=concurrency,
                                                 out=os.path.join(tmp, "tps.json")), side == "plugin", True)
                for c, v in got.items():
                    tps.setdefault((mtp, side, int(c)), []).append(v)
    print("\n| generate, 64 tokens a sequence | vLLM CPU core tok/s (min-max) | plugin tok/s (min-max) | plugin / vLLM |")
    print("|---|---|---|---|")
    for mtp in (0, 2):
        for c in concurrency:
            v, p = tps[(mtp, "vllm", c)], tps[(mtp, "plugin", c)]
            print(f"| concurrency {c}{', MTP k=2' if mtp else ''} | {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
                  f" | {statistics.median(p):.1f} ({min(p):.1f}-{max(p):.1f}) | "
                  f"{statistics.median(p) / statistics.median(v):.2f}x |", flush=True)
    print(f"({rounds} alternating processes per side and row; MTP: verifier acceptance cycling through 0..2 drafts)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2, help="generate tokens/s: processes per side, alternating")
    p.add_argument("--quick", action="store_true", help=f"fewer cases ({', '.join(QUICK)}), one generate round")
    p.add_argument("--inprocess", action="store_true", help="also the per-call table with the in-process engine")
    p.add_argument("--skip-generate", action="store_true", help="no generate tokens/s table")
    p.add_argument("--profile", action="store_true", help="also where the plugin's calls spend their time")
    p.add_argument("--cases", help="comma list of the per-call cases to run (default: all, or --quick's)")
    p.add_argument("--child", nargs=2)
    args = p.parse_args()
    if args.child:
        return {"per_call": per_call, "tokens_per_s": tokens_per_s}[args.child[0]](json.loads(args.child[1]))
    import platform
    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "model")
    os.makedirs(model)
    json.dump(dict(CONFIG, **SHAPES), open(os.path.join(model, "config.json"), "w"))
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = open("/proc/cpuinfo").read()
    print(f"host: {cpu} ({platform.machine()}), avx512f={'avx512f' in flags}, avx512_bf16={'avx512_bf16' in flags}, "
          f"amx_tile={'amx_tile' in flags}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
    names = args.cases.split(",") if args.cases else [n for n in CASES if not args.quick or n in QUICK]
    print("\nper GDN call, vLLM's default (multiprocess) engine:")
    per_call_table(model, tmp, names, True, args.profile)
    if args.inprocess:
        print("\nper GDN call, in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0):")
        per_call_table(model, tmp, names, False, args.profile)
    if not args.skip_generate:
        generate_table(model, tmp, 1 if args.quick else args.rounds, (1, 8))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


# vLLM's engine and worker processes (spawned) import this file as their main module: the process that
# runs the model times its calls (ROWS_ENV), and its verifier cycles acceptance (ACCEPT_ENV).
if os.environ.get(ROWS_ENV):
    install_timer(os.environ[ROWS_ENV])
if os.environ.get(ACCEPT_ENV):
    run_vllm.cycle_acceptance()

if __name__ == "__main__":
    main()
