"""The tiny Qwen3-Next of the integration tests and the runs of vLLM on it (each in a process of its own:
vLLM reads its plugins and settings once per process). Needs the environment of
`tests/setup_and_run.sh integration` (vLLM's CPU build beside pygdn)."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# Qwen3-Next's architecture, shrunk: 4 layers, every 4th full attention (3 GDN layers), GDN heads 2 k / 4 v
# of dim 64 (conv width 4), 4 experts top-2 with a shared expert, one MTP layer.
CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "torch_dtype": "bfloat16",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "full_attention_interval": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "partial_rotary_factor": 0.25, "rope_theta": 10000.0, "max_position_embeddings": 2048,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64,
    "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128, "decoder_sparse_step": 1, "norm_topk_prob": True,
    "mlp_only_layers": [], "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False, "attention_dropout": 0.0,
}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3_next_tiny")
    (d / "config.json").write_text(json.dumps(CONFIG, indent=1))
    return str(d)


def engine_env(plugin):
    """The environment of one vLLM process: in-process engine, a small KV cache, Intel OpenMP preloaded
    as vLLM's CPU build wants it, and the plugin's switch."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_LOGGING_LEVEL="INFO")
    iomp = os.path.join(sys.prefix, "lib", "libiomp5.so")
    if os.path.exists(iomp):
        env["LD_PRELOAD"] = iomp
    env.pop("GDN_XPU_VLLM", None)
    if plugin:
        env["GDN_XPU_VLLM"] = "1"
    return env


def run_vllm(tmp_path, model, name, plugin, *args, env=None):
    """Runs run_vllm.py (env: more environment variables); returns (its JSON result, its log)."""
    out = tmp_path / f"{name}.json"
    p = subprocess.run([sys.executable, os.path.join(HERE, "run_vllm.py"), str(out), model, *map(str, args)],
                       env=dict(engine_env(plugin), **(env or {})), capture_output=True, text=True, timeout=1800,
                       cwd=str(tmp_path))
    log = p.stdout + p.stderr
    if p.returncode:
        raise AssertionError(f"vLLM run {name} failed ({p.returncode}):\n{log[-6000:]}")
    return json.load(open(out)), log
