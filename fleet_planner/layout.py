"""Parallel layout of a GPU group, by vLLM's rule, and the smallest group that fits.

vLLM's distributed-serving guide: one GPU if the model fits; else tensor parallel (TP) over the
GPUs of one node; across nodes, TP = GPUs per node and pipeline parallel (PP) = nodes; and when
the GPU count does not divide the model evenly, PP over all of them (TP=1), since PP allows
uneven splits. TP must divide ``num_attention_heads``; the KV heads must split evenly too, or be
replicated evenly (vLLM asserts ``kv_heads % tp == 0`` or ``tp % kv_heads == 0``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet_planner.hardware import Hardware
from fleet_planner.memory import MemoryEstimate
from fleet_planner.shape import ModelShape


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    nodes: int
    reason: str

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class Fit:
    layout: Layout
    need_per_gpu: int  # bytes on the most loaded GPU
    budget_per_gpu: int  # gpu_memory_utilization × memory
    seqs_at_full_context: int  # sequences of the full context the group's KV room holds


def tp_problem(shape: ModelShape, tp: int) -> str | None:
    """Why vLLM would refuse tensor parallel size ``tp`` for this model, or None."""
    if shape.heads % tp:
        return f"TP={tp} does not divide the {shape.heads} attention heads"
    if shape.mla is None and shape.kv_heads % tp and tp % shape.kv_heads:
        return f"TP={tp} neither divides the {shape.kv_heads} KV heads nor is a multiple of them"
    return None


def layout_for(shape: ModelShape, gpus: int, gpus_per_node: int) -> Layout | None:
    """The layout vLLM's rule gives a group of ``gpus``; None when the rule has none."""
    if gpus == 1:
        return Layout(1, 1, 1, "fits one GPU: no parallelism")
    if gpus <= gpus_per_node:
        problem = tp_problem(shape, gpus)
        if problem is None:
            return Layout(gpus, 1, 1, f"tensor parallel over {gpus} GPUs of one node")
        if gpus > shape.layers:
            return None
        return Layout(1, gpus, 1, f"{problem}: pipeline parallel over {gpus} GPUs instead (vLLM's rule)")
    if gpus % gpus_per_node:
        return None  # a group that spans nodes takes whole nodes
    nodes = gpus // gpus_per_node
    tp = max(d for d in range(1, gpus_per_node + 1) if gpus_per_node % d == 0 and tp_problem(shape, d) is None)
    pp = gpus // tp
    if pp > shape.layers:
        return None
    why = f"tensor parallel within each node (TP={tp}), pipeline parallel across {nodes} nodes"
    if tp != gpus_per_node:
        why += f" ({tp_problem(shape, gpus_per_node)}, so TP={tp} and PP={pp})"
    return Layout(tp, pp, nodes, why)


def budget_per_gpu(hw: Hardware, utilization: float) -> int:
    return int(hw.memory_bytes * utilization)


def fit_layout(mem: MemoryEstimate, layout: Layout, budget: int) -> Fit:
    return Fit(layout, mem.per_gpu(layout.tp, layout.pp), budget,
               mem.seqs_that_fit(layout.tp, layout.pp, budget))


def smallest_fit(mem: MemoryEstimate, hw: Hardware, utilization: float,
                 tp_only: bool = False, tiling: bool = True) -> Fit | None:
    """The smallest GPU group whose most loaded GPU stays within the budget, or None.

    With ``tiling`` (the plan's choice) a group within a node has a size that divides the node's
    GPU count, so that replicas fill the node (8 GPUs: 1, 2, 4 or 8; never 3, 5, 6 or 7, which
    would leave GPUs idle); a group across nodes takes whole nodes either way."""
    budget = budget_per_gpu(hw, utilization)
    for n in range(1, hw.total_gpus + 1):
        if tiling and n < hw.gpus_per_node and hw.gpus_per_node % n:
            continue
        layout = layout_for(mem.shape, n, hw.gpus_per_node)
        if layout is None or (tp_only and layout.pp > layout.nodes):
            continue
        fit = fit_layout(mem, layout, budget)
        if fit.need_per_gpu <= budget:
            return fit
    return None
