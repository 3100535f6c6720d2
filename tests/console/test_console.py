"""The web console in a real browser (Debian's chromium via Playwright) against a fleet of fake
vLLM servers under the real supervisor and gateway: one fleet for the module, shared by the tests
in the order written (the last ones kill and restart instances)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.console.conftest import (
    ADMIN_KEY,
    CLIENT_KEY,
    FAKE_GPUS_PATH,
    XSS,
    Fleet,
    open_page,
    start_fleet,
    stop_fleet,
)
from tests.supervisor.conftest import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("console")
    # Two GPUs from a stand-in nvidia-smi (tests/fakes/bin); alpha is placed on GPU 0 as a CUDA
    # instance would be (the fake vLLM ignores the CUDA flags).
    f = start_fleet(tmp, [
        {"name": "alpha", "model": "m-alpha", "served_model_names": ["alpha-chat", XSS], "device": "cuda",
         "gpus": [0]},
        # Slow to start, so that its restart after a SIGKILL stays visible for a few polls.
        {"name": "beta", "model": "m-beta", "vllm_args": ["--fake-startup-delay", "2.5"]},
    ], env={"PATH": FAKE_GPUS_PATH})
    try:
        f.wait_running()
        yield f
    finally:
        stop_fleet(f)


def rendered(w: Any) -> float:
    """Waits for the first render of live data; its time from navigation start, in ms."""
    w.page.wait_for_selector("body[data-rendered='1']", timeout=10_000)
    return float(w.page.evaluate("performance.getEntriesByName('fleet-first-render')[0].startTime"))


def proc_state(w: Any, name: str) -> str:
    return str(w.page.locator(f"tr[data-instance='{name}'] td.proc").inner_text(timeout=2000))


def test_page_shows_every_instance_and_keeps_names_as_text(browser: Any, fleet: Fleet) -> None:
    w = open_page(browser, fleet.gateway, admin=ADMIN_KEY)
    first = rendered(w)
    page = w.page
    wait_until(lambda: proc_state(w, "alpha") == "RUNNING" and proc_state(w, "beta") == "RUNNING", 10,
               "both instances shown RUNNING")
    assert page.locator("#instances tbody tr").count() == 2  # the gateway child is not an instance
    served = page.locator("tr[data-instance='alpha'] td.served").inner_text()
    assert served == f"alpha-chat, {XSS}"  # the probe as text, not an <img>
    assert page.locator(f"tr[data-model='{XSS}']").count() == 1
    infernet = json.loads(page.locator("#infernet").inner_text())
    assert infernet["served_models"] == ["alpha-chat", XSS, "m-beta"] and infernet["backend"] == "vllm"
    gpus = page.locator("#gpus .gpu")
    assert gpus.count() == 2
    assert "GPU 0 · NVIDIA H100 80GB HBM3" in gpus.nth(0).inner_text() and ">=48gb" in gpus.nth(0).inner_text()
    assert "59.8 / 79.6 GiB" in gpus.nth(0).inner_text() and "16-24gb" in gpus.nth(1).inner_text()
    assert gpus.nth(0).locator("meter").get_attribute("value") == "61234"
    assert page.locator("tr[data-instance='alpha'] td").nth(7).inner_text() == "0"
    assert "supervisor connected" in page.locator("#sup").inner_text()

    page.click("nav button[data-tab='logs']")
    # The fake prints its served names on start: the probe comes back through the log tail too.
    page.wait_for_selector("#loglines .line[data-source='alpha']", timeout=10_000)
    wait_until(lambda: any(XSS in t for t in page.locator("#loglines .txt").all_inner_texts()), 5,
               "the probe in the log tail, as text")
    page.fill("#filter", "models=")
    visible = page.locator("#loglines .line:not([hidden])")
    assert visible.count() >= 2 and all("models=" in t for t in visible.all_inner_texts())
    w.shot("logs")
    page.select_option("#source", "supervisor")
    page.fill("#filter", "")
    supervisor_lines = page.locator("#loglines .line:not([hidden])").all_inner_texts()
    assert supervisor_lines and all("supervisor" in t for t in supervisor_lines)
    assert any("alpha: STARTING -> RUNNING" in t for t in supervisor_lines), supervisor_lines[:5]
    assert page.locator("img").count() == 0
    assert w.dialogs == [] and w.errors == [], (w.dialogs, w.errors)
    page.click("nav button[data-tab='overview']")
    w.shot("overview")
    print(f"first render {first:.0f} ms")
    assert first < 1500, f"first render took {first:.0f} ms"


def test_everything_but_the_shell_needs_a_key(fleet: Fleet) -> None:
    gw, sup = fleet.gateway, fleet.supervisor
    client, admin = {"Authorization": f"Bearer {CLIENT_KEY}"}, {"Authorization": f"Bearer {ADMIN_KEY}"}
    shell = httpx.get(f"{gw}/ui")
    assert shell.status_code == 200 and "script-src 'self'" in shell.headers["content-security-policy"]
    assert "<script>" not in shell.text and "style=" not in shell.text  # nothing inline: the CSP allows none
    assert httpx.get(f"{gw}/ui/static/console.js").status_code == 200
    assert httpx.get(f"{gw}/ui/static/nope.js").status_code == 404
    for path in ("/ui/api/state", "/ui/api/activity", "/admin/logs"):
        assert httpx.get(gw + path).status_code == 401, path
    assert httpx.get(f"{gw}/ui/api/state", headers=client).status_code == 200
    assert httpx.get(f"{gw}/admin/logs", headers=client).status_code == 401  # logs: admin only
    logs = httpx.get(f"{gw}/admin/logs", headers=admin).json()
    assert {"alpha", "beta", "supervisor"} <= set(logs["sources"])
    assert httpx.get(f"{gw}/admin/instances/alpha/restart", headers=admin).status_code == 405  # POST only
    for path in ("/logs", "/gpus"):  # the supervisor's side: control token or admin key
        assert httpx.get(sup + path).status_code == 401, path
        assert httpx.get(sup + path, headers=admin).status_code == 200, path
    assert not [c for c in httpx.get(f"{gw}/ui").headers.get_list("set-cookie")]


def test_playground_streams_and_activity_lists_it(browser: Any, fleet: Fleet) -> None:
    w = open_page(browser, fleet.gateway)
    rendered(w)
    page = w.page
    page.click("nav button[data-tab='playground']")
    page.select_option("#model", "alpha-chat")
    page.fill("#max_tokens", "8")
    page.click("#send")
    page.wait_for_selector("#reply[data-done='1']", timeout=15_000)
    assert page.locator("#reply").inner_text().strip()
    assert "chunks" in page.locator("#replystat").inner_text()
    page.click("nav button[data-tab='activity']")
    page.wait_for_selector("#requests tbody tr", timeout=5000)
    row = page.locator("#requests tbody tr").first.inner_text()
    assert "alpha-chat" in row and "200" in row and "alpha" in row
    w.shot("activity")
    assert w.errors == [], w.errors


def test_sigkill_shows_down_then_back_without_a_reload(browser: Any, fleet: Fleet) -> None:
    fleet.wait_running()
    w = open_page(browser, fleet.gateway)
    rendered(w)
    w.page.evaluate("window.sameDocument = 1")
    pid = fleet.instances()["beta"]["pid"]
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    wait_until(lambda: proc_state(w, "beta") != "RUNNING", 5, "beta shown down")
    shown_down = time.monotonic() - t0
    w.shot("killed")
    wait_until(lambda: proc_state(w, "beta") == "RUNNING", 30, "beta shown back up")
    assert w.page.evaluate("window.sameDocument") == 1  # live updates, no reload
    restarts = w.page.locator("tr[data-instance='beta'] td").nth(3).inner_text()
    assert restarts == "1"
    print(f"SIGKILL shown as down after {shown_down:.2f}s")
    assert shown_down < 3.0


def _pid_of(fleet: Fleet, name: str) -> int | None:
    """None between a restart's stop and its next start (CI caught the test reading it then)."""
    pid = fleet.instances()[name]["pid"]
    return None if pid is None else int(pid)


def test_restart_needs_the_admin_key(browser: Any, fleet: Fleet, tmp_path: Path) -> None:
    fleet.wait_running()
    before = _pid_of(fleet, "alpha")
    w = open_page(browser, fleet.gateway, admin="not-the-admin-key")
    rendered(w)
    page = w.page
    page.click("tr[data-instance='alpha'] button[data-action='restart']")
    wait_until(lambda: "refused" in page.locator("#banner").inner_text(), 5, "the refusal shown")
    assert "HTTP 401" in page.locator("#banner").inner_text()
    time.sleep(1.0)
    assert _pid_of(fleet, "alpha") == before and fleet.instances()["alpha"]["state"] == "RUNNING"

    page.fill("#admin", ADMIN_KEY)  # as an operator would: type the key, then use it
    page.click("#keys button")
    page.click("tr[data-instance='alpha'] button[data-action='restart']")
    wait_until(lambda: "restart asked" in page.locator("#banner").inner_text(), 5, "the restart acknowledged")
    wait_until(lambda: _pid_of(fleet, "alpha") not in (before, None), 20, "alpha restarted")
    wait_until(lambda: proc_state(w, "alpha") == "RUNNING", 20, "alpha shown RUNNING again")
    assert "admin-key" not in page.url and ADMIN_KEY not in fleet.output()  # no key in URLs or logs
