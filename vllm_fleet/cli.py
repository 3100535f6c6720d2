"""``vllm-fleet`` subcommands (DESIGN §2). Each maps onto one function of the gateway or the
supervisor package; imports happen inside the command so that ``vllm-fleet gpus`` never loads
the gateway, and a config error exits 2 whichever side finds it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from fleetspec.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-fleet", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start every instance and the gateway, in the foreground")
    up.add_argument("-c", "--config", required=True, help="fleet file (YAML or JSON)")
    gw = sub.add_parser("gateway", help="run the gateway alone")
    gw.add_argument("-c", "--config", required=True, help="Infernet-style JSON (either shape) or a fleet file")
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

            return run_gateway(args.config)
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
