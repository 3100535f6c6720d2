"""``vllm serve`` for the tests: vLLM's serve subcommand alone, run as a script
(``vllm_command: [python, tests/support/vllm_serve.py]``).

Only the ``vllm serve`` CLI runs more than one API server (``--api-server-count``), and on this
project's CPU machines vLLM 0.32's CLI module (``vllm.entrypoints.cli.main``) stops with an illegal
instruction: importing its ``preload`` subcommand loads the CPU kernels in the launcher
(docs/fleet-file.md). This parses the arguments and runs the serve subcommand as the CLI would,
without importing the other subcommands.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    ServeSubcommand.cmd(args)


if __name__ == "__main__":
    main(sys.argv[1:])
