"""vLLM's sleep mode, spoken over HTTP (DESIGN §3, measured on H200 with vLLM 0.24).

Needs ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1`` (command.py adds both). Level 1 moves
the weights to host RAM and drops the KV cache; level 2 drops the weights too, so a wake must also
``reload_weights`` (from disk) and ``reset_prefix_cache``. While asleep vLLM answers ``/health``
with 200 and lets requests hang, so ``/is_sleeping`` is the only truth about it, and every step is
checked against it. Each call raises SleepModeError with what vLLM answered.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

_BUSY_SERIES = (b"vllm:num_requests_running", b"vllm:num_requests_waiting")
_TOKEN_SERIES = (b"vllm:prompt_tokens_total", b"vllm:generation_tokens_total")


class SleepModeError(RuntimeError):
    """vLLM refused, failed or did not confirm a sleep-mode step."""


async def _call(session: aiohttp.ClientSession, method: str, url: str, limit_s: float,
                body: Any = None) -> bytes:
    try:
        async with session.request(method, url, json=body, timeout=aiohttp.ClientTimeout(total=limit_s)) as r:
            data = await r.read()
            if r.status != 200:
                raise SleepModeError(f"{method} {url} answered {r.status}: {data[:200]!r}")
            return data
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        raise SleepModeError(f"{method} {url} failed: {e.__class__.__name__}: {e}") from e


async def is_sleeping(session: aiohttp.ClientSession, base: str, limit_s: float = 5.0) -> bool:
    body = await _call(session, "GET", f"{base}/is_sleeping", limit_s)
    try:
        value = json.loads(body).get("is_sleeping")
    except (ValueError, AttributeError) as e:
        raise SleepModeError(f"GET {base}/is_sleeping did not answer JSON: {body[:200]!r}") from e
    if not isinstance(value, bool):
        raise SleepModeError(f"GET {base}/is_sleeping answered {body[:200]!r}")
    return value


async def sleep(session: aiohttp.ClientSession, base: str, level: int, limit_s: float) -> None:
    await _call(session, "POST", f"{base}/sleep?level={level}", limit_s)
    if not await is_sleeping(session, base):
        raise SleepModeError(f"{base} still says it is awake after POST /sleep?level={level}")


async def wake(session: aiohttp.ClientSession, base: str, level: int, limit_s: float) -> None:
    await _call(session, "POST", f"{base}/wake_up", limit_s)
    if level == 2:
        # Level 2 threw the weights away: load them again, and forget prefixes computed with none.
        await _call(session, "POST", f"{base}/collective_rpc", limit_s, body={"method": "reload_weights"})
        await _call(session, "POST", f"{base}/reset_prefix_cache", limit_s)
    if await is_sleeping(session, base):
        raise SleepModeError(f"{base} still says it is sleeping after POST /wake_up")


async def engine_load(session: aiohttp.ClientSession, base: str, limit_s: float = 5.0
                      ) -> tuple[float, float | None] | None:
    """What the engine runs and queues, and its token counters' sum (None: it has none), from vLLM's
    own /metrics; None when that did not answer. A server without those series (not vLLM) runs
    nothing: the gateways' drain acknowledgements are then the only check."""
    try:
        body = await _call(session, "GET", f"{base}/metrics", limit_s)
    except SleepModeError:
        return None
    busy, tokens = 0.0, None
    for line in body.splitlines():
        is_busy = line.startswith(_BUSY_SERIES)
        if not is_busy and not line.startswith(_TOKEN_SERIES):
            continue
        try:
            value = float(line.rsplit(b" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if is_busy:
            busy += value
        else:
            tokens = (tokens or 0.0) + value
    return busy, tokens
