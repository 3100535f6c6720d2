"""A fake vLLM OpenAI server: a real HTTP server process, fast, with knobs for faults.

It takes vLLM's command line (unknown flags are ignored, so the supervisor can launch it as a
``vllm_command``) plus its own ``--fake-*`` flags for process behaviour, and a runtime control
endpoint ``POST /_fake/config`` for HTTP behaviour, so a test can change a live server.

Process flags: --fake-startup-delay S (listen only after S seconds), --fake-crash-after S,
--fake-ignore-sigterm (the API server process only), --fake-workers N (forked children in the same
process group that outlive the parent, like vLLM's EngineCore), --fake-workers-ignore-sigterm (the
workers ignore SIGTERM; only SIGKILL ends them), --fake-never-healthy.
HTTP knobs (flags or /_fake/config): latency (s before response headers), token_delay (s between
SSE events), tokens, status (answer every POST with this status), hang (never answer a POST),
health_status, health_fail_next (answer the next N /health calls with 503, then health_status
again), drop_after (abort the connection before token N of a stream; N at or past its last
token: after the last, before the usage chunk and ``[DONE]``), merge (tokens per stream event, as vLLM
v1 merges deltas when its API server falls behind its engine), load_running / load_waiting / load_kv (added to
what /metrics reports, as if other clients used the server), load_tokens (null: /metrics has no token
counter; a number: its ``vllm:generation_tokens_total``, which grows by load_tokens_step at each read, as
a busy engine's does; a step of 0 is vLLM's stuck gauges: load reported, nothing moving), validate (check the request
fields as vLLM does and answer 400 for a bad one: ``max_tokens`` an integer in [1, 2048], ``n`` an
integer in [1, 16], ``stream`` a boolean; ``fake_latency`` is then ignored, so fuzzed bodies can
neither stall nor flood the fake), eof_delay (s between a stream's ``[DONE]`` and the end of its
chunked body, which vLLM sends as a separate write).
Per request: a body field ``fake_latency`` (s) replaces the latency knob for that request only, so
one test can hold some requests open while others pass. ``POST /v1/echo_body`` answers with the
exact bytes it received. ``GET /_fake/last_body`` is the last POST body (JSON) it was sent;
``GET /_fake/tokenized`` every body sent to ``/tokenize``.

Streams are shaped as vLLM's where the gateway reads them (docs/stream-failover.md): the tokens are
"t0 ", "t1 ", ... one per event; chat starts with a role chunk; the last token's chunk carries the
finish reason ("length" when ``max_tokens`` was given, else "stop"); a usage chunk follows when
``stream_options.include_usage`` is set (prompt tokens: words of the prompt or messages); ``n``
choices interleave. A continuation (``continue_final_message`` with a final assistant message, or
a completions prompt ending in the fake's tokens) goes on after the last "tN" it was given, so a
stream continued across two fakes reads "t0 ... t11" as one. ``tools`` with
``tool_choice: "required"`` streams a tool call; a body field ``fake_reasoning`` streams reasoning.

Sleep mode, as vLLM's with ``--enable-sleep-mode`` (DESIGN §3): ``POST /sleep?level=N``,
``POST /wake_up``, ``GET /is_sleeping``, ``POST /collective_rpc`` (reload_weights),
``POST /reset_prefix_cache``. While asleep ``/health`` stays 200 and every POST /v1/* hangs
without an error, as vLLM's do; ``/_fake/stats`` counts them (``while_asleep``) so a test can show
none ever arrived. Knobs: sleep_delay, wake_delay (s), wake_fail (answer wake_up with 500).
``--fake-memory-file F`` (the same F for fakes on one "GPU") emulates what vLLM does when another
process moves the device's memory during its start, sleep or wake: each of those holds F; finding
F already held, the fake dies as vLLM's engine did on H200 ("Memory usage increased after
sleeping"), so a test shows the supervisor never overlaps them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

from aiohttp import web
from fake_stream import Events, continue_problem, continued_from, prompt_words  # beside this file: run as a script

KNOBS: dict[str, Any] = {
    "latency": 0.0, "token_delay": 0.0, "tokens": 8, "status": 200, "hang": False,
    "health_status": 200, "health_fail_next": 0, "drop_after": -1, "merge": 1, "validate": False,
    "load_running": 0, "load_waiting": 0, "load_kv": 0.0, "load_tokens": None, "load_tokens_step": 0,
    "sleep_delay": 0.0, "wake_delay": 0.0, "wake_fail": False, "eof_delay": 0.0,
}
STATS = {"requests_total": 0, "in_flight": 0, "peak_in_flight": 0, "cancelled": 0, "completed": 0,
         "while_asleep": 0, "sleeps": 0, "wakes": 0}
ASLEEP: dict[str, int] = {}  # {"level": N} while asleep
LAST: dict[str, Any] = {"body": None}  # the last POST body that parsed as JSON
TOKENIZED: list[Any] = []  # every /tokenize body, in order


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="fake-model")
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--fake-name", default=None, help="identifies this replica in responses")
    p.add_argument("--fake-startup-delay", type=float, default=0.0)
    p.add_argument("--fake-crash-after", type=float, default=0.0)
    p.add_argument("--fake-ignore-sigterm", action="store_true")
    p.add_argument("--fake-workers", type=int, default=0)
    p.add_argument("--fake-workers-ignore-sigterm", action="store_true")
    p.add_argument("--fake-never-healthy", action="store_true")
    p.add_argument("--enable-sleep-mode", action="store_true")
    p.add_argument("--fake-memory-file", default=None)
    for knob, default in KNOBS.items():
        flag = f"--fake-{knob.replace('_', '-')}"
        if isinstance(default, bool):
            p.add_argument(flag, dest=knob, action="store_true")
        else:
            p.add_argument(flag, dest=knob, type=type(default), default=default)
    args, _unknown = p.parse_known_args(argv)
    return args


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "fake_error", "param": None, "code": status}}
    return web.json_response(body, status=status)


def _invalid(body: dict[str, Any]) -> str | None:
    """What vLLM's request validation would reject in the fields the fake reads, or None."""
    for field, top in (("max_tokens", 2048), ("n", 16)):
        value = body.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top):
            return f"{field} must be an integer in [1, {top}]"
    if not isinstance(body.get("stream", False), bool):
        return "stream must be a boolean"
    return None


class MemoryRace(Exception):
    """Another fake moved the shared device's memory during this one's memory operation."""


class DeviceMemory:
    """Holds the shared marker file for the length of one memory operation (start, sleep, wake)."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def __enter__(self) -> None:
        if self.path is None:
            return
        try:
            os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            raise MemoryRace(self.path) from None

    def __exit__(self, *_: object) -> None:
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def _die_of_race() -> web.Response:
    print("AssertionError: Memory usage increased after sleeping. (fake: another process used the device)",
          flush=True)
    asyncio.get_running_loop().call_later(0.05, os._exit, 1)
    return _error(500, "engine died: the device's memory moved during a sleep or wake")


class Fake:
    def __init__(self, args: argparse.Namespace) -> None:
        self.models = args.served_model_name or [args.model]
        self.name = args.fake_name or f"fake-{args.port}"
        self.memory = DeviceMemory(args.fake_memory_file)
        self.port = args.port

    async def health(self, _: web.Request) -> web.Response:
        if KNOBS["health_fail_next"] > 0:
            KNOBS["health_fail_next"] -= 1
            return web.Response(status=503)
        return web.Response(status=KNOBS["health_status"])

    async def models_(self, _: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "vllm", "root": m, "max_model_len": 2048}
                for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def metrics(self, _: web.Request) -> web.Response:
        text = (
            f'vllm:num_requests_running{{model_name="{self.models[0]}"}} {STATS["in_flight"] + KNOBS["load_running"]}\n'
            f'vllm:num_requests_waiting{{model_name="{self.models[0]}"}} {KNOBS["load_waiting"]}\n'
            f'vllm:kv_cache_usage_perc{{model_name="{self.models[0]}"}} {KNOBS["load_kv"]}\n'
        )
        if KNOBS["load_tokens"] is not None:
            KNOBS["load_tokens"] += KNOBS["load_tokens_step"]
            text += f'vllm:generation_tokens_total{{model_name="{self.models[0]}"}} {KNOBS["load_tokens"]}\n'
        return web.Response(text=text, content_type="text/plain")

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response(STATS)

    async def last_body(self, _: web.Request) -> web.Response:
        return web.json_response(LAST["body"])

    async def tokenized(self, _: web.Request) -> web.Response:
        return web.json_response(TOKENIZED)

    async def config(self, request: web.Request) -> web.Response:
        KNOBS.update(await request.json())
        return web.json_response(KNOBS)

    async def echo_headers(self, request: web.Request) -> web.Response:
        return web.json_response({k.lower(): v for k, v in request.headers.items()})

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize and /detokenize, enough for routing tests: one token per word (of the
        prompt, or of every message: the count the fake's usage gives a prompt)."""
        body = await request.json()
        if body.get("model") not in self.models:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        if request.path == "/detokenize":
            return web.json_response({"prompt": " ".join(f"w{t}" for t in body.get("tokens", []))})
        TOKENIZED.append(body)
        words = prompt_words(body)
        return web.json_response({"count": words, "max_model_len": 2048, "tokens": list(range(words)),
                                  "served_by": self.name})

    async def echo_body(self, request: web.Request) -> web.Response:
        return web.Response(body=await request.read(), content_type="application/octet-stream")

    async def sleep(self, request: web.Request) -> web.Response:
        try:
            with self.memory:
                await asyncio.sleep(KNOBS["sleep_delay"])
        except MemoryRace:
            return _die_of_race()
        ASLEEP["level"] = int(request.query.get("level", "1"))
        STATS["sleeps"] += 1
        return web.Response()

    async def wake_up(self, _: web.Request) -> web.Response:
        try:
            with self.memory:
                await asyncio.sleep(KNOBS["wake_delay"])
        except MemoryRace:
            return _die_of_race()
        if KNOBS["wake_fail"]:
            return _error(500, "injected wake failure")
        ASLEEP.clear()
        STATS["wakes"] += 1
        return web.Response()

    async def is_sleeping(self, _: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": bool(ASLEEP)})

    async def dev_ok(self, _: web.Request) -> web.Response:
        return web.json_response({"results": []})

    async def post(self, request: web.Request) -> web.StreamResponse:
        if ASLEEP:
            STATS["while_asleep"] += 1
            await asyncio.sleep(3600)  # vLLM asleep: the request hangs, no error
        STATS["requests_total"] += 1
        STATS["in_flight"] += 1
        STATS["peak_in_flight"] = max(STATS["peak_in_flight"], STATS["in_flight"])
        try:
            return await self._post(request)
        except asyncio.CancelledError:
            STATS["cancelled"] += 1
            raise
        finally:
            STATS["in_flight"] -= 1

    async def _post(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "bad json")
        LAST["body"] = body
        if KNOBS["validate"] and not isinstance(body, dict):
            return _error(400, "body must be a JSON object")
        if body.get("model") not in self.models:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        if KNOBS["validate"]:
            problem = _invalid(body)
            if problem:
                return _error(400, problem)
            body.pop("fake_latency", None)
        if KNOBS["hang"]:
            await asyncio.sleep(3600)
        latency = body.get("fake_latency", KNOBS["latency"])
        if latency:
            await asyncio.sleep(latency)
        if KNOBS["status"] != 200:
            return _error(KNOBS["status"], "injected failure")
        kind = request.path.rsplit("/", 1)[-1]
        headers = {"x-fake-backend": self.name}
        if kind == "embeddings":
            data = {"object": "list", "model": body["model"], "usage": {"prompt_tokens": 1, "total_tokens": 1},
                    "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}]}
            STATS["completed"] += 1
            return web.json_response(data, headers=headers)
        n = int(body.get("max_tokens") or KNOBS["tokens"])
        obj = "chat.completion" if kind == "completions" and "chat" in request.path else "text_completion"
        if not body.get("stream"):
            for _ in range(n):
                if KNOBS["token_delay"]:
                    await asyncio.sleep(KNOBS["token_delay"])
            text = " ".join(f"t{i}" for i in range(n))
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            if obj == "chat.completion":
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            STATS["completed"] += 1
            return web.json_response({"id": "cmpl-fake", "object": obj, "created": int(time.time()),
                                      "model": body["model"], "system_fingerprint": self.name, "choices": [choice],
                                      "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}},
                                     headers=headers)
        if (problem := continue_problem(body)) is not None:
            return _error(400, problem)
        resp = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
        await resp.prepare(request)
        events = Events(self.name, f"{self.name}-{STATS['requests_total']}",
                        1_700_000_000 + self.port * 1000 + STATS["requests_total"], body, obj == "chat.completion")
        if obj == "chat.completion":
            await resp.write(events.role())
        start, i = continued_from(body), 0
        while True:
            if KNOBS["drop_after"] >= 0 and i >= KNOBS["drop_after"]:
                assert request.transport is not None
                request.transport.abort()
                return resp
            if i == n:
                break
            if KNOBS["token_delay"]:
                await asyncio.sleep(KNOBS["token_delay"])
            k = min(max(1, KNOBS["merge"]), n - i)
            await resp.write(events.tokens(start + i, k, last=i + k == n))
            i += k
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(events.usage(n))
        await resp.write(b"data: [DONE]\n\n")
        if KNOBS["eof_delay"]:
            await asyncio.sleep(KNOBS["eof_delay"])
        STATS["completed"] += 1
        await resp.write_eof()
        return resp


def _spawn_workers(n: int, ignore_sigterm: bool) -> None:
    """Children that keep running when the parent dies, as vLLM's EngineCore does."""
    for _ in range(n):
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_sigterm else signal.SIG_DFL)
            while True:
                time.sleep(3600)


def main(argv: list[str] | None = None) -> None:
    args = _args(sys.argv[1:] if argv is None else argv)
    for knob in KNOBS:
        KNOBS[knob] = getattr(args, knob)
    if args.fake_never_healthy:
        KNOBS["health_status"] = 503
    if args.fake_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _spawn_workers(args.fake_workers, args.fake_workers_ignore_sigterm)
    if args.fake_startup_delay:
        try:
            with DeviceMemory(args.fake_memory_file):
                time.sleep(args.fake_startup_delay)
        except MemoryRace:
            print("fake: another process used the device while this one profiled its memory", flush=True)
            sys.exit(1)
    print(f"fake vllm {args.port} models={args.served_model_name or [args.model]} "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
    fake = Fake(args)
    app = web.Application()
    app.router.add_get("/health", fake.health)
    app.router.add_get("/v1/models", fake.models_)
    app.router.add_get("/metrics", fake.metrics)
    app.router.add_get("/_fake/stats", fake.stats)
    app.router.add_get("/_fake/last_body", fake.last_body)
    app.router.add_get("/_fake/tokenized", fake.tokenized)
    app.router.add_post("/_fake/config", fake.config)
    app.router.add_post("/v1/echo_headers", fake.echo_headers)
    app.router.add_post("/v1/echo_body", fake.echo_body)
    app.router.add_post("/v1/{tail:.*}", fake.post)
    if args.enable_sleep_mode:
        app.router.add_post("/sleep", fake.sleep)
        app.router.add_post("/wake_up", fake.wake_up)
        app.router.add_get("/is_sleeping", fake.is_sleeping)
        app.router.add_post("/collective_rpc", fake.dev_ok)
        app.router.add_post("/reset_prefix_cache", fake.dev_ok)
    app.router.add_post("/tokenize", fake.tokenize)
    app.router.add_post("/detokenize", fake.tokenize)

    async def crash(_: web.Application) -> None:
        if args.fake_crash_after:
            asyncio.get_running_loop().call_later(args.fake_crash_after, os._exit, 1)

    app.on_startup.append(crash)
    # handle_signals=False keeps --fake-ignore-sigterm in force; SIGTERM's default action exits.
    # handler_cancellation: like vLLM, stop work when the client (the gateway) goes away.
    web.run_app(app, host=args.host, port=args.port, print=None, handle_signals=False, access_log=None,
                handler_cancellation=True)


if __name__ == "__main__":
    main()
