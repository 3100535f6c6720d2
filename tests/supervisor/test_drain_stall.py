"""The drain's judgement of vLLM's busy gauges (fleet_supervisor/drain.py Stall, sleepmode.engine_load):
busy with the token counters flat for drain_stalled_s counts as drained; anything else waits."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from fleet_supervisor import sleepmode
from fleet_supervisor.drain import Stall


def test_flat_counters_stall_only_while_busy_and_only_after_the_limit() -> None:
    s = Stall(30.0)
    assert not s.seen(108, 5000.0, 0.0)
    assert not s.seen(108, 5000.0, 29.9)
    assert s.seen(108, 5000.0, 30.0)
    assert not s.seen(108, 5001.0, 31.0)  # a token moved: counting starts again
    assert not s.seen(108, 5001.0, 60.9) and s.seen(108, 5001.0, 61.0)
    assert not s.seen(0, 5001.0, 100.0)  # idle is not a stall (the drain ends on it anyway)
    assert not s.seen(3, 5001.0, 101.0)  # busy again: from now
    assert not s.seen(3, None, 1000.0)  # no counters: the gauges are taken as they are
    off = Stall(0.0)
    assert not off.seen(108, 5000.0, 0.0) and not off.seen(108, 5000.0, 1e9)


def test_engine_load_sums_the_gauges_and_the_token_counters() -> None:
    exposition = (
        '# TYPE vllm:num_requests_running gauge\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 80.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0\n'
        'vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9\n'
        'vllm:generation_tokens_total{engine="0",model_name="m"} 250.0\n'
    )

    async def run() -> list[tuple[float, float | None] | None]:
        texts = [exposition, 'vllm:num_requests_running{model_name="m"} 0.0\n']

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=texts.pop(0))
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession() as session:
                base = f"http://127.0.0.1:{port}"
                return [await sleepmode.engine_load(session, base), await sleepmode.engine_load(session, base),
                        await sleepmode.engine_load(session, "http://127.0.0.1:1")]
        finally:
            await runner.cleanup()

    assert asyncio.run(run()) == [(82.0, 350.0), (0.0, None), None]
