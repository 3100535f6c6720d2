"""An OpenAI-shaped probe server that reports the GPUs it can see, for checking GPU isolation.

The supervisor starts it as an instance's ``vllm_command`` (vLLM's flags are accepted and
ignored). It allocates ``--probe-mib`` on every visible GPU so that ``nvidia-smi
--query-compute-apps`` shows which physical GPU each instance's process sits on, and answers
chat completions with a JSON report: CUDA_VISIBLE_DEVICES and, per visible device, torch's
index, name and UUID.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from aiohttp import web


def _report(models: list[str]) -> dict[str, Any]:
    import torch

    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": p.name, "uuid": f"GPU-{p.uuid}", "total_mib": p.total_memory >> 20})
    return {"pid": os.getpid(), "models": models, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device_count": len(devices), "devices": devices}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="probe")
    ap.add_argument("--served-model-name", nargs="+", default=None)
    ap.add_argument("--probe-mib", type=int, default=1024)
    args, _ = ap.parse_known_args(argv)
    models = args.served_model_name or [args.model]

    import torch

    # Hold memory on each visible GPU: it makes the process show up in nvidia-smi on that GPU.
    held = [torch.empty(args.probe_mib << 20, dtype=torch.uint8, device=f"cuda:{i}")
            for i in range(torch.cuda.device_count())]
    report = _report(models)
    print("probe", json.dumps(report), flush=True)

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200 if held is not None else 503)

    async def list_models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model", "owned_by": "probe"}
                                                             for m in models]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({
            "id": "probe", "object": "chat.completion", "created": int(time.time()), "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": json.dumps(report)}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main(sys.argv[1:])
