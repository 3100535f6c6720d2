"""The console of a gateway that runs alone (no supervisor: compose, Kubernetes), in the browser:
instances come from the gateway's own backends, logs and GPUs say why they are absent, and the
opt-in prompt excerpts (FLEET_CONSOLE_PROMPTS) reach admin keys only, as text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.console.conftest import ADMIN_KEY, CLIENT_KEY, XSS, open_page
from tests.console.test_console import rendered
from tests.support.procs import FakeVllm, Gateway, instances

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def alone(tmp_path: Path) -> Iterator[Gateway]:
    fake = FakeVllm(tmp_path, ["m1"])
    try:
        gw = Gateway(tmp_path, instances(fake), env={"FLEET_API_KEYS": CLIENT_KEY, "FLEET_ADMIN_KEYS": ADMIN_KEY,
                                                     "FLEET_CONSOLE_PROMPTS": "true"})
        try:
            yield gw
        finally:
            gw.stop()
    finally:
        fake.stop()


def test_gateway_alone_and_prompts_for_admins_only(browser: Any, alone: Gateway) -> None:
    body = {"model": "m1", "messages": [{"role": "user", "content": XSS}], "max_tokens": 4}
    assert httpx.post(f"{alone.url}/v1/chat/completions", json=body, headers=alone.auth).status_code == 200
    client = httpx.get(f"{alone.url}/ui/api/activity", headers=alone.auth).json()
    assert client["prompts"] is False and "prompt" not in client["requests"][0]
    admin = httpx.get(f"{alone.url}/ui/api/activity", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert admin["requests"][0]["prompt"] == XSS
    # Tokens: from the answer's usage, and for a stream from the gateway's own count of it.
    streamed = {**body, "stream": True, "max_tokens": 6, "ignore_eos": True}
    with httpx.stream("POST", f"{alone.url}/v1/chat/completions", json=streamed, headers=alone.auth) as r:
        assert r.status_code == 200 and "[DONE]" in r.read().decode()
    rows = httpx.get(f"{alone.url}/ui/api/activity", headers=alone.auth).json()["requests"]
    assert [row["tokens"] for row in rows[:2]] == [6, admin["requests"][0]["tokens"]], rows
    assert admin["requests"][0]["tokens"] is not None

    w = open_page(browser, alone.url, admin=ADMIN_KEY)
    rendered(w)
    page = w.page
    assert page.locator("#instances tbody tr").count() == 1
    assert page.locator("#instances tbody tr td.proc").inner_text() == "–"  # no process state without a supervisor
    assert "no supervisor" in page.locator("#gpus").inner_text()
    assert "no supervisor" in page.locator("#sup").inner_text()
    page.click("nav button[data-tab='activity']")
    page.wait_for_selector("#requests td.prompt", timeout=5000)
    assert page.locator("#requests td.prompt").first.inner_text() == XSS
    page.click("nav button[data-tab='logs']")
    page.wait_for_function("() => document.getElementById('lognote').textContent.includes('no supervisor')",
                           timeout=5000)
    assert page.locator("img").count() == 0 and w.dialogs == [] and w.errors == [], (w.errors, w.dialogs)
