"""gateway/coalesce.py: a response head and the body written in the same loop step leave in one
write; a head alone leaves at the next loop turn; nothing ever changes order."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.coalesce import _HoldHead


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0


def _hold() -> tuple[_HoldHead, Recorder]:
    rec = Recorder()
    t: Any = rec
    return _HoldHead(t, asyncio.get_running_loop()), rec


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


async def test_head_and_body_in_one_step_are_one_write() -> None:
    hold, rec = _hold()
    hold.write(HEAD)
    hold.write(b"{}")
    assert rec.writes == [HEAD + b"{}"]
    await asyncio.sleep(0)
    assert rec.writes == [HEAD + b"{}"]  # the cancelled flush writes nothing more


async def test_a_head_alone_goes_out_at_the_next_loop_turn() -> None:
    hold, rec = _hold()
    hold.write(HEAD)
    assert rec.writes == []
    await asyncio.sleep(0)
    assert rec.writes == [HEAD]
    hold.write(b"chunk")  # a body chunk later is written as it comes
    assert rec.writes == [HEAD, b"chunk"]


async def test_close_writes_a_held_head_first_and_abort_drops_it() -> None:
    hold, rec = _hold()
    hold.write(HEAD)
    hold.close()
    assert rec.writes == [HEAD] and rec.closed
    hold2, rec2 = _hold()
    hold2.write(HEAD)
    hold2.abort()
    await asyncio.sleep(0)
    assert rec2.writes == [] and rec2.aborted


async def test_other_writes_pass_straight_through_and_the_rest_is_delegated() -> None:
    hold, rec = _hold()
    hold.write(b"5\r\nhello\r\n")
    assert rec.writes == [b"5\r\nhello\r\n"]
    assert hold.get_write_buffer_size() == 0
