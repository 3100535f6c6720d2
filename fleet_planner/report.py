"""A plan as a human table or as JSON (bytes exact, GB = 10⁹ bytes beside them)."""

from __future__ import annotations

from typing import Any

from fleet_planner.fleetdoc import fleet_text, vllm_args
from fleet_planner.memory import GIB, gb
from fleet_planner.plan import CapacityPlan


def _bytes(n: int) -> dict[str, float | int]:
    return {"bytes": n, "gb": gb(n)}


def plan_dict(plan: CapacityPlan) -> dict[str, Any]:
    mem, shape, r, hw = plan.memory, plan.memory.shape, plan.request, plan.hardware
    fit = plan.fit
    gpus = fit.layout.gpus if fit else 1
    return {
        "model": {"path": plan.model_path, "served_name": plan.served_name, "source": shape.source,
                  "model_type": shape.model_type or None, "params": mem.params.total,
                  "params_active": mem.params.active, "params_vision": mem.params.vision,
                  "params_counted_from_shape": mem.params.counted,
                  "layers": shape.layers, "hidden_size": shape.hidden, "num_attention_heads": shape.heads,
                  "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "vocab_size": shape.vocab,
                  "intermediate_size": shape.intermediate, "tie_word_embeddings": shape.tie_embeddings,
                  "moe": None if shape.moe is None else vars(shape.moe),
                  "mla": shape.mla is not None, "sliding_window": shape.sliding_window,
                  "sliding_window_layers": shape.sliding_layers},
        "precision": {"weights": str(mem.weight_precision), "compute_dtype": plan.compute_dtype.vllm_dtype,
                      "kv_cache": str(mem.kv_precision)},
        "load": {"context": r.context, "seqs": r.seqs},
        "memory": {"weights": _bytes(mem.weights), "kv_cache_per_token": _bytes(mem.kv_per_token),
                   "kv_cache": _bytes(mem.kv_cache),
                   "kv_cache_sliding_window": None if mem.kv_cache_sliding is None else _bytes(mem.kv_cache_sliding),
                   "overhead_per_gpu": _bytes(mem.overhead_per_gpu), "overhead": _bytes(mem.overhead_per_gpu * gpus),
                   "total": _bytes(mem.total(gpus)),
                   "overhead_covers": "CUDA context and NCCL, activation peak of the profiling pass, CUDA graphs"},
        "gpus": {"count_per_node": hw.gpus_per_node, "nodes": hw.nodes, "memory_mib": hw.memory_mib,
                 "name": hw.name, "source": hw.source, "indices": list(hw.local_indices),
                 "gpu_memory_utilization": r.gpu_memory_utilization},
        "fits": fit is not None,
        "fit": None if fit is None else {
            "gpus": fit.layout.gpus, "tensor_parallel_size": fit.layout.tp, "pipeline_parallel_size": fit.layout.pp,
            "nodes": fit.layout.nodes, "reason": fit.layout.reason, "need_per_gpu": _bytes(fit.need_per_gpu),
            "budget_per_gpu": _bytes(fit.budget_per_gpu), "seqs_at_full_context": fit.seqs_at_full_context,
            "vllm_args": [*vllm_args(plan), "--tensor-parallel-size", str(fit.layout.tp),
                          "--pipeline-parallel-size", str(fit.layout.pp),
                          "--gpu-memory-utilization", str(r.gpu_memory_utilization)]},
        "replicas": plan.replicas,
        "vram_tier": str(plan.tier),
        "notes": plan.notes,
        "fleet_file": fleet_text(plan),
    }


def _rows(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}".rstrip() for k, v in rows)


def plan_table(plan: CapacityPlan) -> str:
    mem, shape, r, hw, fit = plan.memory, plan.memory.shape, plan.request, plan.hardware, plan.fit
    gpus = fit.layout.gpus if fit else 1
    p = mem.params
    params = f"{p.total / 1e9:.2f} B ({'counted from the shape' if p.counted else 'given'})"
    if p.active != p.total:
        params += f", {p.active / 1e9:.2f} B active per token"
    if p.vision:
        params += f", of which vision {p.vision / 1e9:.2f} B"
    kv_heads = "MLA latent" if shape.mla else f"{shape.kv_heads} KV heads × {shape.head_dim}"
    head = [
        ("model", f"{plan.model_path}  (served as {plan.served_name}; shape from {shape.source})"),
        ("shape", f"{shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, {kv_heads}, "
                  f"vocab {shape.vocab}, tied embeddings {'yes' if shape.tie_embeddings else 'no'}"),
        ("parameters", params),
        ("precision", f"weights {mem.weight_precision} ({mem.weight_precision.bytes:g} B), "
                      f"KV cache {mem.kv_precision} ({mem.kv_precision.bytes:g} B), "
                      f"--dtype {plan.compute_dtype.vllm_dtype}"),
        ("load", f"{r.context} tokens of context × {r.seqs} sequences"),
        ("GPUs", f"{hw.describe()}, gpu_memory_utilization {r.gpu_memory_utilization}"),
    ]
    kv_formula = ("MLA latent: layers × (kv_lora_rank + rope dims)" if shape.mla else
                  f"2 × {shape.layers} layers × {shape.kv_heads} KV heads × {shape.head_dim} × "
                  f"{mem.kv_precision.bytes:g} B")
    memory = [
        ("weights", f"{gb(mem.weights):10.2f} GB"),
        ("KV cache per token", f"{mem.kv_per_token / 1024:10.1f} KiB  ({kv_formula})"),
        (f"KV cache ({r.context} × {r.seqs})", f"{gb(mem.kv_cache):10.2f} GB"),
        (f"overhead ({mem.overhead_per_gpu / GIB:g} GiB × {gpus} GPU)", f"{gb(mem.overhead_per_gpu * gpus):10.2f} GB"
                                                                        "  (CUDA context, activations, CUDA graphs)"),
        ("total", f"{gb(mem.total(gpus)):10.2f} GB"),
    ]
    if fit is None:
        result = [("fit", "DOES NOT FIT on these GPUs")]
    else:
        lay = fit.layout
        result = [
            ("fit", f"{lay.gpus} GPU(s): TP={lay.tp} × PP={lay.pp}" + (f" over {lay.nodes} nodes" if lay.nodes > 1
                                                                        else "")),
            ("layout", lay.reason),
            ("per GPU", f"{gb(fit.need_per_gpu):.2f} GB needed of {gb(fit.budget_per_gpu):.2f} GB usable; room for "
                        f"{fit.seqs_at_full_context} sequences at full context"),
            ("replicas", f"{plan.replicas} (data parallel, one instance per GPU group)"),
            ("VRAM tier", f"{plan.tier} per instance"),
        ]
    out = [_rows(head), "", "memory", _rows([(f"  {k}", v) for k, v in memory]), "", _rows(result)]
    if plan.notes:
        out += ["", "notes"] + [f"  - {n}" for n in plan.notes]
    return "\n".join(out)
