"""The tiny models of the integration tests, as config.json files (vLLM fills their weights: load_format
"dummy"): Qwen3-Next, Qwen3.5 dense and Qwen3.5 MoE, each with one MTP layer. Used by conftest.py,
run_vllm.py, serve.py and soak_serve.py (plain Python: no pytest, no vLLM imported)."""
import json
import os

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


# Qwen3.5's text models, shrunk alike: GDN layers as above, layer_types 3 linear + 1 full attention, one MTP
# layer (mtp_num_hidden_layers); the MoE one with Qwen3-Next's 4 experts top-2 and a shared expert.
_QWEN3_5 = {key: CONFIG[key] for key in (
    "torch_dtype", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "hidden_act", "rms_norm_eps",
    "tie_word_embeddings", "bos_token_id", "eos_token_id", "attention_bias", "attention_dropout")}
_QWEN3_5.update(layer_types=["linear_attention"] * 3 + ["full_attention"], mtp_num_hidden_layers=1,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
QWEN3_5 = dict(_QWEN3_5, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text")
QWEN3_5_MOE = dict(_QWEN3_5, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text",
                   **{key: CONFIG[key] for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                                   "shared_expert_intermediate_size")})
# Qwen3-Next with every expert routed (top-4 of 4): no top-k choice to flip at a near-tie of the router's
# scores, so along one trajectory the logits move with the layers' rounding alone (test_vllm.py compares
# them; with top-2 a tie flipped by bf16 rounding moves one token's logits by a nat or more).
ALL_EXPERTS = dict(CONFIG, num_experts_per_tok=CONFIG["num_experts"])
MODELS = {"qwen3_next": CONFIG, "qwen3_next_all_experts": ALL_EXPERTS, "qwen3_5": QWEN3_5,
          "qwen3_5_moe": QWEN3_5_MOE}


def write_model(folder, name):
    """A model folder (config.json only: vLLM's dummy weights) of one of MODELS; returns its path."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(MODELS[name], f, indent=1)
    return str(folder)


def speculative_config(k):
    """vLLM's speculative_config for MTP with k draft tokens ("mtp": vLLM 0.32 maps the per-model names,
    qwen3_next_mtp and qwen3_5_mtp, to it)."""
    return {"method": "mtp", "num_speculative_tokens": k}
