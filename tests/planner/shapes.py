"""Model configs as published in each model's config.json on the Hugging Face Hub, written out
here so that nothing is downloaded. Keys a published file leaves to its transformers config class
are marked; values are from memory of the published files and the model cards (parameter counts
in the comments are the cards' figures, to compare the planner's count against).
"""

from __future__ import annotations

from typing import Any

# google/gemma-3-4b-it (4.3 B on the card). The published text_config omits the head counts,
# head_dim and vocab_size: Gemma3TextConfig's defaults (8 heads, 4 KV heads, head_dim 256,
# vocab 262208, every 6th layer global) apply, and the planner knows them.
GEMMA3_4B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}

# google/gemma-3-12b-it (12.2 B): 48 layers, 16 heads, 8 KV heads of 256, hidden 3840.
GEMMA3_12B: dict[str, Any] = {
    **GEMMA3_4B,
    "text_config": {"hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
                    "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
}

# google/gemma-3-27b-it (27.4 B): 62 layers, 32 heads, 16 KV heads of 128 (32 × 128 = 4096, not the
# hidden size 5376), query_pre_attn_scalar 168 = 5376 / 32.
GEMMA3_27B: dict[str, Any] = {
    **GEMMA3_4B,
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
}

# Qwen/Qwen2.5-72B-Instruct (72.7 B): untied embeddings, GQA 64/8.
QWEN25_72B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "bfloat16",
    "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80, "num_attention_heads": 64,
    "num_key_value_heads": 8, "vocab_size": 152064, "max_position_embeddings": 32768, "tie_word_embeddings": False,
    "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 70, "rope_theta": 1000000.0,
}

# meta-llama/Llama-3.1-70B-Instruct (70.6 B): untied embeddings, GQA 64/8.
LLAMA31_70B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
    "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "rope_theta": 500000.0,
}

# Qwen/Qwen-72B (the first Qwen, 72 B): full multi-head attention (no num_key_value_heads),
# head size in kv_channels, intermediate_size counts both halves of the gated FFN (w1, w2 are
# 24576 wide each), "bf16": true instead of torch_dtype.
QWEN_72B: dict[str, Any] = {
    "architectures": ["QWenLMHeadModel"], "model_type": "qwen", "bf16": True,
    "hidden_size": 8192, "intermediate_size": 49152, "num_hidden_layers": 80, "num_attention_heads": 64,
    "kv_channels": 128, "vocab_size": 152064, "seq_length": 32768, "max_position_embeddings": 32768,
    "no_bias": True, "tie_word_embeddings": False,
}

# mistralai/Mixtral-8x7B-v0.1 (46.7 B total, 12.9 B active).
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "torch_dtype": "bfloat16",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
    "tie_word_embeddings": False, "sliding_window": None,
}

# Qwen/Qwen3-30B-A3B (30.5 B total, 3.3 B active).
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "torch_dtype": "bfloat16",
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "num_experts": 128, "num_experts_per_tok": 8, "tie_word_embeddings": False, "mlp_only_layers": [],
}

# Qwen/Qwen2.5-7B-Instruct (7.6 B): 28 heads, 4 KV heads (TP must divide 28: 1, 2, 4, 7, 14, 28).
QWEN25_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "bfloat16",
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
}
