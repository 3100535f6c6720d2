"""A control for issue 21's TTFT tail: a bare TCP relay (uvloop, one upstream connection per client
connection, bytes copied both ways, nothing parsed). If ``vllm bench serve`` through this shows the
same tail as through the gateway, the tail comes from having a hop at all; if not, from what the
gateway does at the HTTP level.

    python3 bench/gpu/tcp_relay.py --listen 8090 --to 8001
"""

from __future__ import annotations

import argparse
import asyncio

import uvloop


class Pipe(asyncio.Protocol):
    def __init__(self) -> None:
        self.peer: Pipe | None = None
        self.transport: asyncio.Transport | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def main(listen: int, to: int) -> None:
    loop = asyncio.get_running_loop()

    class Client(Pipe):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self.opening = loop.create_task(self._open())

        async def _open(self) -> None:
            _, up = await loop.create_connection(Pipe, "127.0.0.1", to)
            up.peer, self.peer = self, up
            assert self.transport is not None and up.transport is not None
            for data in self.pending:
                up.transport.write(data)
            self.pending.clear()

    server = await loop.create_server(Client, "127.0.0.1", listen, backlog=4096)
    await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", type=int, default=8090)
    ap.add_argument("--to", type=int, default=8001)
    a = ap.parse_args()
    uvloop.run(main(a.listen, a.to))
