"""Several models side by side on one node: each awake model gets a GPU group of its own, and a
model marked asleep shares the group of the awake model given before it (docs/sleep.md).

How the groups are sized:

- each group starts at the smallest size whose layout (vLLM's rule, ``fleet_planner.layout``)
  fits every model in it at the group's ``gpu_memory_utilization``;
- the GPUs left over go, one step at a time, to the smallest group that can take them as more
  tensor parallelism (more KV room, lower latency per request), so the node is split evenly: two
  models on four GPUs get two GPUs each, TP=2 (Seed 001's layout);
- groups take contiguous NVML indices in the order the models were given.

A group with asleep models keeps as many awake as ``swap.budget`` (1.0) allows: with the default
0.9 each, one at a time, and a request for a sleeping model puts the awake one to sleep first.
A sleeping vLLM keeps its CUDA context on every GPU of its group (825 MiB measured on an H200),
so the group's ``gpu_memory_utilization`` is lowered where that residue would not fit beside the
awake ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fleet_planner.fleetdoc import slug
from fleet_planner.hardware import Hardware
from fleet_planner.layout import Fit, budget_per_gpu, fit_layout, layout_for
from fleet_planner.plan import CapacityPlan, Estimate, PlanRequest, estimate, hardware_for, model_notes
from fleetspec.errors import ConfigError
from fleetspec.gpus import Gpu
from fleetspec.tiers import VramTier, largest_tier, tier_for_mib

SWAP_BUDGET = 1.0  # the fleet file's swap.budget the plan writes (its default)
SLEEP_RESIDUE_MIB = 1024  # per GPU, per sleeping instance: its CUDA context (825 MiB measured)
_MIN_UTILIZATION = 0.05


@dataclass(frozen=True)
class ModelSpec:
    """One ``--model`` with its own flags; ``asleep``: shares the previous awake model's GPUs."""

    request: PlanRequest
    asleep: bool = False


@dataclass(frozen=True)
class Placement:
    """One instance of the node plan: a model on its GPU group."""

    name: str
    plan: CapacityPlan  # the model on its group (fit None when the node plan does not fit)
    gpus: tuple[int, ...]
    asleep: bool  # asleep after start-up, woken by the first request for it
    group: int  # index into NodePlan.budgets
    sharers: int = 1  # instances on this group, itself included

    @property
    def shared(self) -> bool:
        """Shares its GPUs, so it needs a sleep: block (the awake one preloaded)."""
        return self.sharers > 1


@dataclass(frozen=True)
class GroupBudget:
    gpus: tuple[int, ...]
    names: tuple[str, ...]  # the awake model first
    utilization: float
    awake_at_once: int
    lowered_from: float | None = None


@dataclass(frozen=True)
class NodePlan:
    hardware: Hardware
    placements: list[Placement]
    budgets: list[GroupBudget]  # one per GPU group, in order
    problems: list[str]  # why the models do not fit; empty when they do
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def tier(self) -> VramTier:
        return largest_tier(p.plan.tier for p in self.placements)


@dataclass
class _Group:
    members: list[tuple[str, ModelSpec, Estimate]]
    utilization: float
    size: int = 0
    lowered_from: float | None = None


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _check_node_flags(specs: list[ModelSpec]) -> None:
    first = specs[0].request
    if first.nodes != 1:
        raise ConfigError("--nodes: several --model are planned on one host, each on its own GPU group; plan a "
                          "model that spans nodes alone (vllm-fleet plan --model M --nodes N)")
    if first.replicas is not None:
        raise ConfigError("--replicas: with several --model each model gets one instance on one GPU group; plan "
                          "replicas of one model alone (vllm-fleet plan --model M --replicas N)")
    if specs[0].asleep:
        raise ConfigError(f"--asleep: the first --model ({first.model}) has no awake --model before it whose GPUs "
                          "it could share; give an awake --model first")


def _groups(specs: list[ModelSpec], util: float) -> list[_Group]:
    groups: list[_Group] = []
    names: dict[str, str] = {}
    served: set[str] = set()
    for spec in specs:
        est = estimate(spec.request)
        if est.served_name in served:
            raise ConfigError(f"--served-name: two --model are served as {est.served_name!r}; give each its own "
                              "--served-name after its --model")
        served.add(est.served_name)
        name = slug(est.served_name)
        while name in names:
            name = f"{name}-{len(names)}"
        names[name] = est.served_name
        if spec.asleep:
            groups[-1].members.append((name, spec, est))
        else:
            groups.append(_Group([(name, spec, est)], util))
    return groups


def awake_at_once(members: int, utilization: float) -> int:
    """How many of a group's instances the supervisor keeps awake together (shares within the budget)."""
    return max(1, min(members, math.floor(SWAP_BUDGET / utilization + 1e-9)))


def _utilization(g: _Group, hw: Hardware) -> None:
    """Lower the group's utilization until the awake ones plus the sleepers' residue fit a GPU."""
    residue = SLEEP_RESIDUE_MIB / hw.memory_mib
    m = len(g.members)
    u = g.utilization
    while m > 1 and u > _MIN_UTILIZATION:
        a = awake_at_once(m, u)
        if a * u + (m - a) * residue <= 1 + 1e-9:
            break
        u = round(u - 0.01, 2)
    if u != g.utilization:
        g.lowered_from, g.utilization = g.utilization, u


def _fit(est: Estimate, n: int, hw: Hardware, util: float, tp_only: bool) -> Fit | None:
    layout = layout_for(est.memory.shape, n, hw.gpus_per_node)
    if layout is None or layout.nodes != 1 or (tp_only and layout.pp != 1):
        return None
    fit = fit_layout(est.memory, layout, budget_per_gpu(hw, util))
    return fit if fit.need_per_gpu <= fit.budget_per_gpu else None


def _size_fits(g: _Group, n: int, hw: Hardware, tp_only: bool = False) -> bool:
    return all(_fit(est, n, hw, g.utilization, tp_only) is not None for _, _, est in g.members)


def _size_groups(groups: list[_Group], hw: Hardware) -> list[str]:
    """Give each group its size; the problems when they do not all fit the node."""
    total = hw.gpus_per_node
    if len(groups) > total:
        return [f"{len(groups)} awake models need a GPU group each, and this node has {_gpus(total)}; mark some "
                "--asleep (they then share the GPUs of the awake --model before them)"]
    problems = []
    for g in groups:
        g.size = next((n for n in range(1, total + 1) if _size_fits(g, n, hw)), 0)
        if g.size:
            continue
        alone = [name for name, _, est in g.members
                 if not any(_fit(est, n, hw, g.utilization, tp_only=False) for n in range(1, total + 1))]
        if alone:
            problems += [f"{name}: does not fit even all {_gpus(total)} at gpu_memory_utilization {g.utilization}; "
                         "lower --context/--seqs after its --model, quantize (--dtype), or add GPUs" for name in alone]
        else:
            problems.append(f"{' and '.join(n for n, _, _ in g.members)}: no GPU group size fits all of them "
                            "(vLLM's rule: the tensor parallel size divides each model's attention heads); put "
                            "the --asleep model after another awake --model")
    if problems:
        return problems
    need = sum(g.size for g in groups)
    if need > total:
        each = ", ".join(f"{g.members[0][0]} {g.size}" for g in groups)
        return [f"the groups need {need} GPUs ({each}) and this node has {total}; lower --context/--seqs, mark a "
                "model --asleep, or give fewer --model"]
    free = total - need
    while free:
        for g in sorted(groups, key=lambda g: g.size):
            step = next((n for n in range(g.size + 1, g.size + free + 1) if _size_fits(g, n, hw, tp_only=True)), 0)
            if step:
                free -= step - g.size
                g.size = step
                break
        else:
            break
    return []


def _placements(groups: list[_Group], hw: Hardware) -> tuple[list[Placement], list[GroupBudget]]:
    placements: list[Placement] = []
    budgets: list[GroupBudget] = []
    start = 0
    for gi, g in enumerate(groups):
        gpus = hw.local_indices[start:start + g.size] if g.size else ()
        start += g.size
        for name, spec, est in g.members:
            fit = _fit(est, g.size, hw, g.utilization, tp_only=False) if g.size else None
            request = replace(spec.request, gpu_memory_utilization=g.utilization)
            plan = CapacityPlan(request=request, model_path=est.model_path, served_name=est.served_name,
                                memory=est.memory, compute_dtype=est.compute_dtype, hardware=hw, fit=fit,
                                replicas=1 if fit else 0,
                                tier=tier_for_mib(hw.memory_mib * g.size) if fit else VramTier.UNKNOWN,
                                notes=model_notes(est.memory))
            lay = fit.layout if fit else None
            if lay and lay.tp > 1 and est.memory.shape.mla is None and lay.tp > est.memory.shape.kv_heads:
                plan.notes.append(f"TP={lay.tp} exceeds the {est.memory.shape.kv_heads} KV heads: each GPU holds a "
                                  "replicated KV head")
            placements.append(Placement(name, plan, tuple(gpus), spec.asleep, gi, len(g.members)))
        budgets.append(GroupBudget(tuple(gpus), tuple(n for n, _, _ in g.members), g.utilization,
                                   awake_at_once(len(g.members), g.utilization), g.lowered_from))
    return placements, budgets


def _notes(groups: list[_Group], hw: Hardware) -> list[str]:
    notes = []
    for g in groups:
        smallest = next((n for n in range(1, hw.gpus_per_node + 1) if _size_fits(g, n, hw)), 0)
        if g.size > smallest:
            notes.append(f"{g.members[0][0]} fits {_gpus(smallest)}; it gets {g.size} (TP={g.size}) so that the "
                         f"node's {hw.gpus_per_node} GPUs are split between the groups: more KV room, lower latency "
                         "(a model alone on the node would run as replicas: vllm-fleet plan --model M)")
        if g.lowered_from is not None:
            notes.append(f"gpu_memory_utilization of {', '.join(n for n, _, _ in g.members)} lowered from "
                         f"{g.lowered_from} to {g.utilization}: each asleep instance keeps about "
                         f"{SLEEP_RESIDUE_MIB} MiB per GPU (its CUDA context) beside the awake one")
    idle = hw.gpus_per_node - sum(g.size for g in groups)
    if idle > 0 and all(g.size for g in groups):
        notes.append(f"{_gpus(idle)} left idle: no group could take them as tensor parallelism")
    return notes


def make_node_plan(specs: list[ModelSpec], discover: Callable[[], list[Gpu]]) -> NodePlan:
    """``discover`` is consulted only when ``--gpus`` is not given (NVML, in the CLI)."""
    _check_node_flags(specs)
    first = specs[0].request
    hw = hardware_for(first, discover)
    groups = _groups(specs, first.gpu_memory_utilization)
    for g in groups:
        _utilization(g, hw)
    problems = _size_groups(groups, hw)
    if problems:
        for g in groups:
            g.size = 0
    placements, budgets = _placements(groups, hw)
    return NodePlan(hw, placements, budgets, problems, [] if problems else _notes(groups, hw))
