"""vLLM's CPU build serving the tiny Qwen3-Next (models.py) with its GDN attention core on libgdn_xpu
(pygdn.vllm, GDN_XPU_VLLM=1): greedy generation of 64 tokens for 4 prompts, against vLLM's own CPU kernels.

The criteria.
- Every served core call, checked in the engine (run_vllm.py --shadow): vLLM's own core is run on the
  same inputs and cache contents right after ours, and the outputs and the touched cache slots must
  agree to bf16 rounding (RMS difference <= OUT_BOUND of the RMS; conv states exactly: they hold inputs).
  The engine goes on with the plugin's results. A core with 5% noise fails the same check.
- Token ids: a random-weight model is chaotic (two correct implementations that round differently emit
  the same tokens until a near-tie flips one, then the histories differ). So the unforced runs must agree
  up to a first divergence at which vLLM's own top-2 logprobs are within TIE; and the plugin, forced along
  vLLM's trajectory (run_vllm.py --force: both models see the same history), must give every step's
  logprob within LOGPROB_BOUND of vLLM's (logits are bf16: ~0.03 apart at these magnitudes). These runs
  route every token to all 4 experts (models.ALL_EXPERTS): with top-2 routing a near-tie of the router's
  scores, flipped by rounding, moves that one token's logits by a nat or more.
- MTP k=2 with the verifier's acceptance cycled through 1..3 tokens (run_vllm.py --accept-cycle); prefix
  caching in vLLM's 'align' mode (without MTP: vLLM 0.32's CPU build cannot run both); a bf16 SSM state
  cache (mamba_ssm_cache_dtype, which vLLM's CPU build keeps on hosts with AVX512-BF16); tensor_parallel_size
  2 (vLLM's two worker processes, each serving its shard and checking its own calls); MTP with vLLM's
  dim-first conv state (VLLM_SSM_CONV_STATE_LAYOUT=DS)."""
import os

import numpy as np
import pytest

from conftest import run_vllm
from models import write_model

OUT_BOUND = 2e-2      # RMS difference of core outputs and SSM states, relative to vLLM's RMS
NOISE = 0.05          # the perturbed core's noise, relative to its output's RMS
LOGPROB_BOUND = 0.25  # nats, forced steps (~8 bf16 ulps of the logits)
TIE = 0.25            # nats between vLLM's own top-2 where a greedy token may flip
SERVES = "serves the GDN attention core of 3 layers"


def shadow_max(run):
    """(calls, max out difference, max conv difference, max ssm difference) of a --shadow run."""
    rows = run["shadow"]
    m = np.array([[r[2], r[3], r[4]] for r in rows]).max(0)
    return len(rows), *m


def first_divergences(ref, got):
    """[(prompt, step, vLLM's top-2 margin there)] for each prompt whose token ids differ."""
    out = []
    for i, (r, g) in enumerate(zip(ref["tokens"], got["tokens"])):
        step = next((j for j, (x, y) in enumerate(zip(r, g)) if x != y), None)
        if step is not None:
            (l1, _), (l2, _) = ref["top"][i][step][:2]
            out.append((i, step, l1 - l2))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    model_dir = write_model(tmp / "qwen3_next_all_experts", "qwen3_next_all_experts")
    ref, _ = run_vllm(tmp, model_dir, "vllm", False)
    plug, log = run_vllm(tmp, model_dir, "plugin", True, "--shadow")
    forced, _ = run_vllm(tmp, model_dir, "plugin_forced", True, "--force", tmp / "vllm.json")
    noisy, _ = run_vllm(tmp, model_dir, "plugin_noisy", True, "--shadow", "--noise", NOISE)
    return dict(ref=ref, plug=plug, log=log, forced=forced, noisy=noisy)


def test_plugin_serves_every_gdn_call_within_bf16_rounding(runs):
    assert SERVES in runs["log"], runs["log"][-3000:]
    assert [len(t) for t in runs["plug"]["tokens"]] == [64] * 4
    calls, out, conv, ssm = shadow_max(runs["plug"])
    assert calls == 3 * 64  # 3 GDN layers, a prefill step and 63 decode steps
    assert out <= OUT_BOUND and conv == 0 and ssm <= OUT_BOUND, (out, conv, ssm)


def test_check_fails_on_a_perturbed_core(runs):
    assert shadow_max(runs["noisy"])[1] > OUT_BOUND


def test_tokens_diverge_only_at_near_ties(runs):
    for prompt, step, margin in first_divergences(runs["ref"], runs["plug"]):
        assert margin < TIE, f"prompt {prompt} diverges at step {step}: vLLM's top-2 differ by {margin:.3f}"


def test_forced_logprobs_match(runs):
    assert runs["forced"]["tokens"] == runs["ref"]["tokens"], "the forcing processor did not force"
    diff = max(np.max(np.abs(np.subtract(a, b))) for a, b in zip(runs["forced"]["logprobs"], runs["ref"]["logprobs"]))
    assert diff <= LOGPROB_BOUND


def test_mtp_k2_with_acceptance_1_to_3(model_dir, tmp_path):
    got, log = run_vllm(tmp_path, model_dir, "plugin_mtp", True, "--mtp", 2, "--shadow", "--accept-cycle")
    assert SERVES in log
    accepted = {a for row in got["shadow"] for a in row[1]}
    assert accepted == {1, 2, 3}, accepted
    calls, out, conv, ssm = shadow_max(got)
    assert any(row[1] for row in got["shadow"]) and any(not row[1] for row in got["shadow"])  # spec and prefill
    assert out <= OUT_BOUND and conv == 0 and ssm <= OUT_BOUND, (out, conv, ssm)


def test_mtp_k2_with_the_dim_first_conv_state(model_dir, tmp_path):
    """VLLM_SSM_CONV_STATE_LAYOUT=DS: vLLM allocates the conv state [blocks, conv_dim, state_len] (its
    default SD: [blocks, state_len, conv_dim]); the plugin follows it (pygdn.Config conv_layout "dim_major")
    and every call, MTP steps included, agrees with vLLM's own core on that cache."""
    got, log = run_vllm(tmp_path, model_dir, "plugin_mtp_ds", True, "--mtp", 2, "--shadow", "--accept-cycle",
                        env={"VLLM_SSM_CONV_STATE_LAYOUT": "DS"})
    assert SERVES in log and "Setting SSM conv state layout to DS" in log, log[-3000:]
    assert {a for row in got["shadow"] for a in row[1]} == {1, 2, 3}
    calls, out, conv, ssm = shadow_max(got)
    assert out <= OUT_BOUND and conv == 0 and ssm <= OUT_BOUND, (out, conv, ssm)


def test_prefix_caching_align(model_dir, tmp_path):
    got, log = run_vllm(tmp_path, model_dir, "plugin_align", True, "--prefix-caching", "--shadow")
    assert SERVES in log and "'enable_prefix_caching': True" in log
    calls, out, conv, ssm = shadow_max(got)
    assert out <= OUT_BOUND and conv == 0 and ssm <= OUT_BOUND, (out, conv, ssm)


def test_bf16_ssm_cache(model_dir, tmp_path):
    got, log = run_vllm(tmp_path, model_dir, "plugin_bf16_state", True, "--ssm-dtype", "bfloat16", "--shadow")
    if "Reset SSM cache type to float32" in log:
        pytest.skip("vLLM's CPU build keeps an f32 SSM cache on this host")
    assert SERVES in log and "bf16 SSM state" in log, log[-3000:]
    calls, out, conv, ssm = shadow_max(got)
    assert calls == 3 * 64 and out <= OUT_BOUND and conv == 0 and ssm <= OUT_BOUND, (out, conv, ssm)


def test_tensor_parallel_2(model_dir, tmp_path):
    """vLLM's distributed engine: two worker processes, each serving its shard of every GDN layer (1 k-head,
    2 v-heads) through the plugin and checking each of its calls against vLLM's own core. Each worker
    gets one CPU: vLLM's automatic OpenMP binding wants a NUMA node per worker, so the binding is given."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("tensor_parallel_size=2 needs two CPUs")
    got, log = run_vllm(tmp_path, model_dir, "plugin_tp2", True, "--tp", 2, "--shadow",
                        env={"VLLM_CPU_OMP_THREADS_BIND": f"{cpus[0]}|{cpus[1]}"})
    for rank in (0, 1):
        assert any(f"Worker_TP{rank}" in line and SERVES in line for line in log.splitlines()), log[-3000:]
    assert [len(t) for t in got["tokens"]] == [64] * 4 and len(got["shadow_ranks"]) == 2
    for rows in got["shadow_ranks"]:
        calls, out, conv, ssm = shadow_max(dict(shadow=rows))
        assert calls == 3 * 64 and out <= OUT_BOUND and conv == 0 and ssm <= OUT_BOUND, (out, conv, ssm)
