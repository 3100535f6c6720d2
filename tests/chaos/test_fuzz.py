"""schemathesis against the running gateway's OpenAPI schema: no 5xx from the gateway itself.

Two runs, each bounded in examples per operation and in time:

1. the schema exactly as ``GET /openapi.json`` serves it (the control routes; the proxied POST
   routes document no body, so they get empty and random bodies and random ``{path}`` values);
2. the same schema with an OpenAI-like request body added to the proxied POST routes (model among
   the served one and an unknown one, prompt/messages, max_tokens, n, stream, temperature), so
   that positive cases reach the replicas and negative ones (wrong types, missing fields, bad
   content types) exercise the gateway's own checks.

The replicas run with ``validate`` on (they answer 400 to what vLLM would reject), so a fuzzed
``max_tokens`` can neither flood nor stall them; a 5xx from a replica would carry x-fleet-backend
and is not the gateway's.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.chaos.conftest import Pair
from tests.support.procs import ROOT

ST = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
MAX_EXAMPLES = 50
MAX_TIME_S = 60  # a cap on each run (subprocess timeout); they take a few seconds
ENV = {"FLEET_MAX_TOKENS_CAP": "64", "FLEET_MAX_N_CAP": "4", "FLEET_HEADERS_TIMEOUT_S": "5",
       "FLEET_MAX_BODY_BYTES": "65536"}
PROXIED = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/{path}")

REQUEST_BODY: dict[str, Any] = {
    "required": True,
    "content": {"application/json": {"schema": {
        "type": "object",
        "required": ["model"],
        "properties": {
            "model": {"type": "string", "enum": ["m", "not-served"]},
            "prompt": {"type": "string", "maxLength": 64},
            "input": {"type": "string", "maxLength": 64},
            "messages": {"type": "array", "maxItems": 3, "items": {
                "type": "object", "required": ["role", "content"],
                "properties": {"role": {"type": "string", "enum": ["system", "user", "assistant"]},
                               "content": {"type": "string", "maxLength": 64}}}},
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
            "n": {"type": "integer", "minimum": 1, "maximum": 4},
            "stream": {"type": "boolean"},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        },
    }}},
}


def _with_bodies(schema: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    for path in PROXIED:
        op = out["paths"][path]["post"]
        op["requestBody"] = REQUEST_BODY
        if "{path}" in path:  # short paths: long random ones only ever meet the 404
            op["parameters"] = [{"name": "path", "in": "path", "required": True,
                                 "schema": {"type": "string", "maxLength": 40}}]
        op["responses"].update({str(s): {"description": "error envelope"} for s in (400, 404, 413, 429, 502, 503)})
    return out


def _run(location: str, base_url: str, report: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    assert ST is not None
    argv = [ST, "run", location, "--url", base_url, "--checks", "not_a_gateway_server_error",
            "--max-examples", str(MAX_EXAMPLES), "--phases", "examples,coverage,fuzzing",
            "--workers", "1", "--request-timeout", "10", "--seed", "4", "--generation-database", "none",
            "--no-color", "--report", "ndjson", "--report-ndjson-path", str(report)]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.chaos.st_hooks", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=MAX_TIME_S,
                          check=False)
    return proc, _count(report)


def _count(report: Path) -> dict[str, Any]:
    """From the ndjson event stream: status codes per operation (requests sent), scenario
    outcomes (success / failure / error / skip), and the errors that are not check failures."""
    statuses: dict[str, dict[str, int]] = {}
    scenarios: dict[str, int] = {}
    errors: list[str] = []
    for line in report.read_text().splitlines() if report.exists() else []:
        doc = json.loads(line)
        if "NonFatalError" in doc:
            e = doc["NonFatalError"]
            msg = f"{e.get('label')}: {e['value'].get('message')}"
            if msg not in errors:
                errors.append(msg)
        event = doc.get("ScenarioFinished")
        if not event:
            continue
        scenarios[event["status"]] = scenarios.get(event["status"], 0) + 1
        recorder = event.get("recorder") or {}
        op = statuses.setdefault(str(recorder.get("label", "?")), {})
        for interaction in (recorder.get("interactions") or {}).values():
            response = interaction.get("response")
            code = str(response["status_code"]) if response else "no response"
            op[code] = op.get(code, 0) + 1
    requests = sum(sum(op.values()) for op in statuses.values())
    return {"requests": requests, "scenarios": scenarios, "errors": errors, "statuses": statuses}


# The served schema must be valid as it is: any schema error fails the test.
KNOWN_SCHEMA_ERRORS: set[str] = set()


@pytest.mark.skipif(ST is None, reason="schemathesis is not installed (pip install -e '.[dev]')")
def test_schemathesis_finds_no_gateway_5xx(make_pair: Callable[..., Pair], tmp_path: Path) -> None:
    a, b, gw = make_pair(env=ENV, flags=("--fake-validate",))
    served = httpx.get(gw.url + "/openapi.json").json()
    enriched = tmp_path / "openapi-with-bodies.json"
    enriched.write_text(json.dumps(_with_bodies(served)))
    for name, location in (("served", gw.url + "/openapi.json"), ("with-bodies", str(enriched))):
        proc, counts = _run(location, gw.url, tmp_path / f"{name}.ndjson")
        print(f"\nschemathesis ({name}): rc={proc.returncode}", json.dumps(counts))
        tail = proc.stdout[-3000:] + proc.stderr[-1000:]
        assert "not_a_gateway_server_error" not in proc.stdout.split("SUMMARY")[-1], tail
        assert counts["scenarios"].get("failure", 0) == 0, tail
        assert set(counts["errors"]) <= KNOWN_SCHEMA_ERRORS, tail
        # It did run. Operations without parameters have only a few distinct cases; the bodies add many.
        assert counts["requests"] >= (100 if name == "served" else 400), counts
        gateway_5xx = {op: c for op, by in counts["statuses"].items() for c in by if c.startswith("5")}
        print("5xx seen (all from replicas, with x-fleet-backend):", gateway_5xx)
        if name == "with-bodies":
            assert proc.returncode == 0, tail
            assert any("200" in by for op, by in counts["statuses"].items() if op.startswith("POST"))
    assert gw.alive() and a.alive() and b.alive()
    assert httpx.get(gw.url + "/health").status_code == 200
    assert gw.all_healthy()
