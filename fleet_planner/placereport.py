"""A node plan (several models side by side) as a human table or as JSON."""

from __future__ import annotations

from typing import Any

from fleet_planner.memory import gb
from fleet_planner.placedoc import budget_text, gpu_list, node_text
from fleet_planner.placement import SLEEP_RESIDUE_MIB, SWAP_BUDGET, NodePlan, Placement
from fleet_planner.report import plan_dict


def _state(p: Placement) -> str:
    if p.asleep:
        return "asleep after start-up (sleep: {}); a request for it wakes it"
    return "awake (sleep: {preload: true})" if p.shared else "awake"


def _instance_dict(plan: NodePlan, p: Placement) -> dict[str, Any]:
    model = plan_dict(p.plan)
    for key in ("fleet_file", "replicas", "gpus"):  # the node's, below
        model.pop(key)
    return {"name": p.name, "gpus": list(p.gpus), "cuda_visible_devices": gpu_list(p.gpus), "asleep": p.asleep,
            "shares_gpus_with": [q.name for q in plan.placements if q.group == p.group and q is not p], **model}


def node_dict(plan: NodePlan) -> dict[str, Any]:
    hw = plan.hardware
    return {
        "gpus": {"count": hw.gpus_per_node, "memory_mib": hw.memory_mib, "name": hw.name, "source": hw.source,
                 "indices": list(hw.local_indices)},
        "fits": plan.fits,
        "problems": plan.problems,
        "instances": [_instance_dict(plan, p) for p in plan.placements],
        "budgets": [{"gpus": list(b.gpus), "instances": list(b.names), "gpu_memory_utilization": b.utilization,
                     "swap_budget": SWAP_BUDGET, "awake_at_once": b.awake_at_once,
                     "lowered_from": b.lowered_from, "sleep_residue_mib_per_gpu": SLEEP_RESIDUE_MIB}
                    for b in plan.budgets if len(b.names) > 1],
        "vram_tier": str(plan.tier),
        "notes": plan.notes,
        "fleet_file": node_text(plan),
    }


def _rows(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [f"  {k.ljust(width)}  {v}".rstrip() for k, v in rows]


def _instance_lines(p: Placement) -> list[str]:
    mem, r, fit = p.plan.memory, p.plan.request, p.plan.fit
    head = f"instance {p.name}  ({p.plan.model_path}, served as {p.plan.served_name})"
    params = f"{mem.params.total / 1e9:.2f} B parameters, weights {mem.weight_precision}, KV {mem.kv_precision}"
    memory = (f"weights {gb(mem.weights):.2f} GB + KV {gb(mem.kv_cache):.2f} GB ({r.context} tokens × {r.seqs} "
              "sequences)")
    rows = [("model", params), ("memory", memory)]
    if fit is None:
        return [head, *_rows(rows)]
    lay = fit.layout
    rows += [
        ("GPUs", f"{gpu_list(p.gpus)}  CUDA_VISIBLE_DEVICES={gpu_list(p.gpus)}  TP={lay.tp} × PP={lay.pp} "
                 f"({lay.reason})"),
        ("per GPU", f"{gb(fit.need_per_gpu):.2f} GB needed of {gb(fit.budget_per_gpu):.2f} GB usable at "
                    f"gpu_memory_utilization {r.gpu_memory_utilization}; room for {fit.seqs_at_full_context} "
                    "sequences at full context"),
        ("VRAM tier", f"{p.plan.tier} ({len(p.gpus)} × {p.plan.hardware.memory_mib} MiB)"),
        ("state", _state(p)),
    ]
    return [head, *_rows(rows), *[f"  - {n}" for n in p.plan.notes]]


def node_table(plan: NodePlan) -> str:
    hw = plan.hardware
    awake = sum(1 for p in plan.placements if not p.asleep)
    out = [f"node: {hw.describe()}",
           f"models: {len(plan.placements)} side by side ({awake} awake, {len(plan.placements) - awake} asleep "
           "after start-up)", ""]
    for p in plan.placements:
        out += [*_instance_lines(p), ""]
    shared = [b for b in plan.budgets if len(b.names) > 1]
    if shared and plan.fits:
        out += ["budget (swap.budget per GPU; a sleeping instance keeps about "
                f"{SLEEP_RESIDUE_MIB} MiB per GPU)"]
        out += [f"  GPUs {gpu_list(b.gpus)}: {budget_text(b)}" for b in shared]
        out.append("")
    if plan.fits:
        out.append(f"fit: yes; node VRAM tier {plan.tier}")
    else:
        out += ["fit: THE MODELS DO NOT FIT these GPUs", *[f"  - {p}" for p in plan.problems]]
    if plan.notes:
        out += ["", "notes", *[f"  - {n}" for n in plan.notes]]
    return "\n".join(out)
