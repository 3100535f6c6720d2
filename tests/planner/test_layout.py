"""Layout by vLLM's rule, smallest fit, replicas, VRAM tier, KV arithmetic, GPU specs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleet_planner.fleetdoc import vllm_args
from fleet_planner.hardware import from_discovered, parse_gpus
from fleet_planner.layout import layout_for, tp_problem
from fleet_planner.plan import PlanRequest, make_plan, parse_count
from fleet_planner.shape import ModelShape, shape_from_config
from fleetspec.errors import ConfigError
from fleetspec.gpus import Gpu
from tests.planner import shapes


def model_dir(tmp_path: Path, config: dict[str, Any], name: str = "m") -> str:
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def shape(heads: int, kv_heads: int, layers: int = 32) -> ModelShape:
    return ModelShape(layers=layers, hidden=heads * 128, heads=heads, kv_heads=kv_heads, head_dim=128, vocab=32000)


def test_tp_must_divide_attention_heads_and_split_or_replicate_kv_heads() -> None:
    qwen7 = shape_from_config(shapes.QWEN25_7B)  # 28 heads, 4 KV heads
    assert tp_problem(qwen7, 4) is None
    assert "28 attention heads" in (tp_problem(qwen7, 8) or "")
    assert tp_problem(shape(32, 4), 8) is None  # 8 ranks, 4 KV heads: each replicated twice
    assert "KV heads" in (tp_problem(shape(12, 8), 6) or "")  # 6 divides 12 heads but not 8 KV heads


def test_single_node_tp_and_pp_when_the_count_does_not_divide_the_heads() -> None:
    qwen7 = shape_from_config(shapes.QWEN25_7B)
    one = layout_for(qwen7, 1, 8)
    assert one is not None and (one.tp, one.pp) == (1, 1)
    four = layout_for(qwen7, 4, 8)
    assert four is not None and (four.tp, four.pp, four.nodes) == (4, 1, 1)
    three = layout_for(qwen7, 3, 8)
    assert three is not None and (three.tp, three.pp) == (1, 3)
    assert "pipeline parallel" in three.reason and "vLLM's rule" in three.reason


def test_multi_node_is_tp_within_the_node_and_pp_across() -> None:
    llama = shape_from_config(shapes.LLAMA31_70B)
    two_nodes = layout_for(llama, 16, 8)
    assert two_nodes is not None and (two_nodes.tp, two_nodes.pp, two_nodes.nodes) == (8, 2, 2)
    assert layout_for(llama, 12, 8) is None  # a group spanning nodes takes whole nodes
    qwen7 = shape_from_config(shapes.QWEN25_7B)  # 8 per node does not divide 28 heads: TP=4, PP=4
    odd = layout_for(qwen7, 16, 8)
    assert odd is not None and (odd.tp, odd.pp) == (4, 4)


def test_smallest_fit_grows_with_load(tmp_path: Path) -> None:
    path = model_dir(tmp_path, shapes.LLAMA31_70B)
    light = make_plan(PlanRequest(model=path, context=2048, seqs=1, gpus="8x80GB"), lambda: [])
    heavy = make_plan(PlanRequest(model=path, context=32768, seqs=32, gpus="8x80GB"), lambda: [])
    assert light.fit is not None and light.fit.layout.gpus == 2
    assert heavy.fit is not None and heavy.fit.layout.gpus == 8 and heavy.fit.layout.tp == 8
    assert heavy.fit.need_per_gpu <= heavy.fit.budget_per_gpu
    assert heavy.fit.seqs_at_full_context >= 32
    assert any(n.startswith("7 GPUs would also fit (TP=1 x PP=7)") for n in heavy.notes)  # but 7 leaves one idle


def test_pp_within_a_node_whose_gpu_count_does_not_divide_the_heads(tmp_path: Path) -> None:
    """Qwen2.5-7B (28 heads) on a 3-GPU host: 1 GPU is too small, 3 does not divide 28, so PP=3."""
    p = make_plan(PlanRequest(model=model_dir(tmp_path, shapes.QWEN25_7B), context=8192, seqs=16, gpus="3x24GB"),
                  lambda: [])
    assert p.fit is not None and (p.fit.layout.tp, p.fit.layout.pp) == (1, 3)
    assert "does not divide the 28 attention heads" in p.fit.layout.reason
    assert any(n.startswith("2 GPUs would also fit (TP=2 x PP=1)") for n in p.notes)


def test_across_nodes_plans_but_writes_no_fleet_file(tmp_path: Path) -> None:
    p = make_plan(PlanRequest(model=model_dir(tmp_path, shapes.LLAMA31_70B), context=2048, seqs=1,
                              gpus="1x80GB", nodes=2), lambda: [])
    assert p.fit is not None and (p.fit.layout.tp, p.fit.layout.pp, p.fit.layout.nodes) == (1, 2, 2)
    assert not p.single_node
    assert any("spans 2 nodes" in n for n in p.notes)


def test_small_model_gets_replicas_with_the_published_evidence(tmp_path: Path) -> None:
    p = make_plan(PlanRequest(model=model_dir(tmp_path, shapes.QWEN25_7B), context=8192, seqs=16,
                              gpus="8x80GB"), lambda: [])
    assert p.fit is not None and p.fit.layout.gpus == 1
    assert p.replicas == 8
    assert any("843 tok/s" in n and "651 tok/s with TP=4" in n for n in p.notes)
    capped = make_plan(PlanRequest(model=model_dir(tmp_path, shapes.QWEN25_7B), gpus="8x80GB", replicas=3),
                       lambda: [])
    assert capped.replicas == 3


def test_replicas_of_multi_gpu_groups(tmp_path: Path) -> None:
    p = make_plan(PlanRequest(model=model_dir(tmp_path, shapes.QWEN25_7B), context=8192, seqs=16,
                              gpus="8x16GB"), lambda: [])
    assert p.fit is not None and p.fit.layout.gpus == 2  # 15.2 GB of weights alone fill a 16 GB GPU
    assert p.replicas == 4


@pytest.mark.parametrize(("gpus", "tier"), [("1x6GB", "<8gb"), ("1x12GB", "8-16gb"), ("1x16GB", "16-24gb"),
                                            ("1x24GB", "24-48gb"), ("1x80GB", ">=48gb")])
def test_vram_tier_of_the_group(gpus: str, tier: str) -> None:
    p = make_plan(PlanRequest(model="org/tiny", layers=2, hidden=64, heads=4, params="1e6", context=128, seqs=1,
                              gpus=gpus, overhead_gib=0.5), lambda: [])
    assert p.fit is not None and p.fit.layout.gpus == 1
    assert p.tier == tier


def test_tier_counts_the_whole_group(tmp_path: Path) -> None:
    p = make_plan(PlanRequest(model=model_dir(tmp_path, shapes.QWEN25_7B), context=8192, seqs=16, gpus="2x16GB"),
                  lambda: [])
    assert p.fit is not None and p.fit.layout.gpus == 2
    assert p.tier == "24-48gb"  # 2 × 16 GiB, as the Infernet Book counts a group


def test_kv_per_token_and_dtypes(tmp_path: Path) -> None:
    path = model_dir(tmp_path, shapes.LLAMA31_70B)
    bf16 = make_plan(PlanRequest(model=path, gpus="8x80GB"), lambda: [])
    assert bf16.memory.kv_per_token == 2 * 80 * 8 * 128 * 2 == 327680
    assert bf16.memory.kv_cache == 327680 * 8192 * 16
    fp8 = make_plan(PlanRequest(model=path, gpus="8x80GB", kv_dtype="fp8"), lambda: [])
    assert fp8.memory.kv_per_token == 327680 // 2
    int4 = make_plan(PlanRequest(model=path, gpus="8x80GB", dtype="int4"), lambda: [])
    assert int4.memory.kv_precision == "bf16" and int4.compute_dtype == "bf16"  # KV follows the compute dtype
    fp32 = make_plan(PlanRequest(model=path, gpus="8x80GB", dtype="fp32"), lambda: [])
    assert fp32.memory.weights == 4 * fp32.memory.params.total and fp32.memory.kv_per_token == 2 * 327680


def test_kv_heads_replicated_beyond_their_count(tmp_path: Path) -> None:
    p = make_plan(PlanRequest(model=model_dir(tmp_path, shapes.QWEN3_30B_A3B), context=131072, seqs=4,
                              gpus="8x24GB"), lambda: [])
    assert p.fit is not None and p.fit.layout.tp == 8  # 4 KV heads: the KV cache splits only 4 ways
    assert p.memory.kv_shards(8) == 4
    assert any("replicated KV head" in n for n in p.notes)
    assert any("MoE: 128 experts, 8 per token" in n for n in p.notes)


def test_mla_kv_cache_is_one_latent_replicated_on_every_rank(tmp_path: Path) -> None:
    deepseek_v2_lite = {
        "model_type": "deepseek_v2", "torch_dtype": "bfloat16", "hidden_size": 2048, "intermediate_size": 10944,
        "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
        "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
        "first_k_dense_replace": 1, "vocab_size": 102400, "tie_word_embeddings": False}
    p = make_plan(PlanRequest(model=model_dir(tmp_path, deepseek_v2_lite), gpus="8x80GB"), lambda: [])
    assert p.memory.kv_per_token == 27 * (512 + 64) * 2
    assert p.memory.kv_shards(4) == 1
    assert abs(p.memory.params.total / 1e9 - 15.7) < 0.1  # the card's 15.7 B


def test_gpu_specs() -> None:
    assert parse_gpus("8x80GB").memory_mib == 80 * 1024
    assert parse_gpus("8x80GB").total_gpus == 8
    assert parse_gpus("2 x 141gb", nodes=2).total_gpus == 4
    assert parse_gpus("4x81559MiB").memory_mib == 81559
    assert parse_gpus("24GB").gpus_per_node == 1
    with pytest.raises(ConfigError, match="--gpus"):
        parse_gpus("lots")
    hw = from_discovered([Gpu(0, "NVIDIA H100", "u0", 81559, 0), Gpu(2, "NVIDIA H100", "u2", 81000, 0)])
    assert hw.local_indices == (0, 2) and hw.memory_mib == 81000 and hw.source == "NVML"
    with pytest.raises(ConfigError, match="--gpus: no GPU found"):
        from_discovered([])


@pytest.mark.parametrize(("text", "value"), [("7e9", 7_000_000_000), ("7B", 7_000_000_000), ("70b", 70 * 10**9),
                                             ("560M", 560_000_000), ("1.5T", 1_500_000_000_000)])
def test_parse_count(text: str, value: int) -> None:
    assert parse_count(text) == value


def test_no_fit_says_so(tmp_path: Path) -> None:
    p = make_plan(PlanRequest(model=model_dir(tmp_path, shapes.LLAMA31_70B), gpus="2x24GB"), lambda: [])
    assert p.fit is None and not p.fits and p.replicas == 0
    assert any("does not fit" in n for n in p.notes)


def test_precision_from_quantization_config_and_fp8_on_the_fly(tmp_path: Path) -> None:
    awq = {**shapes.QWEN25_7B, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    p = make_plan(PlanRequest(model=model_dir(tmp_path, awq, "awq"), gpus="1x24GB"), lambda: [])
    assert p.memory.weight_precision == "int4" and p.compute_dtype == "bf16"
    assert not any("pre-quantized" in n for n in p.notes)
    assert vllm_args(p) == ["--max-model-len", "8192", "--dtype", "bfloat16"]  # vLLM reads the config itself
    fp8 = make_plan(PlanRequest(model=model_dir(tmp_path, shapes.QWEN25_7B), dtype="fp8", gpus="1x24GB"), lambda: [])
    assert fp8.memory.weights == round(fp8.memory.params.total * 1.0)
    assert vllm_args(fp8)[-2:] == ["--quantization", "fp8"]
    int8 = make_plan(PlanRequest(model=model_dir(tmp_path, shapes.QWEN25_7B), dtype="int8", gpus="1x24GB"),
                     lambda: [])
    assert any("pre-quantized checkpoint" in n for n in int8.notes)
