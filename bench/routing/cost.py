"""Gateway CPU per routing decision, by policy, on the routing benchmark's first-turn prompts
(no sockets: the hint, the choice and, for prefix_aware, the index update). Then prefix_aware as a
worker of 4 sees it: in-flight counts from the shared table, and either an index of its own or
the workers' shared one (gateway/prefixshare.py). The rows alternate
over ``--passes``; each prints every pass and the median.

    .venv/bin/python bench/routing/cost.py [--passes 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import workload  # noqa: E402

from fleetspec.policies import Policy  # noqa: E402
from fleetspec.tiers import VramTier  # noqa: E402
from gateway.backend import Backend, BackendSet  # noqa: E402
from gateway.pool import BackendPool  # noqa: E402
from gateway.prefixshare import PrefixTable, create, slots_for  # noqa: E402
from gateway.routing import Router, hint_for  # noqa: E402
from gateway.shared import SharedCounts  # noqa: E402
from gateway.shared import create as create_counts  # noqa: E402
from gateway.state import BackendState as S  # noqa: E402
from gateway.workers import shared_rows  # noqa: E402

BLOCKS = 200_000


def per_request_us(pool: BackendPool, docs: list[dict[str, Any]]) -> float:
    affine = pool.affine("m")
    rounds = 20
    t = time.process_time()
    for _ in range(rounds):
        for d in docs:
            pool.pick("m", (), hint_for(d, None) if affine else None)
    return (time.process_time() - t) / (rounds * len(docs)) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=5)
    a = ap.parse_args()
    convs = workload.build("uniform", 64, 4, 4, 2000, 12000, 0.8, 1.0, 8)
    docs = [{"model": "m", "messages": [{"role": "system", "content": c.system},
                                       {"role": "user", "content": c.next_user(0)}]} for c in convs]
    chars = sum(len(m["content"]) for d in docs for m in d["messages"]) / len(docs)
    print(f"{len(docs)} prompts of {chars:,.0f} characters on average, 2 replicas")
    with tempfile.TemporaryDirectory() as d:
        shared = SharedCounts(create_counts(d, shared_rows(4)), shared_rows(4))
        table = PrefixTable(create(d, slots_for(BLOCKS)), slots_for(BLOCKS), shared)

        def pool(policy: Policy, table: PrefixTable | None = None,
                 shared: SharedCounts | None = None) -> Callable[[], float]:
            backends = [Backend(n, "http://x", VramTier.UNKNOWN, ["m"], ["m"]) for n in "ab"]
            for b in backends:
                b.state = S.HEALTHY
            index = table.index("m") if table is not None else None
            p = BackendPool(BackendSet(backends), None, lambda _: Router(policy, 1.25, BLOCKS, 3.0, index),
                            shared=shared)
            return lambda: per_request_us(p, docs)

        rows = {policy.value: pool(policy) for policy in Policy}
        rows["prefix_aware, worker of 4, own index"] = pool(Policy.PREFIX_AWARE, shared=shared)
        rows["prefix_aware, worker of 4, shared index"] = pool(Policy.PREFIX_AWARE, table, shared)
        seen: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(a.passes):
            for name, run in rows.items():
                seen[name].append(run())
        for name, xs in seen.items():
            print(f"{name:40s} {statistics.median(xs):8.1f} µs per request (passes: "
                  f"{', '.join(f'{x:.1f}' for x in xs)})")
        table.close()
        shared.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
