"""``python -m fleet_supervisor -c fleet.yaml``: the same as ``vllm-fleet up -c fleet.yaml``."""

from __future__ import annotations

import argparse
import sys

from fleetspec.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleet_supervisor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="examples:\n  python -m fleet_supervisor -c examples/demo-cpu.yaml")
    parser.add_argument("-c", "--config", required=True, help="fleet file (YAML or JSON)")
    args = parser.parse_args(argv)
    from fleet_supervisor.commands import cmd_up

    try:
        return cmd_up(args.config)
    except ConfigError as e:
        print(f"supervisor: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
