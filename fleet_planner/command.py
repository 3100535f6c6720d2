"""``vllm-fleet plan`` and ``vllm-fleet up --model``: the planner's side of the CLI.

Exit codes: 0 the model fits (or a dry run printed its plan), 1 it does not fit these GPUs (or
needs more than this host for ``up``), 2 bad input, with a message naming the flag or the
config key. ``up --model`` writes the fleet file (default ``.fleet/planned-fleet.yaml``) and
starts it through the supervisor exactly as ``up -c`` would.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from fleet_planner.fleetdoc import fleet_text
from fleet_planner.plan import CapacityPlan, PlanRequest, make_plan
from fleet_planner.report import plan_dict, plan_table
from fleetspec.errors import ConfigError
from fleetspec.gpus import Gpu, discover_gpus

PLANNED_FLEET_FILE = Path(".fleet") / "planned-fleet.yaml"
NO_FIT_EXIT_CODE = 1


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    return PlanRequest(
        model=args.model, params=args.params, layers=args.layers, hidden=args.hidden, heads=args.heads,
        kv_heads=args.kv_heads, head_dim=args.head_dim, vocab=args.vocab, intermediate=args.intermediate,
        dtype=args.dtype, kv_dtype=args.kv_dtype, context=args.context, seqs=args.seqs, gpus=args.gpus,
        nodes=args.nodes, gpu_memory_utilization=args.gpu_memory_utilization, overhead_gib=args.overhead_gib,
        replicas=args.replicas, served_name=args.served_name,
    )


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--fleet-file: cannot write {path}: {e.strerror or e}") from e


def _plan(args: argparse.Namespace, discover: Callable[[], list[Gpu]] | None) -> CapacityPlan:
    # Looked up at call time, so that tests can stand in for NVML.
    return make_plan(request_from_args(args), discover or discover_gpus)


def cmd_plan(args: argparse.Namespace, discover: Callable[[], list[Gpu]] | None = None) -> int:
    plan = _plan(args, discover)
    text = fleet_text(plan)
    if args.fleet_file and text is not None:
        _write(Path(args.fleet_file), text)
    if args.json:
        print(json.dumps(plan_dict(plan), indent=2))
    else:
        print(plan_table(plan))
        if text is not None:
            print()
            print(f"fleet file{f' (written to {args.fleet_file})' if args.fleet_file else ''}:")
            print(text.rstrip())
    if args.fleet_file and text is None:
        print(f"vllm-fleet plan: no fleet file written to {args.fleet_file}: the plan does not fit one host",
              file=sys.stderr)
    return 0 if plan.fits else NO_FIT_EXIT_CODE


def cmd_up_model(args: argparse.Namespace, discover: Callable[[], list[Gpu]] | None = None) -> int:
    """Plan for ``--model`` on this host, write the fleet file, and run it (unless ``--dry-run``)."""
    if args.nodes != 1:
        raise ConfigError("--nodes: `up --model` starts this host only; plan multi-node layouts with `plan`")
    plan = _plan(args, discover)
    print(plan_table(plan))
    text = fleet_text(plan)
    if text is None:
        why = "does not fit these GPUs" if not plan.fits else "needs more than this host"
        print(f"vllm-fleet up: {plan.served_name} {why}; nothing started", file=sys.stderr)
        return NO_FIT_EXIT_CODE
    path = Path(args.fleet_file) if args.fleet_file else PLANNED_FLEET_FILE
    print()
    if args.dry_run:
        print(f"fleet file (dry run: not written to {path}, nothing started):")
        print(text.rstrip())
        return 0
    _write(path, text)
    print(f"fleet file written to {path}; starting it", flush=True)
    from fleet_supervisor.commands import cmd_up

    return cmd_up(str(path))
