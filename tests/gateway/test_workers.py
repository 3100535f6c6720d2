"""Several gateway workers (``--workers N``): real processes, the fake vLLM, metrics across workers."""

from __future__ import annotations

import glob
import itertools
import json
import os
import signal
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from tests.support.procs import FakeVllm, Gateway, group_members, instances, pid_alive, stat_fields, wait_until
from vllm_fleet.cli import main as cli

BODY = b'{"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
HEADERS = {"content-type": "application/json", "connection": "close"}  # a new connection each time


@pytest.fixture(scope="module")
def fake(tmp_mod: Path) -> Iterator[FakeVllm]:
    f = FakeVllm(tmp_mod, ["m1"])
    try:
        yield f
    finally:
        f.stop()


def workers_of(parent: int) -> list[int]:
    """uvicorn's spawned workers: the parent's children running multiprocessing's spawn_main."""
    found = []
    for entry in os.listdir("/proc"):
        fields = stat_fields(entry) if entry.isdigit() else None
        if fields is None or int(fields[1]) != parent or fields[0] == b"Z":
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            found.append(int(entry))
    return sorted(found)


def metrics_dir_of(pid: int) -> str:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"PROMETHEUS_MULTIPROC_DIR="))


def requests_by_pid(directory: str) -> dict[int, float]:
    """fleet_requests_total per worker, straight from each worker's own file."""
    out: dict[int, float] = {}
    for f in glob.glob(os.path.join(directory, "counter_*.db")):
        pid = int(f.rsplit("_", 1)[1].removesuffix(".db"))
        values = MmapedDict.read_all_values_from_file(f)
        out[pid] = sum(v[1] for v in values if '"fleet_requests_total"' in v[0])
    return out


def healthy_in(directory: str, pid: int) -> bool:
    """Whether worker ``pid`` has its backend in rotation (its own health gauge file)."""
    try:
        values = MmapedDict.read_all_values_from_file(os.path.join(directory, f"gauge_livemax_{pid}.db"))
    except OSError:
        return False
    return any('"fleet_backend_healthy"' in v[0] and v[1] == 1 for v in values)


def scrape(gw: Gateway) -> dict[str, float]:
    """Samples of one /metrics scrape, keyed 'name{label=value,...}'."""
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"] = s.value
    return out


def total_requests(gw: Gateway) -> float:
    return sum(v for k, v in scrape(gw).items() if k.startswith("fleet_requests_total{") and "model=m1" in k)


def send(gw: Gateway, n: int) -> None:
    def one(_: int) -> int:
        return httpx.post(gw.url + "/v1/chat/completions", content=BODY, headers=HEADERS, timeout=10).status_code

    with ThreadPoolExecutor(8) as ex:
        assert set(ex.map(one, range(n))) == {200}


def test_two_workers_serve_and_count_together(tmp_mod: Path, fake: FakeVllm) -> None:
    gw = Gateway(tmp_mod, instances(fake), args=["--workers", "2"])
    try:
        pids = workers_of(gw.pid)
        assert len(pids) == 2 and all(pid_alive(p) for p in pids), pids
        directory = metrics_dir_of(pids[0])  # a worker's: the parent set it after its own start
        assert os.path.isdir(directory)
        # Each worker probes on its own: the fixture saw one of them ready, wait for every one.
        assert wait_until(lambda: all(healthy_in(directory, p) for p in pids), 15)

        # Connections are spread by the kernel; keep sending until both workers have answered.
        sent = 0
        while sent < 2000:
            send(gw, 100)
            sent += 100
            by_pid = requests_by_pid(directory)
            if all(by_pid.get(p, 0) > 0 for p in pids):
                break
        assert all(by_pid.get(p, 0) > 0 for p in pids), by_pid
        # A scrape of whichever worker answers shows the whole gateway. A worker hands its counts to
        # the shared files at the end of the loop turn that wrote the answer (tally.py), so a client
        # can scrape another worker first (seen once, on a loaded 2-core machine): wait for the
        # count, then every scrape must agree.
        assert wait_until(lambda: total_requests(gw) == sent, 10), total_requests(gw)
        for _ in range(4):
            assert total_requests(gw) == sent
        m = scrape(gw)
        assert m["fleet_gateway_workers{}"] == 2
        assert m[f"fleet_backend_healthy{{backend=fake-{fake.port}}}"] == 1
        assert m[f"fleet_backend_in_flight{{backend=fake-{fake.port}}}"] == 0

        # A streamed answer goes through a worker chunk by chunk as with one process.
        with httpx.stream("POST", gw.url + "/v1/chat/completions", timeout=10, headers=HEADERS,
                          content=BODY.replace(b'"max_tokens": 4', b'"stream": true')) as r:
            assert r.status_code == 200 and b"data: [DONE]" in r.read()
        sent += 1

        # A worker that dies is replaced; its counts stay, its live gauges go.
        os.kill(pids[0], signal.SIGKILL)
        assert wait_until(lambda: len(workers_of(gw.pid)) == 2 and pids[0] not in workers_of(gw.pid), 20)
        assert wait_until(lambda: scrape(gw)["fleet_gateway_workers{}"] == 2, 20)
        new = [p for p in workers_of(gw.pid) if p not in pids]
        assert wait_until(lambda: all(healthy_in(directory, p) for p in new), 15)
        assert wait_until(lambda: total_requests(gw) == sent, 10), total_requests(gw)

        # SIGTERM to the gateway alone (not its group) stops every worker and removes the directory.
        os.kill(gw.pid, signal.SIGTERM)
        assert gw.popen.wait(20) == 0
        assert wait_until(lambda: not group_members(gw.pid), 10), group_members(gw.pid)
        assert not os.path.exists(directory)
    finally:
        gw.stop()


def test_one_worker_writes_no_metric_files(tmp_mod: Path, fake: FakeVllm) -> None:
    gw = Gateway(tmp_mod, instances(fake))
    try:
        assert workers_of(gw.pid) == []
        send(gw, 3)
        assert b"fleet-gateway-metrics" not in Path(f"/proc/{gw.pid}/maps").read_bytes()  # no mmapped files
        assert total_requests(gw) == 3 and scrape(gw)["fleet_gateway_workers{}"] == 1
    finally:
        gw.stop()


@pytest.mark.parametrize(("args", "env", "fleet", "key"), [
    (["--workers", "0"], {}, "", "--workers"),
    ([], {"FLEET_WORKERS": "many"}, "", "workers"),
    ([], {"FLEET_WORKERS": "0"}, "", "workers"),
    ([], {}, "gateway: {workers: 0}\n", "gateway.workers"),
])
def test_bad_workers_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch, args: list[str],
                                            env: dict[str, str], fleet: str, key: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet + "instances: [{name: a, model: m, device: cpu}]\n")
    assert cli(["gateway", "-c", str(path), *args]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err, err


def four_workers_up(gw: Gateway) -> None:
    """Wait (20 s at most) for 4 live workers, each with its backend in rotation."""
    directory = metrics_dir_of(workers_of(gw.pid)[0])
    assert wait_until(lambda: len(workers_of(gw.pid)) == 4
                      and all(healthy_in(directory, p) for p in workers_of(gw.pid)), 20)


def queue_waits(gw: Gateway) -> float:
    return sum(v for k, v in scrape(gw).items() if k.startswith("fleet_queue_wait_seconds_count{"))


def test_four_workers_hold_one_limit_and_one_queue_together(tmp_path: Path) -> None:
    """A backend limit of 8 and a queue of 8 with 4 workers: 8 requests at once all reach the
    backend without queueing, however the kernel spreads the connections (with 1/4 of the limit per
    worker, a worker handed 3 of them queued one); 16 at once never put more than 8 + 3 on it (two
    workers may take the last slot at the same moment) and all are served: the 5 to 8 that wait
    fit in the gateway's 8 places whichever workers hold them (with 2 places per worker, as when
    the queue was divided, a worker handed a third waiter answered 429)."""
    fake = FakeVllm(tmp_path, ["m1"], "--fake-latency", "1.0")
    gw = Gateway(tmp_path, instances(fake), args=["--workers", "4"],
                 env={"FLEET_BACKEND_MAX_CONCURRENCY": "8", "FLEET_BACKEND_QUEUE": "8"})
    try:
        four_workers_up(gw)

        def one(_: int) -> int:
            return httpx.post(gw.url + "/v1/chat/completions", content=BODY, headers=HEADERS, timeout=30).status_code

        with ThreadPoolExecutor(16) as ex:
            assert list(ex.map(one, range(8))) == [200] * 8
            assert fake.stats()["peak_in_flight"] == 8
            assert queue_waits(gw) == 0
            # While 8 are open (for 10 s each), /fleet says 8 whichever worker answers.
            slow = BODY.replace(b'"max_tokens": 4', b'"max_tokens": 4, "fake_latency": 10')
            running = [ex.submit(lambda: httpx.post(gw.url + "/v1/chat/completions", content=slow, headers=HEADERS,
                                                    timeout=30).status_code) for _ in range(8)]
            assert wait_until(lambda: fake.stats()["in_flight"] == 8, 5)
            seen = {httpx.get(gw.url + "/fleet", timeout=5).json()["backends"][0]["in_flight"] for _ in range(8)}
            assert seen == {8}, seen
            assert [f.result() for f in running] == [200] * 8
            assert list(ex.map(one, range(16))) == [200] * 16
        assert 8 <= fake.stats()["peak_in_flight"] <= 8 + 3
        assert queue_waits(gw) >= 16 - (8 + 3)
    finally:
        gw.stop()
        fake.stop()



def test_four_workers_serve_their_queue_first_come_first_served(tmp_path: Path) -> None:
    """A limit of 1 and 10 requests 100 ms apart, each on a new connection: whichever workers
    hold them, they are served in the order they came. When each worker handed a freed slot to its
    own oldest waiter, a later request in the worker that finished overtook older ones elsewhere."""
    fake = FakeVllm(tmp_path, ["m1"], "--fake-latency", "0.2")
    gw = Gateway(tmp_path, instances(fake), args=["--workers", "4"],
                 env={"FLEET_BACKEND_MAX_CONCURRENCY": "1", "FLEET_BACKEND_QUEUE": "16"})
    # Each request's client is built before the clock starts: building one (its TLS context) can
    # take longer than a 50 ms gap on a loaded CI host, and then request 2 reaches the gateway
    # before request 1, an order the gateway never saw: the likely cause of CI's one failure with
    # clients built in the threads (2 served right after 0, 1 after 2).
    clients = [httpx.Client(timeout=30) for _ in range(10)]
    try:
        four_workers_up(gw)
        done: dict[int, float] = {}
        start = time.monotonic() + 0.1

        def one(i: int) -> int:
            time.sleep(max(0.0, start + 0.1 * i - time.monotonic()))
            r = clients[i].post(gw.url + "/v1/chat/completions", content=BODY, headers=HEADERS)
            done[i] = time.monotonic()
            return r.status_code

        with ThreadPoolExecutor(10) as ex:
            assert list(ex.map(one, range(10))) == [200] * 10
        # No request finished more than 0.05 s before one that came earlier (a slot takes 0.2 s, so
        # one served a slot ahead of an older request finishes 0.2 s before it). Two finishing
        # together are allowed: on a stalled host a worker takes a slot it left to an older waiter
        # after FIFO_GRACE_NS, and the workers' counts are not atomic, so the older one may run
        # beside it (CI once: 3 done 0.3 ms before 2, both started as 1 ended).
        overtaken = [(i, j) for i in range(10) for j in range(i + 1, 10) if done[j] < done[i] - 0.05]
        assert not overtaken, (overtaken, done)
        assert queue_waits(gw) >= 9
    finally:
        for c in clients:
            c.close()
        gw.stop()
        fake.stop()


def rotation_by_pid(directory: str, backend: str) -> dict[int, float]:
    """fleet_backend_healthy of ``backend`` in each live worker, from each worker's own gauge file."""
    out: dict[int, float] = {}
    for f in glob.glob(os.path.join(directory, "gauge_livemax_*.db")):
        pid = int(f.rsplit("_", 1)[1].removesuffix(".db"))
        try:
            values = list(MmapedDict.read_all_values_from_file(f))
        except struct.error:  # a worker's file still being created (empty): read again next time
            continue
        for key, value, *_ in values:
            if '"fleet_backend_healthy"' in key and f'"{backend}"' in key:
                out[pid] = value
    return out


def all_in_every_rotation(gw: Gateway, directory: str, *fakes: FakeVllm) -> bool:
    """4 live workers, each with every one of ``fakes`` in its rotation (its own gauge files)."""
    pids = workers_of(gw.pid)
    return len(pids) == 4 and all(
        rotation_by_pid(directory, f"fake-{f.port}").get(p) == 1 for p in pids for f in fakes)


def test_four_workers_eject_a_failing_backend_together(tmp_path: Path) -> None:
    """A replica answering 503 leaves every worker's rotation after 3 failed requests in the whole
    gateway (FLEET_EJECT_FAILURES), however the kernel spread them over the workers; with each
    worker counting its own, 3 failures spread over 4 workers ejected it nowhere, or in one."""
    good, sick = FakeVllm(tmp_path, ["m1"]), FakeVllm(tmp_path, ["m1"])
    gw = Gateway(tmp_path, instances(good, sick), args=["--workers", "4"],
                 env={"FLEET_EJECT_FAILURES": "3", "FLEET_EJECT_BASE_S": "60", "FLEET_ROUTING_POLICY": "round_robin"})
    try:
        pids = workers_of(gw.pid)
        directory = metrics_dir_of(pids[0])
        name = f"fake-{sick.port}"
        # Both replicas in every worker's rotation (a worker without the good one would pass the 503 on).
        assert wait_until(lambda: all_in_every_rotation(gw, directory, sick, good), 20)
        sick.configure(status=503)
        sent = 0
        while sick.stats()["requests_total"] < 3 and sent < 200:
            # A 503 from vLLM is retried on the other replica: the client sees 200 throughout.
            assert httpx.post(gw.url + "/v1/chat/completions", content=BODY, headers=HEADERS,
                              timeout=10).status_code == 200
            sent += 1
        assert sick.stats()["requests_total"] == 3, sent
        assert wait_until(lambda: all(rotation_by_pid(directory, name).get(p) == 0 for p in workers_of(gw.pid)), 5), \
            rotation_by_pid(directory, name)
        send(gw, 40)
        assert sick.stats()["requests_total"] == 3  # out of every worker's rotation
        # /fleet, from whichever workers the kernel hands these new connections, counts the
        # gateway's failures in a row, not the answering worker's share of them.
        seen = {next(b["request_failures"] for b in httpx.get(gw.url + "/fleet", timeout=10).json()["backends"]
                     if b["name"] == name) for _ in range(20)}
        assert seen == {3}, seen
    finally:
        gw.stop()
        good.stop()
        sick.stop()


def test_four_workers_share_their_probes_verdicts(tmp_path: Path) -> None:
    """One failed /health probe (FLEET_HEALTH_FAILURES=1) takes a replica out of every worker's
    rotation, though only one worker's probe saw it: each worker probing alone left it in the other
    three until their own probes failed, which here they never do. With FLEET_HEALTH_SUCCESSES=15
    (3 s of one worker's probes) the first worker back brings it back in all four."""
    good, flaky = FakeVllm(tmp_path, ["m1"]), FakeVllm(tmp_path, ["m1"])
    gw = Gateway(tmp_path, instances(good, flaky), args=["--workers", "4"],
                 env={"FLEET_HEALTH_FAILURES": "1", "FLEET_HEALTH_SUCCESSES": "15"})
    try:
        directory = metrics_dir_of(workers_of(gw.pid)[0])
        name = f"fake-{flaky.port}"
        assert wait_until(lambda: len(workers_of(gw.pid)) == 4 and all(
            rotation_by_pid(directory, name).get(p) == 1 for p in workers_of(gw.pid)), 20)
        pids = workers_of(gw.pid)
        flaky.configure(health_fail_next=1)
        # Out everywhere well before any worker could have come back on its own (15 × 0.2 s).
        assert wait_until(lambda: all(rotation_by_pid(directory, name).get(p) == 0 for p in pids), 2), \
            rotation_by_pid(directory, name)
        assert {httpx.get(gw.url + "/fleet", headers=HEADERS, timeout=5).json()["backends"][1]["state"]
                for _ in range(8)} == {"unhealthy"}
        send(gw, 16)
        assert flaky.stats()["requests_total"] == 0
        assert wait_until(lambda: all(rotation_by_pid(directory, name).get(p) == 1 for p in pids), 10), \
            rotation_by_pid(directory, name)
        assert workers_of(gw.pid) == pids
    finally:
        gw.stop()
        good.stop()
        flaky.stop()


def test_four_workers_balance_the_gateways_requests_over_the_replicas(tmp_path: Path) -> None:
    """8 slow requests, each on a new connection and each sent once the one before it is open
    upstream, go 4 and 4 to two replicas, however the kernel spread them over 4 workers: each
    worker picks by the whole gateway's in-flight counts. Picking by its own counts, every worker
    broke its first tie the same way, so a worker handed an odd number of them left one more on
    that replica each time (5 and 3 in 2 of 3 runs before the change)."""
    one, two = FakeVllm(tmp_path, ["m1"]), FakeVllm(tmp_path, ["m1"])
    gw = Gateway(tmp_path, instances(one, two), args=["--workers", "4"])
    try:
        directory = metrics_dir_of(workers_of(gw.pid)[0])
        assert wait_until(lambda: all_in_every_rotation(gw, directory, one, two), 20)
        slow = BODY.replace(b'"max_tokens": 4', b'"max_tokens": 4, "fake_latency": 10')
        with ThreadPoolExecutor(8) as ex:
            running = []
            for n in range(1, 9):
                running.append(ex.submit(lambda: httpx.post(gw.url + "/v1/chat/completions", content=slow,
                                                            headers=HEADERS, timeout=30).status_code))
                assert wait_until(lambda n=n: one.stats()["in_flight"] + two.stats()["in_flight"] == n, 5), n
            assert (one.stats()["in_flight"], two.stats()["in_flight"]) == (4, 4)
            assert [f.result() for f in running] == [200] * 8
    finally:
        gw.stop()
        one.stop()
        two.stop()


def test_four_workers_go_round_the_replicas_in_one_rotation(tmp_path: Path) -> None:
    """round_robin through 4 workers: 12 requests one after another, each on a new connection, go
    6 and 6 to two replicas and alternate, whichever workers take them (the turn is the
    gateway's). With a turn per worker, a worker handed an odd number sent one more to the first."""
    one, two = FakeVllm(tmp_path, ["m1"]), FakeVllm(tmp_path, ["m1"])
    gw = Gateway(tmp_path, instances(one, two), args=["--workers", "4"], env={"FLEET_ROUTING_POLICY": "round_robin"})
    try:
        directory = metrics_dir_of(workers_of(gw.pid)[0])
        assert wait_until(lambda: all_in_every_rotation(gw, directory, one, two), 20)
        order = [httpx.post(gw.url + "/v1/chat/completions", content=BODY, headers=HEADERS,
                            timeout=10).headers["x-fleet-backend"] for _ in range(12)]
        assert all(a != b for a, b in itertools.pairwise(order)), order
    finally:
        gw.stop()
        one.stop()
        two.stop()


def test_four_workers_share_what_prefix_aware_routing_learns(tmp_path: Path) -> None:
    """One request with a long prompt is held open on one replica; 12 more that share its prefix,
    each on a new connection, all go to that replica, whichever of the 4 workers take them: the
    prefix index is one table for every worker. With an index per worker, a worker that had not
    seen the prefix sent it to the idle replica (by the gateway's in-flight counts) and learned it
    there: the second replica took some of the 12 in 3 runs of 3."""
    one, two = FakeVllm(tmp_path, ["m1"]), FakeVllm(tmp_path, ["m1"])
    gw = Gateway(tmp_path, instances(one, two), args=["--workers", "4"], env={"FLEET_ROUTING_POLICY": "prefix_aware"})
    try:
        directory = metrics_dir_of(workers_of(gw.pid)[0])
        assert wait_until(lambda: all_in_every_rotation(gw, directory, one, two), 20)
        prefix = "You answer questions about the sea, briefly and kindly. " * 12

        def body(question: str, latency: float = 0) -> bytes:
            return json.dumps({"model": "m1", "prompt": prefix + question, "max_tokens": 4,
                               "fake_latency": latency}).encode()

        with ThreadPoolExecutor(1) as ex:
            held = ex.submit(lambda: httpx.post(gw.url + "/v1/completions", content=body("why blue?", 10),
                                                headers=HEADERS, timeout=30).status_code)
            assert wait_until(lambda: one.stats()["in_flight"] + two.stats()["in_flight"] == 1, 5)
            home, other = (one, two) if one.stats()["in_flight"] else (two, one)
            for i in range(12):
                assert httpx.post(gw.url + "/v1/completions", content=body(f"question {i}?"), headers=HEADERS,
                                  timeout=10).status_code == 200
            assert (home.stats()["requests_total"], other.stats()["requests_total"]) == (13, 0)
            assert held.result() == 200
        # /fleet from any worker counts the table's cells: the blocks of every prompt sent, at least.
        fleets = [httpx.get(gw.url + "/fleet", headers=HEADERS, timeout=5).json() for _ in range(8)]
        blocks = {f["routing"]["m1"]["prefix_index_blocks"] for f in fleets}
        assert len(blocks) == 1 and blocks.pop() >= len(prefix) // 128
    finally:
        gw.stop()
        one.stop()
        two.stop()
