"""Processes sharing one listening socket, as vLLM's API servers do (``--api-server-count``):
``python shared_listener.py GATE_DIR N`` listens on a free loopback port, prints it, and forks N
children that accept on it (blocking ``accept``) and hold what they accept, reading nothing. Child
``i`` starts accepting only once ``GATE_DIR/i`` exists, so a test decides which of them take the
connections it opens. The parent keeps the socket and accepts nothing, as vLLM's launcher does."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time


def child(sock: socket.socket, gate: str) -> None:
    while not os.path.exists(gate):
        time.sleep(0.01)
    held = []
    while True:
        conn, _ = sock.accept()
        held.append(conn)  # kept open: the test's pool treats it as an idle keep-alive connection


def main(gate_dir: str, n: int) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    kids = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            child(sock, os.path.join(gate_dir, str(i)))
            os._exit(0)
        kids.append(pid)
    print(sock.getsockname()[1], *kids, flush=True)

    def stop(*_: object) -> None:
        for pid in kids:
            os.kill(pid, signal.SIGKILL)
        for pid in kids:
            os.waitpid(pid, 0)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        signal.pause()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
