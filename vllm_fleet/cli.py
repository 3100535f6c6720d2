"""``vllm-fleet`` subcommands (DESIGN §2). Each maps onto one function of the gateway or the
supervisor package; imports happen inside the command so that ``vllm-fleet gpus`` never loads
the gateway, and a config error exits 2 whichever side finds it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from fleet_planner.modelargs import add_plan_arguments
from fleetspec.errors import ConfigError

# Shown under "examples:" in each subcommand's --help. tests/test_cli_help.py parses every line
# that starts with "vllm-fleet", so an example that no longer matches the flags fails a test.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "up": (
        "vllm-fleet up -c examples/demo-cpu.yaml             # every instance and the gateway; Ctrl-C stops all",
        "vllm-fleet up --model /models/gemma-3-27b-it --context 32768 --dry-run   # plan only, start nothing",
        "vllm-fleet up --model /models/gemma-3-27b-it --context 32768             # plan, then start the plan",
        "vllm-fleet up --model /models/qwen2.5-14b --model /models/llama3.1-8b --dry-run   # two models side by side",
    ),
    "plan": (
        "vllm-fleet plan --model /models/Llama-3.1-70B-Instruct --gpus 8x80GB --context 32768 --kv-dtype fp8",
        "vllm-fleet plan --model Qwen/Qwen2.5-7B-Instruct --params 7.6B --layers 28 --hidden 3584 --heads 28 "
        "--kv-heads 4 --json",
        "vllm-fleet plan --model /models/qwen2.5-7b --fleet-file fleet.yaml   # write the planned fleet file",
        "vllm-fleet plan --context 8192 --model /models/qwen2.5-14b --model /models/llama3.1-8b "
        "--model /models/mistral-7b --asleep --gpus 4x141GB   # side by side; the third shares the second's GPUs",
    ),
    "gateway": (
        "vllm-fleet gateway -c infernet.json                 # Infernet-style JSON: vllm_host or vllm_instances",
        "FLEET_API_KEYS=k1,k2 vllm-fleet gateway -c fleet.yaml --workers 4",
    ),
    "check": ("vllm-fleet check -c fleet.yaml                      # the plan, or exit 2 naming each bad key",),
    "gpus": ("vllm-fleet gpus",),
    "status": (
        "vllm-fleet status",
        "vllm-fleet status --url http://10.0.0.5:8080 --supervisor-url http://127.0.0.1:9400",
    ),
    "infernet-config": ("vllm-fleet infernet-config -c fleet.yaml > infernet.json",),
    "sleep": (
        "vllm-fleet sleep qwen-7b                            # admin key from .fleet/admin.key",
        'vllm-fleet sleep qwen-7b --url http://10.0.0.5:8080 --admin-key "$FLEET_ADMIN_KEY"',
    ),
    "wake": ("vllm-fleet wake qwen-7b",),
    "reload": (
        "vllm-fleet reload -c fleet.yaml                     # added start, removed drain and stop, changed restart",
        "vllm-fleet reload -c fleet.yaml --wait 600          # and wait until every instance is up",
    ),
    "restart": ("vllm-fleet restart qwen-7b --state-dir /srv/fleet/.fleet",),
    "make-tiny-model": (
        "vllm-fleet make-tiny-model .fleet/tiny-model        # what the demo and the tests serve",
        "vllm-fleet make-tiny-model /tmp/big --hidden 2048 --layers 16 --heads 16 --kv-heads 4 --dtype bfloat16",
    ),
}


def examples(lines: tuple[str, ...]) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _add_examples(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, parser in sub.choices.items():
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.epilog = examples(EXAMPLES[name]) if name in EXAMPLES else None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-fleet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=examples(("vllm-fleet check -c fleet.yaml", "vllm-fleet up -c fleet.yaml"))
                                + "\n\nEach subcommand's --help shows examples of its own.")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start every instance and the gateway, in the foreground")
    up.add_argument("-c", "--config", default=None, help="fleet file (YAML or JSON); or plan one with --model")
    add_plan_arguments(up, model_required=False)
    up.add_argument("--dry-run", action="store_true",
                    help="with --model: print the plan and the fleet file, start nothing, exit 0")
    pl = sub.add_parser("plan", help="capacity plan: memory, fit, TP/PP layout, replicas, VRAM tier, fleet file")
    add_plan_arguments(pl, model_required=True)
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
    rl = sub.add_parser("reload", help="apply an edited fleet file to the running fleet (as SIGHUP to `up`)")
    rl.add_argument("-c", "--config", required=True, help="the fleet file `up` runs (checked here first)")
    rl.add_argument("--wait", type=float, default=None, metavar="S",
                    help="wait up to S seconds until every instance in the file is up")
    for action, what in (("sleep", "put an instance to sleep (it drains first; a request wakes it)"),
                         ("wake", "wake a sleeping instance"),
                         ("restart", "restart an instance (it drains first; streams move to another replica)")):
        ad = sub.add_parser(action, help=what)
        ad.add_argument("name", help="the instance's name in the fleet file")
        ad.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway (default %(default)s)")
        ad.add_argument("--admin-key", default=None,
                        help="admin key (default: FLEET_ADMIN_KEY, else STATE_DIR/admin.key that `up` made)")
        ad.add_argument("--state-dir", default=".fleet", help="the fleet's supervisor.state_dir (default %(default)s)")
    tm = sub.add_parser("make-tiny-model", help="generate the tiny random-weight model used by the demo and tests")
    tm.add_argument("directory")
    size = tm.add_argument_group("a bigger random-weight model (GPU runs; default: the tiny one)")
    for flag, default in (("hidden", 128), ("layers", 2), ("heads", 2), ("kv-heads", 1), ("intermediate", 256)):
        size.add_argument(f"--{flag}", type=int, default=default)
    size.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    size.add_argument("--device", default="cpu", help="where to make the weights: cpu, cuda")
    _add_examples(sub)
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
            from vllm_fleet.tinymodel import Shape, make_tiny_model

            print(make_tiny_model(args.directory, Shape(args.hidden, args.layers, args.heads, args.kv_heads,
                                                        args.intermediate, args.dtype, args.device)))
            return 0
        from fleet_supervisor import commands

        if args.command == "reload":
            return commands.cmd_reload(args.config, args.wait)
        if args.command in ("sleep", "wake", "restart"):
            return commands.cmd_admin(args.url, args.name, args.command,
                                      commands.admin_key_for(args.admin_key, args.state_dir))

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
