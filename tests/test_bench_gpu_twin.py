"""The twin-pass GPU benchmark's arithmetic (bench/gpu/twin_pairs.py, twin_stats.py, window_client.py):
which path each side took, how swap pairs cancel a difference between the GPUs, which spreads are
reported, and a side's window figures; then one real twin pass against two fake vLLMs and a gateway."""

from __future__ import annotations

import math
import os
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.support.bench_gpu import DEFAULTS_512, POOL512, RESULTS, printed
from tests.support.bench_gpu import load as _load


def _side(tps: float, ttft: float = 100.0) -> dict[str, Any]:
    return {"output_throughput": tps, "median_ttft_ms": ttft}


def _pass(kind: str, a: float, b: float, gateway: float = 1.0) -> dict[str, Any]:
    """Instance a serves ``a`` tokens/s, b ``b``; the gateway's side gets ``gateway`` × its instance's."""
    if kind == "aa":
        sides = {"direct:a": _side(a), "direct:b": _side(b)}
    elif kind == "gb":
        sides = {"direct:a": _side(a), "gateway:b": _side(b * gateway)}
    else:
        sides = {"direct:b": _side(b), "gateway:a": _side(a * gateway)}
    return {"conc": 512, "kind": kind, "sides": sides, "queued": 0}


def test_sides_swap_the_gpus_between_gb_and_ga() -> None:
    sides = _load("twin_pairs").sides
    assert [p for p, _, _ in sides("gb")] == ["direct:a", "gateway:b"]
    assert [p for p, _, _ in sides("ga")] == ["direct:b", "gateway:a"]
    assert [(p, m) for p, _, m in sides("aa")] == [("direct:a", "tiny-a"), ("direct:b", "tiny-b")]
    # the gateway side asks the gateway for the instance's own name, so it lands on that GPU
    assert sides("ga")[1][1:] == ("http://127.0.0.1:8080", "tiny-a")
    # a jitter pass is direct on both sides, the second pausing before each request
    assert sides("jb") == [("direct:a", "http://127.0.0.1:8001", "tiny-a"),
                           ("jitter:b", "http://127.0.0.1:8002", "tiny-b")]
    assert [p for p, _, _ in sides("ja")] == ["direct:b", "jitter:a"]


def test_swap_pairs_cancel_a_faster_gpu() -> None:
    stats = _load("twin_stats")
    # b is 20 % faster than a in every pass; the gateway costs 3 %. One pass alone reads 1.164 or
    # 0.808; a gb with its ga reads the gateway's 0.97.
    rows = [_pass("gb", 100, 120, 0.97), _pass("ga", 100, 120, 0.97), _pass("aa", 100, 120)]
    assert stats.pass_ratio(rows[0], "output_throughput") == pytest.approx(1.2 * 0.97)
    assert stats.pass_ratio(rows[1], "output_throughput") == pytest.approx(0.97 / 1.2)
    assert stats.pass_ratio(rows[2], "output_throughput") == pytest.approx(1.2)
    assert stats.swap_pairs(rows, "output_throughput") == [pytest.approx(0.97)]


def test_swap_pairs_take_each_pass_once_and_skip_aa_between() -> None:
    stats = _load("twin_stats")
    rows = [_pass("gb", 100, 100, 0.9), _pass("aa", 100, 100), _pass("ga", 100, 100, 1.1),  # a pair across aa
            _pass("ga", 100, 100, 1.0), _pass("ga", 100, 100, 0.8), _pass("gb", 100, 100, 0.8),  # the later ga
            _pass("gb", 100, 100, 2.0)]  # left alone at the end: no pair
    got = stats.swap_pairs(rows, "output_throughput")
    assert got == [pytest.approx(math.sqrt(0.9 * 1.1)), pytest.approx(0.8)]


def test_sequential_spread_follows_each_instance_served_direct() -> None:
    stats = _load("twin_stats")
    rows = [_pass("gb", 100, 999), _pass("ga", 999, 50), _pass("aa", 110, 55), _pass("gb", 121, 999)]
    # a direct: 100, 110, 121; b direct: 50, 55
    assert sorted(stats.sequential(rows, "output_throughput")) == pytest.approx([1.1, 1.1, 1.1])


def test_report_lists_each_spread_and_the_pairs_it_would_take() -> None:
    stats = _load("twin_stats")
    rows = [_pass("gb", 100, 100, 0.95), _pass("ga", 100, 100, 0.95), _pass("aa", 100, 105),
            _pass("gb", 100, 100, 1.05), _pass("ga", 100, 100, 1.05), _pass("aa", 100, 95)]
    line = next(x for x in stats.report(rows).splitlines() if x.startswith("| tokens/s |"))
    cells = [c.strip() for c in line.split("|")]
    sd = statistics.stdev([math.log(0.95), math.log(1.05)])
    assert cells[2].startswith("1.000 (0.950–1.050), 1 of 2")
    assert cells[4] == f"{sd:.3f} (2)"
    assert cells[5] == f"{statistics.stdev([math.log(1.05), math.log(0.95)]):.3f} (2)"
    assert cells[7] == f"{(1.645 * sd / 0.01) ** 2:,.0f} / {(1.645 * sd / 0.05) ** 2:,.0f}"


def test_sub_windows_spread_each_pass_around_its_own_ratio() -> None:
    stats = _load("twin_stats")
    a = [100, 100, 100, 100]
    b = [110, 90, 100, 100]  # b ÷ a: 1.1, 0.9, 1, 1 by the second; 1.0, 1.0 by two; 1.0 whole
    aa = {"conc": 256, "kind": "aa", "sides": {"direct:a": {"tokens_each_second": a},
                                                "direct:b": {"tokens_each_second": b}}}
    # a gateway pass twice as fast over the same seconds' noise: its level drops out, not its spread
    gb = {"conc": 256, "kind": "gb", "sides": {"direct:a": {"tokens_each_second": a},
                                                "gateway:b": {"tokens_each_second": [2 * x for x in b]}}}
    assert stats.piece_ratios(gb, 1, "tokens/s") == pytest.approx([2.2, 1.8, 2.0, 2.0])
    assert stats.piece_ratios(gb, 3, "tokens/s") == []  # 3 s does not divide the window
    logs = [math.log(x) for x in (1.1, 0.9, 1.0, 1.0)]
    mean = statistics.fmean(logs)
    pooled = math.sqrt(2 * sum((x - mean) ** 2 for x in logs) / (8 - 2))  # 8 pieces, 2 passes' means
    got = stats.sub_windows([aa, gb], "tokens/s")
    assert got[1] == pytest.approx((pooled, 8))
    assert got[2] == pytest.approx((0.0, 4))
    assert 4 not in got  # one piece a pass: no spread within it
    table = stats._sub_table([aa, gb])
    assert table[1] == "| T, s | 1 | 2 |"
    assert table[3] == f"| sd of log ratio (pieces) | {pooled:.3f} (8) | 0.000 (4) |"


def test_sub_windows_take_ttft_p50_over_the_requests_of_each_piece() -> None:
    stats = _load("twin_stats")
    direct = [[100, 300], [200], [100], [100]]  # ms, by the second each request was sent in
    gateway = [[110], [330, 330], [100], [100]]
    row = {"kind": "ga", "sides": {"gateway:a": {"ttft_ms_each_second": gateway},
                                   "direct:b": {"ttft_ms_each_second": direct}}}
    assert stats.piece_ratios(row, 1, "TTFT p50") == pytest.approx([110 / 200, 330 / 200, 1.0, 1.0])
    assert stats.piece_ratios(row, 2, "TTFT p50") == pytest.approx([330 / 200, 1.0])


def test_window_counts_only_its_own_seconds() -> None:
    side = _load("window_client").Side(10.0, 20.0)
    assert side.overlap(5.0, 12.0) == 2.0
    assert side.overlap(12.0, 25.0) == 8.0
    assert side.overlap(21.0, 22.0) == 0.0
    side.tokens, side.busy, side.sent_in_window = 500, 40.0, 3
    assert side.per_second == [0] * 10
    side.ttfts = [0.1, 0.2]
    side.waiting = {7: 19.0}  # sent at 19 s, no first token by the end at 24 s: 5 s, the slowest
    f = side.figures(until=24.0)
    assert f["output_throughput"] == 50.0
    assert f["mean_in_flight"] == 4.0
    assert f["median_ttft_ms"] == 200.0
    assert f["p99_ttft_ms"] == pytest.approx(1000 * (0.2 + 0.98 * 4.8), abs=0.1)
    assert f["no_first_token"] == 1
    assert f["ttft_ms_each_second"][9] == [5000]  # the late one, by the second it was sent in
    side.first_token(sent=10.5, now=10.75)
    assert side.ttft_ms_each_second[0] == [250] and side.ttfts[-1] == 0.25


def test_a_ramp_starts_the_streams_evenly_over_it() -> None:
    delay = _load("window_client").start_delay
    assert [delay(i, 4, 8.0) for i in range(4)] == [0.0, 2.0, 4.0, 6.0]
    assert delay(3, 4, 0.0) == 0.0  # no ramp: all at t0, as vllm bench serve starts them


def test_waves_find_a_load_that_repeats_every_request_life() -> None:
    waves = _load("twin_stats").waves
    wavy = [900 if i % 7 == 0 else 100 for i in range(120)]  # a burst every 7 s
    _, top, lag, auto = waves(wavy)
    assert lag == 7 and auto > 0.9 and top == pytest.approx(900 / statistics.fmean(wavy))
    steady = [300 + (37 * i) % 11 for i in range(120)]  # no period between 2 and 15 s to speak of
    assert waves(steady)[0] < 0.02
    assert waves([5] * 10) is None  # too short to tell


def test_engine_samples_average_over_the_window_only() -> None:
    means = _load("in_pass").means
    rows = [[5.0, 500, 9, 1024, 0], [6.0, 100, 0, 1024, 512], [7.5, 300, 2, 1024, 514], [9.0, 1, 0, 1024, 1024]]
    assert means(rows, 6.0, 9.0) == {"running": 200.0, "waiting": 1.0, "conns_open": 1024.0, "conns_idle": 513.0}
    assert means(rows, 10.0, 20.0) is None


def test_jitter_passes_pair_among_themselves_under_their_own_heading() -> None:
    stats = _load("twin_stats")

    def jitter(kind: str, ratio: float) -> dict[str, Any]:
        row = _pass("gb" if kind == "jb" else "ga", 100, 100, ratio)
        row["sides"] = {p.replace("gateway", "jitter"): v for p, v in row["sides"].items()}
        return {**row, "kind": kind, "jitter_ms": 50.0}

    rows = [_pass("gb", 100, 100, 0.9), jitter("jb", 1.2), jitter("ja", 1.2), _pass("ga", 100, 100, 0.9)]
    out = stats.report(rows)
    gateway, jittered = out.split("direct both, one pausing 0–50.0 ms before each request (1 jb, 1 ja passes)")
    # the gb and the ga pair across the jitter passes, which pair with each other
    assert "| tokens/s | 0.900 (0.900–0.900), 0 of 1 | 0.900 / 0.900 |" in gateway
    assert "| tokens/s | 1.200 (1.200–1.200), 1 of 1 | 1.200 / 1.200 |" in jittered
    assert "jittered ÷ direct" in jittered and "gateway ÷ direct" not in jittered


def test_vllm_clocks_give_the_window_means_of_its_histograms() -> None:
    in_pass = _load("in_pass")
    text = "\n".join([  # as vLLM's /metrics writes them (one engine, one model)
        'vllm:num_requests_running{engine="0",model_name="tiny"} 7.0',
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 12.5',
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 50.0',
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny"} 0.0',
        'vllm:request_queue_time_seconds_sum{engine="0",model_name="tiny"} 0.5',
        'vllm:request_queue_time_seconds_count{engine="0",model_name="tiny"} 50.0',
        'vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny"} 100.0',
        'vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny"} 40.0',
        'vllm:inter_token_latency_seconds_sum{engine="0",model_name="tiny"} 3.0',
        'vllm:inter_token_latency_seconds_count{engine="0",model_name="tiny"} 300.0',
        'vllm:iteration_tokens_total_sum{engine="0",model_name="tiny"} 9000.0',
        'vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 60.0'])
    assert in_pass.clocks(text) == [12.5, 50.0, 0.5, 50.0, 100.0, 40.0, 3.0, 300.0, 9000.0, 60.0]
    rows = [[5.0, 1, 0, 0, 0, 1.0, 10, 0.0, 10, 5.0, 5],  # before the window
            [6.0, 1, 0, 0, 0, 2.0, 20, 0.1, 20, 10.0, 10], [7.0, 1, 0, 0, 0, 5.0, 30, 0.1, 30, 10.0, 10],
            [8.0, 1, 0, 0, 0, 8.0, 40, 0.3, 40, 40.0, 20], [9.0, 1, 0, 0, 0, 99.0, 99, 9.9, 99, 99.0, 99]]
    # 6 s to 8 s: 20 first tokens in 6 s of vLLM's TTFT, 0.2 s of queue, 10 requests ended in 30 s
    assert in_pass.vllm_means(rows, 6.0, 9.0) == {"vllm_ttft_ms": 300.0, "vllm_queue_ms": 10.0,
                                                 "vllm_e2e_ms": 3000.0, "first_tokens": 20}
    assert in_pass.vllm_means([r[:5] for r in rows], 6.0, 9.0) is None  # samples from before the clocks
    assert in_pass.means(rows, 6.0, 9.0)["running"] == 1  # the gauges' means ignore the sums after them


@pytest.mark.parametrize("entry", ["gb", "jb", "gbi", "gbh"])
def test_one_twin_pass_through_real_sockets(entry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``gb`` pass as twin_pairs.py runs it on the GPU machine, shrunk: two fake vLLMs stand in
    for instances a and b, a real gateway routes ``tiny-b`` to b, and two window_client.py
    processes measure the same seconds. A ``jb`` pass reaches b direct, pausing before each
    request; in a ``gbi`` pass the direct side also holds idle connections to a, in a ``gbh`` pass a
    process of their own holds them."""
    from tests.support.procs import FakeVllm, Gateway, instances
    from tests.support.real_vllm import TINY_MODEL_DIR
    from vllm_fleet.tinymodel import make_tiny_model

    twin = _load("twin_pairs")
    kind, _, idle_by = twin.split_kind(entry)
    procs: list[Any] = []
    try:
        a = FakeVllm(tmp_path, ["tiny-a"], "--fake-token-delay", "0.002", "--fake-tokens", "32")
        procs.append(a)
        b = FakeVllm(tmp_path, ["tiny-b"], "--fake-token-delay", "0.002", "--fake-tokens", "32")
        procs.append(b)
        config = instances(a, b)
        for inst, name in zip(config["vllm_instances"], "ab", strict=True):
            inst["name"] = name  # as `up` names them: the sampler finds their connections by name
        gw = Gateway(tmp_path, config)
        procs.append(gw)
        monkeypatch.setattr(twin, "PORTS", {"a": a.port, "b": b.port})
        monkeypatch.setattr(twin, "GW", gw.url)
        # no supervisor here: the fakes' PIDs as its /instances gives them, and no gateway PID
        monkeypatch.setattr(twin, "instances", lambda: {"a": {"pid": a.pid}, "b": {"pid": b.pid}})
        cpu = sorted(os.sched_getaffinity(0))[0]
        row = twin.one(make_tiny_model(str(TINY_MODEL_DIR)), tmp_path, kind, 4, 0, [cpu, cpu],
                       {"warmup": 0.5, "window": 2.5, "tail": 0.5, "ramp": 0.2}, jitter_ms=60.0,
                       prof=entry == "gb", direct_idle=3 if idle_by else 0, idle_by=idle_by or "client")
        # each side reached its own fake: b's requests came through the gateway, a's straight
        served = (a.stats()["completed"], b.stats()["completed"])
    finally:
        for p in reversed(procs):
            p.stop()
    other = "gateway:b" if kind == "gb" else "jitter:b"
    assert set(row["sides"]) == {"direct:a", other}
    if idle_by:  # each of the 3 answered GET /health and was still open when the pass ended
        assert row["direct_idle"] == 3 and row["sides"]["direct:a"]["idle_held"] == 3, row
        assert row.get("idle_by", "client") == idle_by
        # a holder wrote its own file; the client held none of them
        assert (tmp_path / "sides" / "c4-p0-0.held.json").exists() == (idle_by == "holder")
    else:
        assert "direct_idle" not in row and "idle_held" not in row["sides"]["direct:a"], row
    if entry == "gb":  # py-spy sampled each fake over the window; a fake has no engine core below it
        assert {name: set(procs) for name, procs in row["prof"].items()} == {"a": {"api"}, "b": {"api"}}, row["prof"]
        assert all(procs["api"]["samples"] > 0 for procs in row["prof"].values()), row["prof"]
    else:
        assert "prof" not in row
    for side in row["sides"].values():
        assert side["errors"] == 0, row
        assert side["output_throughput"] > 0 and side["requests_in_window"] > 0, row
        assert 0 < side["median_head_ms"] <= side["median_ttft_ms"], row
        assert side["mean_ttft_ms"] < side["mean_life_ms"], row
    assert row["sides"]["direct:a"]["mean_in_flight"] == pytest.approx(4, abs=0.5), row
    if kind == "jb":  # each stream's cycle is a request's life and a pause of 30 ms on average
        life = row["sides"][other]["mean_life_ms"]
        assert row["sides"][other]["mean_in_flight"] == pytest.approx(4 * life / (life + 30), abs=0.15), row
        assert row["jitter_ms"] == 60.0
    else:
        assert row["sides"][other]["mean_in_flight"] == pytest.approx(4, abs=0.5), row
        # every request sent in the window has its TTFT under the second it was sent in
        assert sum(map(len, side["ttft_ms_each_second"])) == side["requests_in_window"], row
    assert row["queued"] == 0
    # sampled in the window: each fake runs the 4 streams of its side (it counts them as running)
    assert row["in_vllm"]["direct:a"]["running"] == pytest.approx(4, abs=1), row["in_vllm"]
    for path in ("direct:a", other):
        assert row["in_vllm"][path]["waiting"] == 0
    if kind == "gb":
        assert row["in_vllm"][other]["running"] == pytest.approx(4, abs=1), row["in_vllm"]
        assert row["in_vllm"][other]["conns_open"] >= 1, row["in_vllm"]
    assert served[0] > 0 and served[1] > 0
    # each side's fake used CPU over the window; a fake has no engine steps to count
    for path in ("direct:a", other):
        assert row["engine"][path]["api_cpu"] > 0 and row["engine"][path]["steps_per_s"] == 0, row["engine"]
        assert row["engine"][path]["api_wait"] >= 0, row["engine"]  # read from /proc, not unknown




def _report(capsys: pytest.CaptureFixture[str], *rows_files: str) -> str:
    """What ``twin_stats.py`` prints over committed rows files (paths under bench/gpu/results)."""
    return printed(capsys, "twin_stats", [str(RESULTS / f) for f in rows_files])


def test_the_long_run_write_up_matches_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """twin-long-h200x2's README quotes twin_stats.py over its gzipped rows: the figures must be those."""
    out = _report(capsys, "twin-long-h200x2/rows.json.gz")
    assert "| tokens/s | 1.007 (0.967–1.025), 3 of 4 |" in out
    assert "| TTFT p50 | 1.063 (0.994–1.130), 2 of 4 |" in out
    assert "would spread by 0.035 (from T = 60 s); swap pairs' sd × √2, one pass's share: 0.063 (4 pairs)" in out
    assert "would spread by 0.106 (from T = 60 s); swap pairs' sd × √2, one pass's share: 0.103 (4 pairs)" in out


def test_the_waves_write_up_matches_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """twin-waves-h200x2's README quotes twin_stats.py over its two runs' rows."""
    ramp = _report(capsys, "twin-waves-h200x2/rows-ramp.json.gz")
    assert "| TTFT p50 | 1.225 (1.218–1.231), 2 of 2 | 1.427 1.107 / 1.062 1.340 |" in ramp
    assert "| tokens/s | 0.966 (0.960–0.972), 0 of 2 | 0.976 0.920 / 0.944 1.027 |" in ramp
    assert "cv 0.38–0.76, busiest second 2.0–3.3× the mean, autocorrelation peaks at a lag of 5–11 s" in ramp
    engine = _report(capsys, "twin-waves-h200x2/rows-engine.json.gz")
    assert "| 0 | gb | gateway:b | 3314.6 | 12192.2 | 196 (135–308) | 0 | 511 |" in engine
    assert "| 2 | gb | direct:a | 2081.2 | 12532.4 | 324 (5–512) | 0 | 0 |" in engine


def test_swap_pairs_never_join_two_runs() -> None:
    stats = _load("twin_stats")
    rows = [{**_pass("gb", 100, 100, 0.9), "_file": 0}, {**_pass("ga", 100, 100, 1.1), "_file": 1},
            {**_pass("gb", 100, 100, 0.8), "_file": 1}]
    # the first run's gb has no ga of its own; the second run's ga pairs with its own gb
    assert stats.swap_pairs(rows, "output_throughput") == [pytest.approx(math.sqrt(1.1 * 0.8))]


def test_the_clocks_write_up_matches_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """twin-clocks-h200x2's README quotes twin_stats.py over its rows, and over every twin run's."""
    out = _report(capsys, "twin-clocks-h200x2/rows.json.gz")
    assert "| TTFT p50 | 1.053 (0.962–1.110), 2 of 3 | 1.097 0.871 1.000 / 1.011 1.062 1.231 |" in out
    assert "| tokens/s | 0.989 (0.971–1.007), 1 of 2 | 0.956 0.972 / 0.986 1.043 |" in out
    assert "| TTFT p50 | 0.759 (0.724–0.793), 0 of 2 | 0.718 0.765 / 0.730 0.823 |" in out
    assert "| 1 | ga | gateway:a | 1955 | 699 | 1633 | 0 | 322 | 3841 | 3546 | 295 |" in out
    assert "| 1 | ga | direct:b | 1886 | 634 | 1625 | 0 | 260 | 3698 | 3393 | 304 |" in out
    assert "| TTFT p50 | 0.930 (0.930–0.930), 0 of 1 | 0.996 / 0.868 |" in out  # the jitter pair
    for line in ("each pass: +1, +17, +19, -14 ms (median +9)",
                 "each pass: -12, +61, +21, +67, +1, +27 ms (median +24)",
                 "each pass: +65, -24, -152, +99 ms (median +21)",
                 "the jitter side's − the direct side's, each pass: -96, +39",
                 "1.125 / 1.103, 1.005 / 1.037, 0.940 / 0.957, 1.040 / 1.069, 1.003 / 1.003, 1.154 / 1.150"):
        assert line in out
    pooled = _report(capsys, "twin-h200x2/rows.json", "twin-long-h200x2/rows.json.gz",
                     "twin-waves-h200x2/rows-ramp.json.gz", "twin-waves-h200x2/rows-engine.json.gz",
                     "twin-clocks-h200x2/rows.json.gz")
    for line in ("| tokens/s | 0.960 (0.923–0.972), 1 of 7 |", "| TTFT p50 | 1.047 (0.998–1.088), 5 of 7 |",
                 "| tokens/s | 1.002 (0.928–1.008), 7 of 13 |", "| TTFT p50 | 1.053 (0.994–1.133), 8 of 13 |",
                 "| tokens/s | 1.013 (0.992–1.031), 6 of 9 |", "| TTFT p50 | 1.040 (0.898–1.065), 5 of 9 |"):
        assert line in pooled


def test_tokens_per_running_request_compare_the_two_engines_pass_by_pass() -> None:
    """tokens/s ÷ the mean running in each side's engine over the window, gateway ÷ direct."""
    stats = _load("twin_stats")
    timing = {"warmup": 1.0, "window": 2.0, "tail": 1.0}

    def samples(running: int) -> list[list[float]]:  # before, inside (two), after the window
        return [[t, running if 1.0 <= t < 3.0 else 999, 0, 1024, 1024] for t in (0.0, 1.0, 2.0, 3.0)]

    gb = {**_pass("gb", 100, 100, 0.9), "pass": 0, "timing": timing, "samples": {"a": samples(100), "b": samples(100)}}
    ga = {**_pass("ga", 100, 100, 1.0), "pass": 1, "timing": timing, "samples": {"a": samples(50), "b": samples(100)}}
    out = stats.report([gb, ga])
    # gb: 90 ÷ 100 against 100 ÷ 100; ga: the gateway side's 100 tokens/s over 50 running, direct's over 100
    assert ("Tokens/s per request running in the engine, gateway ÷ direct, each pass: 0.900, 2.000 "
            "(median 1.450).") in out


def test_the_2b8_write_up_matches_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """twin-2b8-h200x2's README quotes twin_stats.py over its rows."""
    out = _report(capsys, "twin-2b8-h200x2/rows.json.gz")
    for line in ("| tokens/s | 0.958 (0.949–0.966), 0 of 2 | 0.943 1.005 / 0.956 0.928 |",
                 "| TTFT p50 | 1.199 (0.971–1.427), 1 of 2 | 0.713 1.756 / 1.322 1.160 |",
                 "| TTFT p50 | 0.996 (0.987–1.006), 1 of 2 | 0.910 0.999 / 1.070 1.013 |",
                 "| tokens/s | 1.012 (0.974–1.050), 1 of 2 | 1.074 0.984 / 1.026 0.963 |",
                 "| tokens/s | 1.000 (0.979–1.021), 1 of 2 | 1.059 0.995 / 0.985 0.963 |",
                 "each pass: -18, +24, +0, +14 ms (median +7)", "each pass: -82, +2, +54, +17 ms (median +9)",
                 "0.674 / 0.660, 1.384 / 1.348, 1.635 / 1.637, 1.028 / 1.035",
                 "gateway ÷ direct, each pass: 0.897, 0.941, 0.995, 0.956 (median 0.948).",
                 "| 0 | gb | gateway:b | 342 | 220 | 280 | 0 | 62 | 4029 | 3893 | 137 |"):
        assert line in out
    engine = _report(capsys, "twin-2b8-h200x2/rows-engine.json.gz")
    for line in ("| 1 | ga | gateway:a | 33.8 | 473.3 | 29.6 | 0.763 | 1.022 |",
                 "| 1 | ga | direct:b | 40.7 | 451.7 | 24.9 | 0.894 | 1.031 |",
                 "Engine steps a second, gateway ÷ direct, each pass: 0.955, 0.830 (median 0.893).",
                 "| tokens/s | 0.925 (0.925–0.925), 0 of 1 | 0.978 / 0.876 |"):
        assert line in engine
    tiny = _report(capsys, "twin-clocks-h200x2/rows.json.gz")
    assert "gateway ÷ direct, each pass: 0.951, 1.021, 1.041, 0.975 (median 0.998)." in tiny


def test_engine_gives_steps_tokens_a_step_and_each_process_group_s_cpu() -> None:
    in_pass = _load("in_pass")
    # [t, 4 gauges, 4 clocks' sums and counts, the steps' sum and count, API server CPU s, below it]
    clock = [0.0] * 8

    def row(t: float, tokens: float, steps: float, api: float, below: float) -> list[float]:
        return [t, 1, 0, 0, 0, *clock, tokens, steps, api, below]

    rows = [row(5.0, 0, 0, 0, 0), row(6.0, 1000, 10, 1.0, 2.0), row(8.0, 5000, 50, 1.5, 3.8),
            row(9.0, 99999, 999, 99, 99)]
    # samples from before the run delay and the GPU were kept: those are unknown
    assert in_pass.engine(rows, 6.0, 9.0) == {"steps_per_s": 20.0, "tokens_per_step": 100.0,
                                              "api_cpu": 0.25, "engine_cpu": 0.9, "api_wait": None,
                                              "engine_wait": None}
    no_pids = [[*r[:-2], -1.0, -1.0] for r in rows]
    assert in_pass.engine(no_pids, 6.0, 9.0)["api_cpu"] is None
    assert in_pass.engine([r[:11] for r in rows], 6.0, 9.0) is None  # samples from before these columns


def test_the_steps_table_sets_each_side_s_engine_beside_the_other() -> None:
    stats = _load("twin_stats")

    def eng(steps: float, api: float) -> dict[str, Any]:
        return {"steps_per_s": steps, "tokens_per_step": 200.0, "api_cpu": api, "engine_cpu": 0.95}

    gb = {**_pass("gb", 100, 100), "pass": 0, "engine": {"direct:a": eng(40.0, 0.9), "gateway:b": eng(36.0, 1.0)},
          "vllm_clock": {"direct:a": {"vllm_itl_ms": 25.0}, "gateway:b": {"vllm_itl_ms": 27.5}}}
    out = stats.report([gb])
    assert "| 0 | gb | gateway:b | 36.0 | 200.0 | 27.5 | 1.0 | 0.95 |" in out
    assert "Engine steps a second, gateway ÷ direct, each pass: 0.900 (median 0.900)." in out


def test_kinds_take_p_and_i_or_h_in_either_order_and_nothing_else() -> None:
    twin = _load("twin_pairs")
    assert twin.split_kind("gb") == ("gb", False, "")
    assert twin.split_kind("gap") == ("ga", True, "")
    assert twin.split_kind("gbi") == ("gb", False, "client")
    assert twin.split_kind("gaip") == twin.split_kind("gapi") == ("ga", True, "client")
    assert twin.split_kind("gbh") == ("gb", False, "holder")
    assert twin.split_kind("gahp") == ("ga", True, "holder")
    for bad in ("gbx", "gbii", "g", "gbih"):  # the idle ones held by the client or by a holder, not both
        assert twin.split_kind(bad)[0] == bad  # not a kind: run() names it


def test_idle_passes_pair_among_themselves_under_their_own_heading() -> None:
    stats = _load("twin_stats")
    plain = [_pass("gb", 100, 100, 0.9), _pass("ga", 100, 100, 0.9)]
    idle = [{**r, "direct_idle": 512} for r in (_pass("gb", 100, 100, 1.1), _pass("ga", 100, 100, 1.1))]
    held = [{**r, "direct_idle": 512, "idle_by": "holder"}
            for r in (_pass("gb", 100, 100, 1.3), _pass("ga", 100, 100, 1.3))]
    out = stats.report([plain[0], idle[0], held[0], plain[1], idle[1], held[1]])
    heads = [line for line in out.splitlines() if line.startswith("### ")]
    assert heads == ["### 512 streams per side (1 gb, 1 ga, 0 aa passes; 0 requests queued in the gateway)",
                     "### 512 streams per side (1 gb, 1 ga, 0 aa passes; 0 requests queued in the gateway, "
                     "each direct side holding 512 idle connections)",
                     "### 512 streams per side (1 gb, 1 ga, 0 aa passes; 0 requests queued in the gateway, "
                     "each direct side holding 512 idle connections by a process of their own)"], out
    for ratio, above in (("0.900", 0), ("1.100", 1), ("1.300", 1)):  # each family paired within itself
        assert f"| tokens/s | {ratio} ({ratio}–{ratio}), {above} of 1 |" in out, out


def test_modes_sort_passes_by_which_side_was_slow_and_test_the_lean() -> None:
    modes = _load("twin_modes")

    def ttft_pass(kind: str, gateway_ms: float, direct_ms: float) -> dict[str, Any]:
        path = {"gb": ("gateway:b", "direct:a"), "ga": ("gateway:a", "direct:b")}[kind]
        return {"conc": 512, "kind": kind, "queued": 0,
                "sides": {path[0]: _side(1000, gateway_ms), path[1]: _side(1000, direct_ms)}}

    rows = [ttft_pass("gb", 1000, 1000), ttft_pass("ga", 3000, 1000), ttft_pass("gb", 3300, 1100),
            ttft_pass("ga", 900, 2700), ttft_pass("gb", 3000, 3000),
            {"conc": 512, "kind": "aa", "queued": 0, "sides": {"direct:a": _side(1, 9000), "direct:b": _side(1, 100)}}]
    table = "\n".join(modes.modes_table(rows, 2400))
    assert "| neither | 1 | 1.000 (1.000–1.000) |" in table
    assert "| both | 1 | 1.000 (1.000–1.000) |" in table
    assert "| the gateway's only | 2 | 3.000 (3.000–3.000) |" in table
    assert "| the direct side's only | 1 | 0.333 (0.333–0.333) |" in table  # the aa pass is no gateway pass
    assert "Sign test on the 3 passes with one side slow: p = 1.00." in table
    # exact two-sided binomial: 5 of 6 one way is 2 × 7/64; none of 10 is 2/1024
    assert modes.sign_test(5, 6) == pytest.approx(14 / 64)
    assert modes.sign_test(1, 6) == pytest.approx(14 / 64)
    assert modes.sign_test(0, 10) == pytest.approx(2 / 1024)
    assert modes.sign_test(3, 6) == 1.0


def test_the_defaults_write_up_matches_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """twin-defaults-h200x2's README quotes twin_stats.py over its first run and over all three."""
    first = _report(capsys, "twin-defaults-h200x2/rows.json.gz")
    assert "| tokens/s | 0.967 (0.929–1.040), 2 of 5 |" in first
    assert "| tokens/s | 1.032 (0.976–1.110), 2 of 4 |" in first
    every = printed(capsys, "twin_stats", ["--slow-ttft-ms", "2400", *DEFAULTS_512])
    assert "| tokens/s | 1.002 (0.942–1.019), 6 of 12 |" in every
    assert "| TTFT p50 | 1.200 (0.969–1.589), 8 of 12 |" in every
    assert "| neither | 16 | 1.022 (0.788–1.409) |" in every
    assert "| the gateway's only | 5 | 2.935 (2.326–3.673) |" in every
    assert "| the direct side's only | 1 | 0.446 (0.446–0.446) |" in every
    assert "Sign test on the 6 passes with one side slow: p = 0.22." in every


def test_rank_sum_p_is_the_exact_two_sided_mann_whitney() -> None:
    versus = _load("twin_versus")
    # 3 against 3 wholly apart: 1 ordering in C(6, 3) = 20 each way
    assert versus.rank_sum_p([4.0, 5.0, 6.0], [1.0, 2.0, 3.0]) == pytest.approx(2 / 20)
    assert versus.rank_sum_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(2 / 20)
    # 2 against 2, one swap from apart (U = 3 of 4): P(U >= 3) = 2 of C(4, 2) = 6
    assert versus.rank_sum_p([2.0, 4.0], [1.0, 3.0]) == pytest.approx(2 * 2 / 6)
    assert versus.rank_sum_p([1.0, 2.0], [1.0, 2.0]) == 1.0  # U in the middle, ties half
    assert sum(versus._ways(5, 4, u) for u in range(21)) == math.comb(9, 4)


def test_rank_sum_p_normal_follows_the_exact_p_and_handles_ties() -> None:
    versus = _load("twin_versus")
    rng = random.Random(5)
    for m, n in ((10, 10), (12, 30), (20, 20)):
        for shift in (0, 40, 90):
            xs = [float(rng.randint(0, 300)) for _ in range(m)]
            ys = [float(rng.randint(shift, 300 + shift)) for _ in range(n)]
            assert versus.rank_sum_p_normal(xs, ys) == pytest.approx(versus.rank_sum_p(xs, ys), abs=0.03)
    assert versus.rank_sum_p_normal([1.0] * 5, [1.0] * 7) == 1.0  # all tied: no evidence either way
    # wholly apart, 30 against 30: far below any exact p worth summing
    assert versus.rank_sum_p_normal([float(i) for i in range(30)], [float(i) for i in range(30, 60)]) < 1e-9


def test_the_pool512_write_up_matches_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """twin-pool512-h200x2's README quotes twin_stats.py over its rows and twin_versus.py against
    twin-defaults-h200x2's 512 passes."""
    out = printed(capsys, "twin_stats", ["--slow-ttft-ms", "2400", POOL512])
    assert "| tokens/s | 0.987 (0.952–1.023), 3 of 11 |" in out
    assert "| TTFT p50 | 0.923 (0.712–1.013), 4 of 11 |" in out
    assert "| neither | 18 | 0.932 (0.377–1.663) |" in out
    assert "| the gateway's only | 2 | 2.500 (2.262–2.737) |" in out
    assert "| the direct side's only | 0 | — |" in out
    assert "(median -5)" in out
    out = printed(capsys, "twin_versus", ["--conc", "512", "--a", *DEFAULTS_512, "--b", POOL512])
    assert "| tokens/s | 1.002 (0.864–1.042), 6 of 12 | 0.987 (0.840–1.065), 3 of 11 | 0.93 |" in out
    assert "| TTFT p50 | 1.200 (0.723–1.867), 8 of 12 | 0.923 (0.379–1.669), 4 of 11 | 0.07 |" in out
    assert "| TTFT mean | 1.193 (0.698–1.705), 9 of 12 | 0.993 (0.423–1.610), 5 of 11 | 0.10 |" in out
