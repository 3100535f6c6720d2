"""The fleet file a node plan runs as: one instance per model, each on its GPU group; the models
that share a group get a ``sleep:`` block (the awake one preloaded) and ``swap.budget``.

As ``fleet_planner.fleetdoc`` does for one model, ``node_text`` parses what it wrote before
returning it (the budget rules of ``fleetspec.sleep`` included), so a plan never hands out a
file ``vllm-fleet up`` would refuse.
"""

from __future__ import annotations

from typing import Any

import yaml

from fleet_planner.fleetdoc import vllm_args
from fleet_planner.memory import gb
from fleet_planner.placement import SWAP_BUDGET, GroupBudget, NodePlan, Placement
from fleetspec.fleetfile import parse_fleet


def gpu_list(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus))


def _instance(p: Placement) -> dict[str, Any]:
    assert p.plan.fit is not None
    lay = p.plan.fit.layout
    inst: dict[str, Any] = {
        "name": p.name,
        "model": p.plan.model_path,
        "served_model_names": [p.plan.served_name],
        "gpus": list(p.gpus),
        "tensor_parallel_size": lay.tp,
        "pipeline_parallel_size": lay.pp,
        "gpu_memory_utilization": p.plan.request.gpu_memory_utilization,
        "vllm_args": vllm_args(p.plan),
    }
    if p.shared:
        # The awake one is loaded at start-up; the others are put to sleep once ready and woken
        # by the first request for them (docs/sleep.md).
        inst["sleep"] = {} if p.asleep else {"preload": True}
    return inst


def node_document(plan: NodePlan) -> dict[str, Any] | None:
    """The fleet file as data, or None when the models do not fit."""
    if not plan.fits:
        return None
    doc: dict[str, Any] = {"gateway": {"host": "0.0.0.0", "port": 8080}}
    if any(p.shared for p in plan.placements):
        doc["swap"] = {"budget": SWAP_BUDGET}
    doc["instances"] = [_instance(p) for p in plan.placements]
    return doc


def budget_text(b: GroupBudget) -> str:
    """One line on what a shared group holds awake, e.g. for GPUs 2,3."""
    shares = " + ".join(f"{n} {b.utilization:g}" for n in b.names)
    total = round(b.utilization * len(b.names), 4)
    if b.awake_at_once == 1:
        return (f"{shares} = {total:g} > swap.budget {SWAP_BUDGET}: one awake at a time; a request for an asleep "
                "model puts the awake one to sleep first (swap)")
    if b.awake_at_once >= len(b.names):
        return f"{shares} = {total:g} <= swap.budget {SWAP_BUDGET}: all can be awake at once"
    return f"{shares} = {total:g} > swap.budget {SWAP_BUDGET}: at most {b.awake_at_once} awake at once"


def _header(plan: NodePlan) -> str:
    lines = [f"# Planned by `vllm-fleet plan` for {len(plan.placements)} models side by side on "
             f"{plan.hardware.describe()}:"]
    width = max(len(p.name) for p in plan.placements)
    for p in plan.placements:
        assert p.plan.fit is not None
        lay, mem = p.plan.fit.layout, p.plan.memory
        state = "asleep until a request for it" if p.asleep else ("awake (preloaded)" if p.shared else "awake")
        lines.append(f"#   GPUs {gpu_list(p.gpus):<7} {p.name:<{width}}  TP={lay.tp} x PP={lay.pp}  weights "
                     f"{gb(mem.weights):.1f} GB + KV {gb(mem.kv_cache):.1f} GB; tier {p.plan.tier}; {state}")
    for b in plan.budgets:
        if len(b.names) > 1:
            lines.append(f"# Budget on GPUs {gpu_list(b.gpus)}: {budget_text(b)}.")
    return "\n".join(lines) + "\n"


def node_text(plan: NodePlan) -> str | None:
    doc = node_document(plan)
    if doc is None:
        return None
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    parse_fleet(yaml.safe_load(body), "planned fleet file")  # raises ConfigError if we ever produce a bad one
    return _header(plan) + body
