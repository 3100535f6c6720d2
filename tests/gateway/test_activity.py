"""The console's record of requests (gateway/activity.py): what the metrics calls fill in, the
recent list, the per-model buckets, and prompt excerpts only when asked for."""

from __future__ import annotations

import asyncio

from gateway.activity import BUCKET_S, BUCKETS, Activity, prompt_excerpt
from gateway.metrics import GatewayMetrics


async def test_a_request_task_fills_its_own_entry() -> None:
    m = GatewayMetrics()

    async def request(model: str, status: int, ttfb: float | None) -> None:
        e = m.activity.begin()
        await asyncio.sleep(0)  # other requests run in between: each task has its own entry
        if ttfb is not None:
            m.observe_ttfb(model, ttfb)
        m.count(model, "b1", status)
        m.activity.end(e)

    await asyncio.gather(request("m1", 200, 0.01), request("m2", 503, None), request("m1", 200, 0.03))
    rows = m.activity.requests()
    assert sorted((r["model"], r["status"], r["ttfb_s"]) for r in rows) == [
        ("m1", 200, 0.01), ("m1", 200, 0.03), ("m2", 503, None)]
    assert all("prompt" not in r for r in rows)
    series = m.activity.series()
    assert len(series["m1"]["req_per_s"]) == BUCKETS and series["m2"]["errors"][-1] == 1
    assert series["m1"]["ttfb_p50_s"][-1] == 0.03 and series["m1"]["ttfb_p99_s"][-1] == 0.03


def test_entries_without_an_outcome_are_not_kept() -> None:
    a = Activity()
    a.end(a.begin())
    assert a.requests() == [] and a.series() == {}


def test_buckets_are_ten_seconds_and_the_axis_is_time() -> None:
    a = Activity()
    for wall in (1000.0, 1001.0, 1015.0):
        e = a.begin()
        e.model, e.status, e.wall = "m", 200, wall
        a.end(e)
    s = a.series(now=1019.0)["m"]
    assert s["start"][-2:] == [1000.0, 1010.0] and s["bucket_s"] == BUCKET_S
    assert s["req_per_s"][-2:] == [0.2, round(1 / 9, 3)]  # the current bucket: over the 9 s elapsed


def test_prompt_excerpt() -> None:
    assert prompt_excerpt({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b" * 500}]}) \
        == "b" * 200
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}]}
    assert prompt_excerpt(parts) == "hi"
    assert prompt_excerpt({"prompt": "once"}) == "once" and prompt_excerpt({"prompt": [1, 2]}) == ""
