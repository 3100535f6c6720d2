"""A request looks its event loop up once: on CPython 3.11 ``asyncio.get_running_loop()``, and
``asyncio.current_task()`` without a loop, each make a getpid(2) (a check against fork). The
non-streamed path made three (perf stat in bench/compare's conc load: 4 getpid per request with
uvicorn's own, against none for vllm-router); the loop found once serves the rest."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from typing import Any

import pytest

from tests.gateway.test_drain import BODY, Client, _gateway
from tests.support.procs import FakeVllm


async def test_a_completion_looks_the_loop_up_once(fakes: list[FakeVllm], monkeypatch: pytest.MonkeyPatch) -> None:
    gw = _gateway(fakes[0])
    lookups: Counter[str] = Counter()
    real_loop, real_task = asyncio.get_running_loop, asyncio.current_task

    def get_running_loop() -> asyncio.AbstractEventLoop:
        lookups[sys._getframe(1).f_globals["__name__"]] += 1
        return real_loop()

    def current_task(loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Task[Any] | None:
        if loop is None:
            lookups[sys._getframe(1).f_globals["__name__"]] += 1
        return real_task(loop)

    try:
        body = {**BODY, "stream": False}
        await asyncio.wait_for(Client(gw, body).task, 10)  # first use: connections that stay
        monkeypatch.setattr(asyncio, "get_running_loop", get_running_loop)
        monkeypatch.setattr(asyncio, "current_task", current_task)
        client = Client(gw, body)
        await asyncio.wait_for(client.task, 10)
        monkeypatch.undo()
        assert client.sent[0]["status"] == 200
        assert sum(n for mod, n in lookups.items() if mod.startswith("gateway.")) == 1, lookups
    finally:
        await gw.proxy.stop()
