"""The fleet file a plan runs as: one instance per replica, each on its own GPU group.

The text is YAML that ``fleetspec.fleetfile.parse_fleet`` accepts; ``fleet_text`` checks that
before returning it, so a plan never hands out a file ``vllm-fleet up`` would refuse.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from fleet_planner.memory import gb
from fleet_planner.plan import CapacityPlan
from fleet_planner.precision import Precision
from fleetspec.fleetfile import parse_fleet


def slug(name: str) -> str:
    """An instance name from a served name: the fleet file's [A-Za-z0-9._-], room for a suffix."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", name.rsplit("/", 1)[-1]).strip("-._") or "model"
    return text[:56]


def vllm_args(plan: CapacityPlan) -> list[str]:
    mem = plan.memory
    args = ["--max-model-len", str(plan.request.context), "--dtype", plan.compute_dtype.vllm_dtype]
    if mem.kv_precision == Precision.FP8:
        args += ["--kv-cache-dtype", "fp8"]
    if mem.weight_precision == Precision.FP8 and mem.shape.quantization is None:
        args += ["--quantization", "fp8"]  # vLLM quantizes 16-bit weights to FP8 as it loads them
    return args


def fleet_document(plan: CapacityPlan) -> dict[str, Any] | None:
    """The fleet file as data, or None when the plan does not fit one host."""
    if plan.fit is None or not plan.single_node:
        return None
    lay = plan.fit.layout
    indices = plan.hardware.local_indices
    base = slug(plan.served_name)
    instances = []
    for i in range(plan.replicas):
        gpus = list(indices[i * lay.gpus:(i + 1) * lay.gpus])
        instances.append({
            "name": base if plan.replicas == 1 else f"{base}-{i}",
            "model": plan.model_path,
            "served_model_names": [plan.served_name],
            "gpus": gpus,
            "tensor_parallel_size": lay.tp,
            "pipeline_parallel_size": lay.pp,
            "gpu_memory_utilization": plan.request.gpu_memory_utilization,
            "vllm_args": vllm_args(plan),
        })
    return {"gateway": {"host": "0.0.0.0", "port": 8080}, "instances": instances}


def _header(plan: CapacityPlan) -> str:
    mem, r = plan.memory, plan.request
    assert plan.fit is not None
    lay = plan.fit.layout
    return (f"# Planned by `vllm-fleet plan` for {plan.model_path}: {mem.weight_precision} weights, "
            f"{mem.kv_precision} KV cache,\n"
            f"# {r.context} tokens x {r.seqs} sequences; {plan.replicas} replica(s) of TP={lay.tp} x PP={lay.pp} "
            f"on {plan.hardware.describe()}.\n"
            f"# Per replica: weights {gb(mem.weights):.1f} GB + KV {gb(mem.kv_cache):.1f} GB + overhead "
            f"{gb(mem.overhead_per_gpu * lay.gpus):.1f} GB; VRAM tier {plan.tier}.\n")


def fleet_text(plan: CapacityPlan) -> str | None:
    doc = fleet_document(plan)
    if doc is None:
        return None
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    parse_fleet(yaml.safe_load(body), "planned fleet file")  # raises ConfigError if we ever produce a bad one
    return _header(plan) + body
