"""``vllm-fleet`` subcommands (DESIGN §2). Each maps onto one function of the gateway or the
supervisor package; imports happen inside the command so that ``vllm-fleet gpus`` never loads
the gateway, and a config error exits 2 whichever side finds it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from fleetspec.errors import ConfigError


def _plan_arguments(p: argparse.ArgumentParser, model_required: bool) -> None:
    """The capacity planner's flags, shared by ``plan`` and ``up --model`` (fleet_planner)."""
    p.add_argument("--model", required=model_required, default=None,
                   help="local model directory or config.json; or a model id, with the shape given by the flags below")
    shape = p.add_argument_group("model shape (override or replace config.json)")
    shape.add_argument("--params", help="parameter count, e.g. 7e9, 7B, 70b (default: counted from the shape)")
    for flag in ("layers", "hidden", "heads", "kv-heads", "head-dim", "vocab", "intermediate"):
        shape.add_argument(f"--{flag}", type=int, default=None)
    p.add_argument("--dtype", help="weight precision: fp32, fp16, bf16, fp8, int8, int4 (default: from the config)")
    p.add_argument("--kv-dtype", help="KV cache precision: auto (the compute dtype, default), fp8, fp16, bf16, fp32")
    p.add_argument("--context", type=int, default=8192, help="tokens per sequence (--max-model-len); default 8192")
    p.add_argument("--seqs", type=int, default=16, help="concurrent sequences at full context; default 16")
    p.add_argument("--gpus", help="GPUs of one node, e.g. 8x80GB (sizes in GiB); default: this host's, from NVML")
    p.add_argument("--nodes", type=int, default=1, help="nodes with --gpus each; default 1")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM's budget per GPU; default 0.9")
    p.add_argument("--overhead-gib", type=float, default=2.0,
                   help="runtime overhead per GPU (CUDA context, activations, CUDA graphs); default 2")
    p.add_argument("--replicas", type=int, default=None, help="at most this many data-parallel replicas")
    p.add_argument("--served-name", help="served model name (default: the model id or directory name)")
    p.add_argument("--fleet-file", help="where to write the planned fleet file")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-fleet", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start every instance and the gateway, in the foreground")
    up.add_argument("-c", "--config", default=None, help="fleet file (YAML or JSON); or plan one with --model")
    _plan_arguments(up, model_required=False)
    up.add_argument("--dry-run", action="store_true",
                    help="with --model: print the plan and the fleet file, start nothing, exit 0")
    pl = sub.add_parser("plan", help="capacity plan: memory, fit, TP/PP layout, replicas, VRAM tier, fleet file")
    _plan_arguments(pl, model_required=True)
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    gw = sub.add_parser("gateway", help="run the gateway alone")
    gw.add_argument("-c", "--config", required=True, help="Infernet-style JSON (either shape) or a fleet file")
    gw.add_argument("--workers", type=int, default=None, metavar="N",
                    help="gateway server processes on the one port (default: FLEET_WORKERS, gateway.workers, 1)")
    ck = sub.add_parser("check", help="validate a fleet file and print the resolved plan")
    ck.add_argument("-c", "--config", required=True)
    sub.add_parser("gpus", help="GPUs as NVML sees them, with their VRAM tier")
    st = sub.add_parser("status", help="live table from a running gateway's /fleet")
    st.add_argument("--url", default="http://127.0.0.1:8080")
    st.add_argument("--supervisor-url", default=None, help="also show instance states from the supervisor")
    ic = sub.add_parser("infernet-config", help="print the Infernet daemon config JSON for a fleet")
    ic.add_argument("-c", "--config", required=True)
    tm = sub.add_parser("make-tiny-model", help="generate the tiny random-weight model used by the demo and tests")
    tm.add_argument("directory")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "gateway":
            from gateway.main import run_gateway

            return run_gateway(args.config, args.workers)
        if args.command == "plan":
            from fleet_planner.command import cmd_plan

            return cmd_plan(args)
        if args.command == "up" and (args.config is None) == (args.model is None):
            raise ConfigError("up: give exactly one of -c/--config (a fleet file) and --model (plan one)")
        if args.command == "up" and args.model is not None:
            from fleet_planner.command import cmd_up_model

            return cmd_up_model(args)
        if args.command == "up" and args.dry_run:
            raise ConfigError("--dry-run: only with --model; `vllm-fleet check -c FILE` shows a fleet file's plan")
        if args.command == "make-tiny-model":
            from vllm_fleet.tinymodel import make_tiny_model

            print(make_tiny_model(args.directory))
            return 0
        from fleet_supervisor import commands

        handler: Callable[[], int] = {
            "up": lambda: commands.cmd_up(args.config),
            "check": lambda: commands.cmd_check(args.config),
            "gpus": commands.cmd_gpus,
            "status": lambda: commands.cmd_status(args.url, args.supervisor_url),
            "infernet-config": lambda: commands.cmd_infernet_config(args.config),
        }[args.command]
        return handler()
    except ConfigError as e:
        print(f"vllm-fleet: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
