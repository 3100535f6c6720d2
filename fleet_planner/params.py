"""Parameter count of a model from its shape (when ``--params`` does not give it).

Decoder-only transformer with a gated FFN (gate, up, down: 3 × hidden × width), the layout of
Llama, Qwen, Gemma, Mistral and their MoE variants. Biases and norms are small and counted only
where cheap (per-layer norms); embeddings once when tied, twice otherwise. A vision tower is a ViT
(attention 4h², MLP 2h·i per layer, patch and position embeddings) plus a one-matrix projector,
so multimodal totals are estimates to about 1%.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet_planner.shape import ModelShape, VisionShape


@dataclass(frozen=True)
class ParamCount:
    total: int
    active: int  # per token: MoE models route each token through experts_per_token experts only
    vision: int  # part of total in the vision tower and projector
    counted: bool  # False when the total was given (--params), not counted from the shape


def _attention(s: ModelShape) -> int:
    if s.mla is not None:
        m = s.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = s.hidden * m.q_lora_rank + m.q_lora_rank * s.heads * qk if m.q_lora_rank else s.hidden * s.heads * qk
        kv = s.hidden * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * s.heads * (m.qk_nope_head_dim
                                                                                           + m.v_head_dim)
        return q + kv + s.heads * m.v_head_dim * s.hidden
    q_and_o = 2 * s.hidden * s.heads * s.head_dim
    k_and_v = 2 * s.hidden * s.kv_heads * s.head_dim
    return q_and_o + k_and_v


def _vision(v: VisionShape, text_hidden: int) -> int:
    per_layer = 4 * v.hidden * v.hidden + 2 * v.hidden * v.intermediate + 9 * v.hidden
    patches = (v.image_size // v.patch_size) ** 2
    embeddings = 3 * v.patch_size * v.patch_size * v.hidden + patches * v.hidden
    return v.layers * per_layer + embeddings + v.hidden * text_hidden


def count_params(s: ModelShape) -> ParamCount:
    vision = _vision(s.vision, s.hidden) if s.vision is not None else 0
    embeddings = s.vocab * s.hidden * (1 if s.tie_embeddings else 2)
    attention = _attention(s) + 2 * s.hidden  # two norms per layer
    dense_ffn = 3 * s.hidden * (s.intermediate or 4 * s.hidden)
    if s.moe is None:
        layers = s.layers * (attention + dense_ffn)
        counted = layers + embeddings + vision
        return ParamCount(s.params or counted, s.params or counted, vision, s.params is None)
    m = s.moe
    moe_layers = s.layers - m.dense_layers
    expert = 3 * s.hidden * m.expert_intermediate
    shared = 3 * s.hidden * m.shared_intermediate
    router = s.hidden * m.experts
    common = s.layers * attention + m.dense_layers * dense_ffn + moe_layers * (shared + router) + embeddings + vision
    total = common + moe_layers * m.experts * expert
    active = common + moe_layers * m.experts_per_token * expert
    if s.params is not None:  # scale the active share onto the given total
        return ParamCount(s.params, round(s.params * active / total), vision, False)
    return ParamCount(total, active, vision, True)
