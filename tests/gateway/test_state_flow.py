"""The gateway's backend state flows one way (docs/architecture.md §2): writers move a backend along
the edges of gateway/state.py, subscribers react, and no module imports back up the chain."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from fleetspec.policies import Policy
from fleetspec.tiers import VramTier
from gateway.backend import Backend, BackendSet
from gateway.limiter import Limiter
from gateway.metrics import GatewayMetrics
from gateway.pool import BackendPool
from gateway.routing import Router, hint_for
from gateway.settings import GatewaySettings
from gateway.state import BackendState as S
from gateway.state import TransitionError, Writer

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


def _imports() -> dict[str, set[str]]:
    """gateway module -> the gateway modules it imports, TYPE_CHECKING imports included."""
    graph: dict[str, set[str]] = {}
    for path in GATEWAY.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gateway."):
                deps.add(node.module.split(".")[1])
            elif isinstance(node, ast.ImportFrom) and node.module == "gateway":
                deps.update(a.name for a in node.names)
        graph[path.stem] = deps - {path.stem}
    return graph


def test_no_import_cycle_in_the_gateway() -> None:
    graph = _imports()
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path[path.index(d):], d]))
            if d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_writers_do_not_reach_into_readers() -> None:
    graph = _imports()
    for writer in ("health", "ejection", "poller", "loadscrape", "backend", "state", "load"):
        assert not graph[writer] & {"pool", "limiter", "proxy", "app", "routing"}, (writer, graph[writer])


def _b(name: str, state: S = S.HEALTHY) -> Backend:
    b = Backend(name, f"http://{name}", VramTier.UNKNOWN, ["m"], ["m"])
    b.state = state
    return b


def test_probes_never_wake_a_sleeping_backend() -> None:
    b = _b("a", S.ASLEEP)
    BackendSet([b])
    for _ in range(5):  # a sleeping vLLM answers /health with 200
        assert not b.record_probe(True, None, 3, 2)
    assert b.state is S.ASLEEP and not b.healthy and b.servable
    b.move(Writer.SUPERVISOR, S.UNKNOWN)  # the supervisor says it is awake: a probe must still confirm it
    assert not b.healthy
    assert b.record_probe(True, None, 3, 2) and b.state is S.HEALTHY
    with pytest.raises(TransitionError):
        b.move(Writer.PROBE, S.ASLEEP)
    with pytest.raises(TransitionError):
        b.move(Writer.REQUESTS, S.UNHEALTHY)


def test_draining_is_servable_only_when_it_will_wake() -> None:
    b = _b("a")
    b.move(Writer.SUPERVISOR, S.DRAINING)
    assert not b.healthy and not b.servable
    b.wakes = True
    assert b.servable


def test_subscribers_hear_every_change_in_order_and_index_is_current() -> None:
    a, b = _b("a"), _b("b")
    backends = BackendSet([a])
    heard: list[tuple[str, S | None, S | None, int]] = []
    backends.subscribe(lambda x, old, new: heard.append((x.name, old, new, len(backends.replicas("m")))))
    backends.add(b)
    b.move(Writer.SUPERVISOR, S.ASLEEP)
    backends.remove(a)
    assert heard == [("b", None, S.HEALTHY, 2), ("b", S.HEALTHY, S.ASLEEP, 2), ("a", S.HEALTHY, None, 1)]


def test_pool_forgets_a_replica_that_went_to_sleep() -> None:
    a, b = _b("a"), _b("b")
    backends = BackendSet([a, b])
    pool = BackendPool(backends, None, lambda _: Router(Policy.PREFIX_AWARE, 1.25, 1000, 3.0))
    doc = {"messages": [{"role": "user", "content": "the same long prompt " * 20}]}
    first = pool.pick("m", hint=hint_for(doc, None))
    assert first is not None and pool.pick("m", hint=hint_for(doc, None)) is first
    first.move(Writer.SUPERVISOR, S.ASLEEP)  # level 1 and 2 both drop the KV cache
    index = pool.routers["m"].index
    assert index is not None
    assert index.deepest(hint_for(doc, None).blocks, [a, b])[1] == []


async def test_limiter_hands_a_slot_to_a_waiter_when_a_backend_enters_rotation() -> None:
    a = _b("a")
    backends = BackendSet([a])
    lim = Limiter(BackendPool(backends, None), GatewaySettings(backend_max_concurrency=1, queue_timeout_s=5),
                  GatewayMetrics())
    loop = asyncio.get_running_loop()
    assert await lim.acquire("m", (), loop.time() + 5) is a
    waiter = asyncio.create_task(lim.acquire("m", (), loop.time() + 5))
    await asyncio.sleep(0.01)
    b = _b("b", S.UNKNOWN)
    backends.add(b)
    assert not waiter.done()
    b.record_probe(True, None, 3, 2)  # in rotation: the waiter gets its slot at once
    assert await asyncio.wait_for(waiter, 1) is b
