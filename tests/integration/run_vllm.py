"""One vLLM run of a tiny model (models.py: Qwen3-Next, Qwen3.5, Qwen3.5-MoE): greedy generation from
fixed prompts, written as JSON. Run in a process of its own (conftest.run_vllm), with GDN_XPU_VLLM=1 for
the plugin or without it for vLLM's own CPU kernels:

    python run_vllm.py OUT.json MODEL_DIR [--mtp K] [--prefix-caching] [--force TOKENS.json] [--noise X] [--shadow]
        [--accept-cycle] [--ssm-dtype DTYPE] [--tp N]

--force: a logits processor makes the engine emit the given tokens (the other run's), so both runs walk
the same trajectory; the logprobs vLLM reports are the raw model's (before processors), so each step
compares the two implementations' model on the same history. --noise: Gaussian noise of X times the
output's RMS added to every GDN core output (a deliberately perturbed core, to show the comparison
notices one). --shadow: every served core call is also run by vLLM's own core on the same inputs and
cache contents (see shadow()); the differences are in the JSON. --ssm-dtype: vLLM's mamba_ssm_cache_dtype.
--tp: tensor_parallel_size (vLLM's worker processes, each loading the plugin; with --shadow each checks
its own calls, in "shadow_ranks"; --noise wraps this process's core only).

Without torchvision (tests/setup_and_run.sh integration removes the registry's CUDA build, as the README
says), vLLM 0.32's Qwen3.5 model code still imports it at module level, only to take `smart_resize` from
transformers' Qwen2-VL image processor: this process gives it transformers' PIL twin of that module,
which defines the same function without torchvision (without_torchvision()), and vLLM's inspection of
the model class, which it runs in a fresh Python process, runs in this one. A text-only model runs no
image processing.
"""
import argparse
import importlib
import importlib.util
import json
import os
import sys
import time

from models import speculative_config

PROMPTS, PROMPT_SEED, MAX_TOKENS = 4, 7, 64
KV_CACHE_BYTES = 64 << 20
WEIGHT_RANGE = 0.1  # dummy weights U(-0.1, 0.1): O(1) activations (vLLM's default 1e-3 makes them ~1e-11)
WIDE_ENV = "RUN_VLLM_WIDE_WEIGHTS"  # set by main(): vLLM's worker processes widen their dummy weights too
SHADOW_ENV = "RUN_VLLM_SHADOW_DIR"  # set by main() with --shadow --tp N: where each worker writes its rows


def prompts(vocab):
    import random
    rng = random.Random(PROMPT_SEED)
    return [[rng.randrange(1, vocab) for _ in range(n)] for n in (5, 17, 40, 96)][:PROMPTS]


def without_torchvision():
    """See the module's docstring: transformers' torchvision-free module stands in for the one vLLM's
    Qwen3.5 code imports, in this process, when torchvision is not installed."""
    if importlib.util.find_spec("torchvision") is None:
        name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
        sys.modules.setdefault(name, importlib.import_module(name.replace("processing_", "processing_pil_")))
        from vllm.model_executor.models import registry
        registry._run_in_subprocess = lambda inspect: inspect()


def widen_dummy_weights():
    from vllm.model_executor.model_loader import dummy_loader
    init = dummy_loader.initialize_single_dummy_weight

    def wide(param, low=-WEIGHT_RANGE, high=WEIGHT_RANGE, seed=1234):
        init(param, low=low, high=high, seed=seed)
    dummy_loader.initialize_single_dummy_weight = wide


def add_noise(scale):
    """Wrap the served GDN core: out += scale * rms(out) * N(0, 1), fixed seed."""
    import torch
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as cpu_ops
    core = cpu_ops.cpu_gdn_attention_core
    gen = torch.Generator().manual_seed(5)

    def noisy(mixed_qkv, b, a, core_attn_out, layer_name):
        core(mixed_qkv, b, a, core_attn_out, layer_name)
        o = core_attn_out.float()
        o += scale * o.pow(2).mean().sqrt() * torch.randn(o.shape, generator=gen)
        core_attn_out.copy_(o)
    from vllm.utils.torch_utils import LayerNameType
    noisy.__annotations__ = dict(mixed_qkv=torch.Tensor, b=torch.Tensor, a=torch.Tensor, core_attn_out=torch.Tensor,
                                 layer_name=LayerNameType, **{"return": None})  # the op's schema
    cpu_ops.cpu_gdn_attention_core = noisy


def shadow(native, stats):
    """Wrap the served GDN core: after each call, run vLLM's own core (native) on the same inputs from the
    same cache contents, record how far the two outputs and caches are apart, and continue on the served
    core's results. stats gets one row per call: [tokens, num_accepted_tokens of its spec sequences, out, conv, ssm] (RMS differences relative
    to the RMS of vLLM's values)."""
    import torch
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as cpu_ops
    from vllm.utils.torch_utils import LayerNameType
    from pygdn.vllm import layer_step
    served = cpu_ops.cpu_gdn_attention_core

    def rel(got, want):
        got, want = got.float(), want.float()
        return float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt().clamp_min(1e-30))

    def checked(mixed_qkv, b, a, core_attn_out, layer_name):
        layer, md = layer_step(layer_name)
        if md is None:
            return served(mixed_qkv, b, a, core_attn_out, layer_name)
        conv, ssm = layer.kv_cache[0], layer.kv_cache[1]
        slots = [t.reshape(-1)[:k] for t, k in ((md.non_spec_state_indices_tensor, md.num_prefills + md.num_decodes),
                                                (md.spec_state_indices_tensor, None)) if t is not None]
        slots = torch.cat(slots).long().unique()  # every slot the step may read or write
        before = [conv[slots].clone(), ssm[slots].clone()]
        served(mixed_qkv, b, a, core_attn_out, layer_name)
        mine = [core_attn_out.clone(), conv[slots].clone(), ssm[slots].clone()]
        conv[slots], ssm[slots] = before
        theirs = torch.zeros_like(core_attn_out)
        native(mixed_qkv, b, a, theirs, layer_name)
        n = md.num_actual_tokens
        accepted = [] if md.num_accepted_tokens is None else md.num_accepted_tokens[:md.num_spec_decodes].tolist()
        stats.append([n, accepted, rel(mine[0][:n], theirs[:n]), rel(mine[1], conv[slots]),
                      rel(mine[2], ssm[slots])])
        core_attn_out.copy_(mine[0])
        conv[slots], ssm[slots] = mine[1], mine[2]
    checked.__annotations__ = dict(mixed_qkv=torch.Tensor, b=torch.Tensor, a=torch.Tensor, core_attn_out=torch.Tensor,
                                   layer_name=LayerNameType, **{"return": None})  # the op's schema
    cpu_ops.cpu_gdn_attention_core = checked


class _Dumped(list):
    """shadow()'s rows of a worker process, written to a file of its own after every row (workers end
    without running exit handlers)."""

    def __init__(self, folder):
        super().__init__()
        self.path = os.path.join(folder, f"{os.getpid()}.json")

    def append(self, row):
        super().append(row)
        with open(self.path + ".tmp", "w") as f:
            json.dump(list(self), f)
        os.replace(self.path + ".tmp", self.path)


def worker_shadow(folder):
    """shadow() in a vLLM worker process: its rows go to folder (see main)."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as cpu_ops
    from vllm.plugins import load_general_plugins
    native = cpu_ops.cpu_gdn_attention_core
    load_general_plugins()
    shadow(native, _Dumped(folder))


def cycle_acceptance():
    """Make the verifier accept (step + request) % (drafts + 1) drafts of each request at each step, so the
    spec path runs with num_accepted_tokens cycling through 1..1+drafts (a dummy-weight draft model's
    guesses are all rejected otherwise); the token after the accepted drafts is the target's greedy one."""
    from vllm.v1.sample import rejection_sampler as rs
    sample, step = rs.rejection_sample, [0]

    def forced(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
               bonus_token_ids, *args, **kwargs):
        out = sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                     target_logits, bonus_token_ids, *args, **kwargs)
        start = 0
        for i, n in enumerate(num_draft_tokens):
            take = (step[0] + i) % (n + 1)
            out[i].fill_(rs.PLACEHOLDER_TOKEN_ID)
            out[i, :take] = draft_token_ids[start:start + take]
            out[i, take] = target_logits[start + take].argmax() if take < n else bonus_token_ids[i, 0]
            start += n
        step[0] += 1
        return out
    rs.rejection_sample = forced


FORCE_ENV = "RUN_VLLM_FORCE"  # the --force file, for the processes that load Force (vLLM's workers)


def _force_class():
    """A vLLM v1 logits processor class that emits the tokens of the file named by FORCE_ENV,
    [request index][step]. Module level, built at import: vLLM's worker processes (tensor_parallel_size
    > 1) unpickle it by name, after importing this file as their main module."""
    import torch
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

    class Force(LogitsProcessor):
        def __init__(self, vllm_config, device, is_pin_memory):
            self.forced = json.load(open(os.environ[FORCE_ENV]))["tokens"]
            self.rows = {}  # batch row -> (trajectory, tokens emitted so far)

        def is_argmax_invariant(self):
            return False

        def update_state(self, update: BatchUpdate | None):
            if update is None:
                return
            for index in update.removed:  # (in vLLM's order: removed, added, moved)
                self.rows.pop(index, None)
            for index, params, _, output_ids in update.added:
                self.rows[index] = (self.forced[params.extra_args["trajectory"]], output_ids)
            for a, b, direction in update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if rb is not None and direction.name == "SWAP":
                    self.rows[a] = rb

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            for row, (trajectory, out) in self.rows.items():
                step = len(out)
                if row < logits.shape[0] and step < len(trajectory):
                    logits[row].fill_(float("-inf"))
                    logits[row, trajectory[step]] = 0.0
            return logits
    Force.__qualname__ = "Force"
    return Force


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("model")
    p.add_argument("--mtp", type=int, default=0)
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--force")
    p.add_argument("--noise", type=float, default=0.0)
    p.add_argument("--shadow", action="store_true", help="compare every served core call with vLLM's own")
    p.add_argument("--accept-cycle", action="store_true", help="accept 0..K drafts in turn (with --mtp K)")
    p.add_argument("--ssm-dtype", help="vLLM's mamba_ssm_cache_dtype (default: vLLM's)")
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    args = p.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    os.environ[WIDE_ENV] = "1"
    widen_dummy_weights()
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as cpu_ops
    native, stats = cpu_ops.cpu_gdn_attention_core, []
    if args.shadow and args.tp > 1:  # the workers run the model: they check their calls
        os.environ[SHADOW_ENV] = shadow_dir = args.out + ".shadow"
        os.makedirs(shadow_dir, exist_ok=True)
        args.shadow = False
    if args.noise or args.shadow:  # wrap the core that is served (the plugin's, once it registered)
        from vllm.plugins import load_general_plugins
        load_general_plugins()
    if args.noise:
        add_noise(args.noise)
    if args.shadow:
        shadow(native, stats)
    if args.accept_cycle:
        cycle_acceptance()
    if args.force:
        os.environ[FORCE_ENV] = os.path.abspath(args.force)
        global Force
        Force = _force_class()
    kw = dict(model=args.model, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
              max_model_len=512, seed=0, enable_prefix_caching=args.prefix_caching, max_num_seqs=8,
              kv_cache_memory_bytes=KV_CACHE_BYTES)
    if args.prefix_caching:
        kw["mamba_cache_mode"] = "align"
    if args.ssm_dtype:
        kw["mamba_ssm_cache_dtype"] = args.ssm_dtype
    if args.tp > 1:
        kw["tensor_parallel_size"] = args.tp
    if args.mtp:
        kw["speculative_config"] = speculative_config(args.mtp)
    if args.force:
        kw["logits_processors"] = [Force]
    t0 = time.perf_counter()
    llm = LLM(**kw)
    t_load = time.perf_counter() - t0
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    ps = prompts(vocab)
    sp = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2, detokenize=False,
                         extra_args={"trajectory": i}) for i in range(len(ps))]
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=q) for q in ps], sp, use_tqdm=False)
    t_gen = time.perf_counter() - t0
    result = {"tokens": [], "logprobs": [], "top": [], "load_s": t_load, "generate_s": t_gen, "shadow": stats}
    for o in outs:
        c = o.outputs[0]
        result["tokens"].append(list(c.token_ids))
        result["logprobs"].append([step[t].logprob for t, step in zip(c.token_ids, c.logprobs)])
        result["top"].append([sorted(((v.logprob, k) for k, v in step.items()), reverse=True)[:2] for step in c.logprobs])
    if os.environ.get(SHADOW_ENV):
        result["shadow_ranks"] = [json.load(open(os.path.join(shadow_dir, f))) for f in sorted(os.listdir(shadow_dir))
                                  if f.endswith(".json")]
    json.dump(result, open(args.out, "w"))


# vLLM's worker processes (tensor_parallel_size > 1) import this file as their main module: what main()
# set up in this process, they set up here.
without_torchvision()
if os.environ.get(WIDE_ENV):
    widen_dummy_weights()
if FORCE_ENV in os.environ:
    Force = _force_class()
if os.environ.get(SHADOW_ENV):
    worker_shadow(os.environ[SHADOW_ENV])

if __name__ == "__main__":
    main()
