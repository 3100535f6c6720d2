"""The request path's metric updates, kept as plain sums and handed to prometheus_client in batches.

prometheus_client takes a lock and makes about four Python calls for every ``inc()``; the request
path made eight such updates per request (its count, the routing decision, the backend's in-flight
gauge up and down, two histograms): about 2.5 µs per request (bench/compare/metrics_cost.py), and
turning them off took about 4 µs of the gateway's ~50 µs of user CPU per request in
bench/compare's 64-concurrent phase. Here an update is a dict operation; ``flush()`` hands the sums
over: one ``inc`` per series touched, one per histogram bucket touched, the last value of each gauge.

When: with one worker the registry is only read through ``render()``, which flushes first, so
nothing is scheduled. With ``--workers N`` the other workers read this one's values from
prometheus_client's multiprocess files, so the first update in a loop turn schedules a flush at
the end of that turn (a scrape served in a later turn sees it); outside a running loop the update
is handed over at once.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from typing import Protocol


class _Incrementable(Protocol):
    def inc(self, amount: float) -> None: ...


class _Settable(Protocol):
    def set(self, value: float) -> None: ...


class _HistogramChild(Protocol):
    # prometheus_client's Histogram child: its bucket values and sum (there is no batched observe).
    _upper_bounds: list[float]
    _buckets: list[_Incrementable]
    _sum: _Incrementable


class Tally:
    __slots__ = ("_arm", "_counts", "_each_turn", "_gauges", "_hists")

    def __init__(self, each_turn: bool) -> None:
        """``each_turn``: other processes read the values (multiprocess files), so flush every turn."""
        self._counts: dict[_Incrementable, int] = {}
        self._hists: dict[_HistogramChild, dict[int, float]] = {}  # hits per bucket touched; -1: the sum
        self._gauges: dict[_Settable, float] = {}
        self._each_turn = each_turn
        self._arm = each_turn  # the next update schedules a flush

    def inc(self, child: _Incrementable) -> None:
        counts = self._counts
        counts[child] = counts.get(child, 0) + 1
        if self._arm:
            self._schedule()

    def observe(self, child: _HistogramChild, value: float) -> None:
        acc = self._hists.get(child)
        if acc is None:
            acc = self._hists[child] = {-1: 0.0}
        # The first bucket whose bound is >= value, as prometheus_client's observe(); the last bound is +Inf.
        i = bisect_left(child._upper_bounds, value)
        acc[i] = acc.get(i, 0) + 1
        acc[-1] += value
        if self._arm:
            self._schedule()

    def set(self, child: _Settable, value: float) -> None:
        self._gauges[child] = value
        if self._arm:
            self._schedule()

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._arm = False
        loop.call_soon(self.flush)

    def flush(self) -> None:
        self._arm = self._each_turn
        if self._counts:
            counts, self._counts = self._counts, {}
            for child, n in counts.items():
                child.inc(n)
        if self._hists:
            hists, self._hists = self._hists, {}
            for h, acc in hists.items():
                for i, v in acc.items():
                    (h._sum if i < 0 else h._buckets[i]).inc(v)
        if self._gauges:
            gauges, self._gauges = self._gauges, {}
            for g, value in gauges.items():
                g.set(value)
