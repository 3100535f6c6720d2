"""Gateway CPU per routing decision, by policy, on the routing benchmark's first-turn prompts
(no sockets: the hint, the choice and, for prefix_aware, the index update).

    .venv/bin/python bench/routing/cost.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import workload  # noqa: E402

from fleetspec.policies import Policy  # noqa: E402
from fleetspec.tiers import VramTier  # noqa: E402
from gateway.backend import Backend, BackendSet  # noqa: E402
from gateway.pool import BackendPool  # noqa: E402
from gateway.routing import Router, hint_for  # noqa: E402
from gateway.state import BackendState as S  # noqa: E402


def main() -> int:
    convs = workload.build("uniform", 64, 4, 4, 2000, 12000, 0.8, 1.0, 8)
    docs = [{"model": "m", "messages": [{"role": "system", "content": c.system},
                                       {"role": "user", "content": c.next_user(0)}]} for c in convs]
    chars = sum(len(m["content"]) for d in docs for m in d["messages"]) / len(docs)
    print(f"{len(docs)} prompts of {chars:,.0f} characters on average, 2 replicas")
    for policy in Policy:
        backends = [Backend(n, "http://x", VramTier.UNKNOWN, ["m"], ["m"]) for n in "ab"]
        for b in backends:
            b.state = S.HEALTHY
        pool = BackendPool(BackendSet(backends), None, lambda _, p=policy: Router(p, 1.25, 200_000, 3.0))
        affine = pool.affine("m")
        rounds = 20
        t = time.process_time()
        for _ in range(rounds):
            for d in docs:
                pool.pick("m", (), hint_for(d, None) if affine else None)
        per = (time.process_time() - t) / (rounds * len(docs))
        print(f"{policy.value:16s} {per * 1e6:8.1f} µs per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
