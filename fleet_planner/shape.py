"""A model's shape: the numbers the planner needs, read from a Hugging Face ``config.json``.

Multimodal configs nest the language model under ``text_config`` (Gemma 3, Llava, Mistral 3),
``llm_config`` or ``language_config``; its keys win over the top level, which still supplies
``torch_dtype`` and ``tie_word_embeddings`` when the nested part leaves them out. A
``vision_config`` is counted as a ViT tower (see ``fleet_planner.params``). Keys a config leaves
out fall back to the defaults of its transformers config class where the planner knows them
(Gemma 3 omits its head counts, for example).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fleet_planner.precision import Precision, parse_precision, precision_from_quantization
from fleetspec.errors import ConfigError


@dataclass(frozen=True)
class MoeShape:
    experts: int  # routed experts per MoE layer
    experts_per_token: int
    expert_intermediate: int  # FFN width of one expert
    shared_intermediate: int = 0  # total FFN width of the always-on shared expert(s)
    dense_layers: int = 0  # leading layers with a dense FFN (DeepSeek's first_k_dense_replace)


@dataclass(frozen=True)
class MlaShape:
    """DeepSeek's multi-head latent attention: one compressed latent per token and layer."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class VisionShape:
    hidden: int
    intermediate: int
    layers: int
    patch_size: int
    image_size: int


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int | None = None  # dense FFN width (gated: gate, up, down)
    tie_embeddings: bool = False
    torch_dtype: Precision | None = None
    quantization: Precision | None = None  # from quantization_config
    moe: MoeShape | None = None
    mla: MlaShape | None = None
    vision: VisionShape | None = None
    sliding_window: int | None = None
    sliding_layers: int = 0  # layers whose KV only ever holds sliding_window tokens
    max_position: int | None = None
    model_type: str = ""
    params: int | None = None  # given explicitly (--params); else counted from the shape
    source: str = "command line"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def with_overrides(self, **kw: Any) -> ModelShape:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


# transformers' Gemma3TextConfig defaults: the published Gemma 3 config.json files omit these.
_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
                    "sliding_window_pattern": 6, "tie_word_embeddings": True},
    "gemma2": {"sliding_window_pattern": 2, "tie_word_embeddings": True},
    "gemma": {"tie_word_embeddings": True},
}
_TEXT_KEYS = ("text_config", "llm_config", "language_config")


def _first(cfg: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


def _int(cfg: dict[str, Any], source: str, *keys: str, required: bool = True) -> int | None:
    value = _first(cfg, *keys)
    if value is None:
        if required:
            also = ", ".join(keys[1:]) or "nothing else"
            raise ConfigError(f"{source}: {keys[0]}: missing (also looked for {also}); add it to this config")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{source}: {keys[0]}: expected a positive integer, got {value!r}; fix it in this config")
    return value


def _text_part(config: dict[str, Any]) -> dict[str, Any]:
    inherited = ("torch_dtype", "dtype", "tie_word_embeddings", "quantization_config")
    merged: dict[str, Any] = {k: config[k] for k in inherited if k in config}
    for key in _TEXT_KEYS:
        if isinstance(config.get(key), dict):
            merged.update(config[key])
            return merged
    return dict(config)


def _moe(cfg: dict[str, Any], source: str, intermediate: int | None) -> MoeShape | None:
    experts = _int(cfg, source, "num_local_experts", "num_experts", "n_routed_experts", required=False)
    if not experts or experts <= 1:
        return None
    width = _int(cfg, source, "moe_intermediate_size", "intermediate_size", required=False) or intermediate
    if width is None:
        raise ConfigError(f"{source}: moe_intermediate_size: missing for a model with {experts} experts; add it to "
                          "this config")
    shared = _int(cfg, source, "shared_expert_intermediate_size", required=False) or 0
    n_shared = _int(cfg, source, "n_shared_experts", required=False) or 0
    dense = _int(cfg, source, "first_k_dense_replace", required=False) or len(cfg.get("mlp_only_layers") or [])
    return MoeShape(experts=experts,
                    experts_per_token=_int(cfg, source, "num_experts_per_tok", "moe_topk", required=False) or 1,
                    expert_intermediate=width, shared_intermediate=shared or n_shared * width, dense_layers=dense)


def _mla(cfg: dict[str, Any], source: str) -> MlaShape | None:
    rank = _int(cfg, source, "kv_lora_rank", required=False)
    if rank is None:
        return None
    return MlaShape(kv_lora_rank=rank, q_lora_rank=_int(cfg, source, "q_lora_rank", required=False),
                    qk_nope_head_dim=_int(cfg, source, "qk_nope_head_dim") or 0,
                    qk_rope_head_dim=_int(cfg, source, "qk_rope_head_dim") or 0,
                    v_head_dim=_int(cfg, source, "v_head_dim") or 0)


def _vision(config: dict[str, Any], source: str) -> VisionShape | None:
    vc = config.get("vision_config")
    if not isinstance(vc, dict) or vc.get("hidden_size") is None:
        return None
    where = f"{source}: vision_config"
    return VisionShape(hidden=_int(vc, where, "hidden_size") or 0,
                       intermediate=_int(vc, where, "intermediate_size") or 0,
                       layers=_int(vc, where, "num_hidden_layers", "depth") or 0,
                       patch_size=_int(vc, where, "patch_size", required=False) or 14,
                       image_size=_int(vc, where, "image_size", required=False) or 224)


def _sliding_layers(cfg: dict[str, Any], layers: int) -> tuple[int | None, int]:
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or window <= 0 or cfg.get("use_sliding_window") is False:
        return None, 0
    types = cfg.get("layer_types")
    if isinstance(types, list):
        return window, sum(1 for t in types if t == "sliding_attention")
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 0:
        return window, layers - layers // pattern  # every pattern-th layer is global
    return window, layers  # Mistral-style: every layer slides


def shape_from_config(config: dict[str, Any], source: str = "config.json") -> ModelShape:
    cfg = _text_part(config)
    model_type = str(cfg.get("model_type") or config.get("model_type") or "")
    for key, value in _TYPE_DEFAULTS.get(model_type, {}).items():
        cfg.setdefault(key, value)
    layers = _int(cfg, source, "num_hidden_layers", "n_layer", "num_layers", "n_layers") or 0
    hidden = _int(cfg, source, "hidden_size", "n_embd", "d_model", "dim") or 0
    heads = _int(cfg, source, "num_attention_heads", "n_head", "num_heads", "n_heads") or 0
    kv_heads = _int(cfg, source, "num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num",
                    required=False) or heads
    head_dim = _int(cfg, source, "head_dim", "kv_channels", required=False) or hidden // heads
    vocab = _int(cfg, source, "vocab_size", "padded_vocab_size")
    intermediate = _int(cfg, source, "intermediate_size", "ffn_hidden_size", "n_inner", required=False)
    notes: list[str] = []
    if model_type == "qwen" and intermediate:  # Qwen 1: w1 and w2 are each intermediate_size / 2 wide
        intermediate //= 2
    if intermediate is None:
        intermediate = 4 * hidden
        notes.append(f"{source}: intermediate_size missing; assumed 4 × hidden_size = {intermediate}")
    dtype_text = _first(cfg, "torch_dtype", "dtype")
    torch_dtype = parse_precision(str(dtype_text), f"{source}: torch_dtype") if dtype_text else None
    if torch_dtype is None and cfg.get("bf16") is True:
        torch_dtype = Precision.BF16
    qc = cfg.get("quantization_config")
    quantization = precision_from_quantization(qc) if isinstance(qc, dict) else None
    window, sliding = _sliding_layers(cfg, layers)
    return ModelShape(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab or 0,
        intermediate=intermediate, tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        torch_dtype=torch_dtype, quantization=quantization, moe=_moe(cfg, source, intermediate),
        mla=_mla(cfg, source), vision=_vision(config, source), sliding_window=window, sliding_layers=sliding,
        max_position=_int(cfg, source, "max_position_embeddings", "seq_length", "n_positions", required=False),
        model_type=model_type, source=source, notes=tuple(notes),
    )


def config_path(model: str) -> Path | None:
    """The config.json for ``model`` when it is a local directory or file, else None (a model id)."""
    p = Path(model)
    if p.is_dir():
        return p / "config.json"
    if p.is_file():
        return p
    return None


def load_shape(path: Path) -> ModelShape:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"--model: cannot read {path}: {e.strerror or e}; check the path and its permissions") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"--model: {path} is not valid JSON: {e}; fix the file, or give a model id and the shape "
                          "flags") from e
    if not isinstance(data, dict):
        raise ConfigError(f"--model: {path}: expected a JSON object, got {type(data).__name__}")
    return shape_from_config(data, str(path))
