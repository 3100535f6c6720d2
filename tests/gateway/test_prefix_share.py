"""The workers' shared prefix index (gateway/prefixshare.py): two workers' views of one table in
one process, as two gateway workers map it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetspec.policies import Policy
from fleetspec.tiers import VramTier
from gateway import prefixshare
from gateway.backend import Backend, BackendSet
from gateway.pool import BackendPool
from gateway.prefix import block_hashes
from gateway.prefixshare import HOLDERS, PrefixTable
from gateway.routing import PREFIX_MATCH, PREFIX_MISS, Router, hint_for
from gateway.shared import SharedCounts, create
from gateway.state import BackendState, Writer
from gateway.workers import PREFIXES_ENV, worker_environment

SLOTS = 1024


def replicas() -> list[Backend]:
    """One worker's own Backend objects for the replicas every worker sees."""
    out = [Backend(n, f"http://{n}", VramTier.UNKNOWN, ["m"], ["m"]) for n in ("r1", "r2", "r3", "r4")]
    for b in out:
        b.state = BackendState.HEALTHY
    return out


@pytest.fixture
def tables(tmp_path: Path) -> Iterator[tuple[PrefixTable, PrefixTable]]:
    counts = create(str(tmp_path), 2)
    path = prefixshare.create(str(tmp_path), SLOTS)
    sa, sb = SharedCounts(counts, 2, pid=os.getppid()), SharedCounts(counts, 2)
    ta, tb = PrefixTable(path, SLOTS, sa), PrefixTable(path, SLOTS, sb)
    try:
        yield ta, tb
    finally:
        for t in (ta, tb):
            t.close()
            t.shared.close()


def test_what_one_worker_records_the_other_finds(tables: tuple[PrefixTable, PrefixTable]) -> None:
    ta, tb = tables
    (a1, a2, *_), (b1, b2, *_) = replicas(), replicas()
    ia, ib = ta.index("m"), tb.index("m")
    ia.record([11, 12, 13], a1)
    ib.record([11, 12], b2)
    # The other worker's Backend objects, by name: the deepest prefix first, then the newest holder.
    assert ib.deepest([11, 12, 13, 99], [b1, b2]) == (3, [b1])
    assert ia.deepest([11, 12], [a1, a2]) == (2, [a2, a1])
    assert ia.deepest([11, 12], [a1]) == (2, [a1])  # only usable replicas
    assert ia.deepest([98, 99], [a1, a2]) == (0, [])
    assert tb.index("other model").deepest([11, 12, 13], [b1, b2]) == (0, [])  # salted by model
    assert len(ia) == len(ib) == 3


def test_a_block_keeps_its_newest_holders_once_each(tables: tuple[PrefixTable, PrefixTable]) -> None:
    ta, _ = tables
    reps = replicas()
    idx = ta.index("m")
    for b in [*reps, reps[1]]:
        idx.record([5], b)
    assert idx.deepest([5], reps) == (1, [reps[1], reps[3], reps[2]][:HOLDERS])


def test_a_forgotten_cache_is_forgotten_by_every_worker(tables: tuple[PrefixTable, PrefixTable]) -> None:
    ta, tb = tables
    (a1, a2, *_), (b1, b2, *_) = replicas(), replicas()
    ia, ib = ta.index("m"), tb.index("m")
    ia.record([1, 2], a1)
    ia.record([1], a2)
    ib.forget(b1)  # worker b saw r1 leave rotation
    assert ia.deepest([1, 2], [a1, a2]) == (1, [a2])
    assert ib.deepest([1, 2], [b1, b2]) == (1, [b2])
    ia.record([1, 2], a1)  # sent there again, under its new generation
    assert ib.deepest([1, 2], [b1, b2]) == (2, [b1])
    ib.forget(b1)
    ta.shared.set(ta.shared.column("r1") or 0, 0, prefixshare.FORGOTTEN)  # a replaced worker's zeroed row
    assert ia.deepest([1, 2], [a1, a2]) == (1, [a2])  # still forgotten: the generation is the largest


def test_two_workers_pools_route_a_known_prefix_to_one_replica(tables: tuple[PrefixTable, PrefixTable]) -> None:
    """Worker b has never seen the prompt; worker a sent it to a replica: b sends it there too
    (with an index of its own, b's was a miss, balanced by load, here to the other replica)."""
    ta, tb = tables
    decisions: list[tuple[str, ...]] = []

    def pool(t: PrefixTable) -> tuple[BackendPool, list[Backend]]:
        reps = replicas()[:2]
        return BackendPool(BackendSet(reps), None, lambda m: Router(Policy.PREFIX_AWARE, 1.25, 1000, 3.0, t.index(m)),
                           lambda *d: decisions.append(d), shared=t.shared), reps

    (pa, ra), (pb, rb) = pool(ta), pool(tb)
    doc = {"model": "m", "prompt": "a system prompt that many requests share " * 20}
    first = pa.pick("m", hint=hint_for(doc, None))
    assert first is not None and decisions[-1][2] == PREFIX_MISS
    first.in_flight += 1  # still open: a balanced choice would now take the other replica
    ta.shared.set(ta.shared.column(first.name) or 0, 1)
    again = pb.pick("m", hint=hint_for({**doc, "prompt": doc["prompt"] + "and a question"}, None))
    assert again is not None and again.name == first.name and decisions[-1][2] == PREFIX_MATCH
    # The replica goes to sleep in worker b's view: its cache is gone for worker a too.
    rb[ra.index(first)].move(Writer.SUPERVISOR, BackendState.ASLEEP)
    assert pa.router("m").index is not None
    assert pa.router("m").index.deepest(block_hashes(doc["prompt"]), ra) == (0, [])


def test_slots_are_a_power_of_two_at_least_the_blocks() -> None:
    assert [prefixshare.slots_for(n) for n in (1, 2, 3, 1000, 1024, 200_000)] == [2, 2, 4, 1024, 1024, 262_144]


def test_every_turn_of_a_chat_goes_to_one_replica_whichever_worker_takes_it(tmp_path: Path) -> None:
    """Four workers' pools over one table, each turn of each conversation on another worker:
    every turn goes where the conversation's history was sent, and the conversations spread."""
    counts = create(str(tmp_path), 4)
    path = prefixshare.create(str(tmp_path), SLOTS * 64)
    workers = []
    for _ in range(4):
        shared = SharedCounts(counts, 4)
        table = PrefixTable(path, SLOTS * 64, shared)
        reps = replicas()[:3]
        decisions: list[tuple[str, ...]] = []
        pool = BackendPool(BackendSet(reps), None, lambda m, t=table: Router(Policy.PREFIX_AWARE, 1.25, 1000, 3.0,
                                                                              t.index(m)),
                           lambda *d, log=decisions: log.append(d), shared=shared)
        workers.append((pool, decisions, table))
    try:
        homes = set()
        for c in range(24):
            messages = [{"role": "user", "content": f"conversation {c}: here is my document " * 8}]
            chosen = []
            for turn in range(6):
                pool, decisions, _ = workers[(c + turn) % 4]
                b = pool.pick("m", hint=hint_for({"model": "m", "messages": messages}, None))
                assert b is not None
                chosen.append(b.name)
                assert decisions[-1][2] == (PREFIX_MISS if turn == 0 else PREFIX_MATCH)
                messages += [{"role": "assistant", "content": f"answer {turn}"},
                             {"role": "user", "content": f"follow-up {turn}"}]
            assert len(set(chosen)) == 1, (c, chosen)
            homes.add(chosen[0])
        assert homes == {"r1", "r2", "r3"}
    finally:
        for _, _, t in workers:
            t.close()
            t.shared.close()


@pytest.mark.parametrize("given", [None, "random", "1234"])
def test_workers_get_one_hash_seed_and_the_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 given: str | None) -> None:
    """Prompt blocks are keyed by Python's str hash, so every worker must hash alike: a fixed seed
    is kept, anything else (unset, "random") becomes one random seed for all of them."""
    if given is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", given)
    config = tmp_path / "gateway.json"
    with worker_environment(str(config), 4, 200_000) as directory:
        seed = os.environ["PYTHONHASHSEED"]
        assert seed.isdigit() and (given != "1234" or seed == "1234")
        table = Path(os.environ[PREFIXES_ENV])
        assert table.parent == Path(directory) and table.stat().st_size == 16 * 262_144
    assert not Path(directory).exists() and os.environ.get("PYTHONHASHSEED") == given
