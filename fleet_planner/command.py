"""``vllm-fleet plan`` and ``vllm-fleet up --model``: the planner's side of the CLI.

One ``--model``: the model over this node's GPUs (``fleet_planner.plan``). Several: the models side
by side, each on its own GPU group, ``--asleep`` ones sharing the group of the awake model before
them (``fleet_planner.placement``).

Exit codes: 0 the models fit (or a dry run printed the plan), 1 they do not fit these GPUs (or
need more than this host for ``up``), 2 bad input, with a message naming the flag or the config
key. ``up --model`` writes the fleet file (default ``.fleet/planned-fleet.yaml``) and starts it
through the supervisor exactly as ``up -c`` would.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_planner.fleetdoc import fleet_text
from fleet_planner.modelargs import last_model_only, model_values
from fleet_planner.placedoc import node_text
from fleet_planner.placement import ModelSpec, make_node_plan
from fleet_planner.placereport import node_dict, node_table
from fleet_planner.plan import PlanRequest, make_plan
from fleet_planner.report import plan_dict, plan_table
from fleetspec.errors import ConfigError
from fleetspec.gpus import Gpu, discover_gpus

PLANNED_FLEET_FILE = Path(".fleet") / "planned-fleet.yaml"
NO_FIT_EXIT_CODE = 1
_NODE_FLAGS = ("gpus", "nodes", "gpu_memory_utilization", "overhead_gib", "replicas")


def model_specs(args: argparse.Namespace) -> list[ModelSpec]:
    """One spec per ``--model``, with its own model flags and the node's flags."""
    node = {k: getattr(args, k) for k in _NODE_FLAGS}
    specs = []
    for values in model_values(args):
        asleep = bool(values.pop("asleep"))
        specs.append(ModelSpec(PlanRequest(**values, **node), asleep))
    return specs


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    """The request of a plan for one ``--model``."""
    specs = model_specs(args)
    if specs[0].asleep:
        raise ConfigError("--asleep: shares the GPU group of an awake --model given before it; with one --model "
                          "there is none (give several --model, or drop --asleep)")
    return specs[0].request


@dataclass(frozen=True)
class _Outcome:
    fits: bool
    table: str
    data: dict[str, Any]
    text: str | None  # the fleet file, or None when there is none for this plan
    why_none: str  # why there is no fleet file
    several: bool  # several --model


def _outcome(args: argparse.Namespace, discover: Callable[[], list[Gpu]] | None) -> _Outcome:
    # discover_gpus is looked up at call time, so that tests can stand in for NVML.
    specs = model_specs(args)
    if len(specs) == 1:
        plan = make_plan(request_from_args(args), discover or discover_gpus)
        why = "does not fit these GPUs" if not plan.fits else "needs more than this host"
        return _Outcome(plan.fits, plan_table(plan), plan_dict(plan), fleet_text(plan), f"{plan.served_name} {why}",
                        several=False)
    node = make_node_plan(specs, discover or discover_gpus)
    node.notes.extend(last_model_only(args))
    return _Outcome(node.fits, node_table(node), node_dict(node), node_text(node),
                    "the models do not fit these GPUs: " + "; ".join(node.problems), several=True)


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--fleet-file: cannot write {path}: {e.strerror or e}") from e


def cmd_plan(args: argparse.Namespace, discover: Callable[[], list[Gpu]] | None = None) -> int:
    out = _outcome(args, discover)
    if args.fleet_file and out.text is not None:
        _write(Path(args.fleet_file), out.text)
    if args.json:
        print(json.dumps(out.data, indent=2))
    else:
        print(out.table)
        if out.text is not None:
            print()
            print(f"fleet file{f' (written to {args.fleet_file})' if args.fleet_file else ''}:")
            print(out.text.rstrip())
    if out.text is None and out.several:
        where = f"no fleet file written to {args.fleet_file}: " if args.fleet_file else ""
        print(f"vllm-fleet plan: {where}{out.why_none}", file=sys.stderr)
    elif out.text is None and args.fleet_file:
        print(f"vllm-fleet plan: no fleet file written to {args.fleet_file}: the plan does not fit one host",
              file=sys.stderr)
    return 0 if out.fits else NO_FIT_EXIT_CODE


def cmd_up_model(args: argparse.Namespace, discover: Callable[[], list[Gpu]] | None = None) -> int:
    """Plan for ``--model`` on this host, write the fleet file, and run it (unless ``--dry-run``)."""
    if args.nodes != 1:
        raise ConfigError("--nodes: `up --model` starts this host only; plan multi-node layouts with `plan`")
    out = _outcome(args, discover)
    print(out.table)
    if out.text is None:
        print(f"vllm-fleet up: {out.why_none}; nothing started", file=sys.stderr)
        return NO_FIT_EXIT_CODE
    path = Path(args.fleet_file) if args.fleet_file else PLANNED_FLEET_FILE
    print()
    if args.dry_run:
        print(f"fleet file (dry run: not written to {path}, nothing started):")
        print(out.text.rstrip())
        return 0
    _write(path, out.text)
    print(f"fleet file written to {path}; starting it", flush=True)
    from fleet_supervisor.commands import cmd_up

    return cmd_up(str(path))
