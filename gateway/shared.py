"""What the gateway's workers (``--workers N``) share: in-flight and queued counts, so that the
limits and the queue are the gateway's and not a worker's; passive ejection, so that a failing
backend leaves every worker's rotation after ``eject_failures`` failed requests in the gateway, not
in each worker; and the probes' verdicts, so that a backend one worker's probes take out of (or
put back in) rotation leaves (or rejoins) every worker's.

Without them each worker held 1/N of every limit: with 4 workers behind vLLM's 256 sequences, a
worker that the kernel handed more than 64 connections queued requests while the others had room
(146 and 552 of 1,536 requests queued at 512 concurrent on an H200, issue 21). A divided queue
likewise answered 429 in a worker handed more waiters than its share while the others' places
were free (CI, 16 requests against a limit of 8 and a queue of 16 over 4 workers).

One file in the workers' private directory, mapped by every worker: planes of int64 cells (one per
kind of count: ``IN_FLIGHT``, ``FAILURES``, ``EJECTED_UNTIL``, ``QUEUED``, ``PROBED``,
``FORGOTTEN``, ``OLDEST``, ``TURNS``), each a row per worker and a column per name (a backend's;
for ``QUEUED``, ``OLDEST`` and ``TURNS`` a model's; column 0 of ``IN_FLIGHT``: the worker's
requests in flight, for ``max_in_flight``). A worker writes only its own row, so the hot path
takes no lock; a reader sums (or takes the largest of) a column over the rows. Two workers that
look at the same moment may both take a backend's last slot (or a queue's last place), so a limit
can be passed by at most N-1, the bound the divided limits had.

A worker takes a row at start-up under ``flock``: a free one, or one whose worker is dead (uvicorn
replaced it); it zeroes the row, since a dead worker's requests died with it. Names get their
column the same way, the first time any worker asks, and keep it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import mmap
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

COLUMNS = 1024  # column 0 and up to 1,023 backend and model names over the gateway's life
NAME_BYTES = 128
GATEWAY = 0  # the column of each worker's requests in flight
FILE_NAME = "inflight.bin"
# The planes: what one cell of a (worker, backend) pair counts.
IN_FLIGHT = 0  # requests open to the backend
FAILURES = 1  # failed requests in a row (ejection.py)
EJECTED_UNTIL = 2  # the end of the backend's ejection, wall-clock milliseconds; 0 none
QUEUED = 3  # requests waiting in a model's queue (the column of the model's name; limiter.py)
PROBED = 4  # the last move this worker's own probes made: wall-clock µs × 4 + the new state (health.py)
FORGOTTEN = 5  # the generation of the backend's cache, as this worker last set it (prefixshare.py)
OLDEST = 6  # when this worker's oldest waiter for a model queued, monotonic ns; 0 none (limiter.py)
TURNS = 7  # the turns this worker has taken in a model's rotation (routing.py)
PLANES = 8
SYNC_S = 0.1  # how often a worker looks for what the others published (ejections, probe verdicts)


def file_size(rows: int) -> int:
    # pids (one per row), then the names, then the cells
    return 8 * rows + NAME_BYTES * COLUMNS + 8 * PLANES * rows * COLUMNS


def create(directory: str, rows: int) -> str:
    """The zeroed file for ``rows`` workers; the parent calls this before spawning them."""
    path = os.path.join(directory, FILE_NAME)
    with open(path, "wb") as f:
        f.truncate(file_size(rows))
    return path


class _Keyed(Protocol):
    name: str
    shared_column: int  # -1: not asked yet; 0: no column


def column_of(shared: SharedCounts | None, b: _Keyed) -> int | None:
    """``b``'s column in the table, asked once and kept on ``b``; None without a table or a column."""
    if shared is None:
        return None
    if b.shared_column < 0:
        col = shared.column(b.name)
        b.shared_column = 0 if col is None else col
    return b.shared_column or None


def publish(shared: SharedCounts | None, b: _Keyed, value: int, plane: int = IN_FLIGHT) -> None:
    """This worker's ``value`` for ``b`` in ``plane``, where there is a table with a column for it."""
    col = column_of(shared, b)
    if col is not None and shared is not None:
        shared.set(col, value, plane)


def gateway_total(shared: SharedCounts | None, b: _Keyed, own: int, plane: int = IN_FLIGHT) -> int:
    """``b``'s cells in ``plane`` summed over every worker; ``own``, this worker's value, where
    there is no table or no column for it."""
    col = column_of(shared, b)
    return own if col is None or shared is None else shared.total(col, plane)


class _Counted(_Keyed, Protocol):
    in_flight: int  # this worker's requests open to it


def in_flight_counter(shared: SharedCounts | None) -> Callable[[_Counted], int]:
    """How many requests the whole gateway has open to a backend: the sum over the workers where
    there is a table, this worker's own count where there is none (one worker, the fast path)."""
    if shared is None:
        return _own_in_flight
    return lambda b: gateway_total(shared, b, b.in_flight)


def _own_in_flight(b: _Counted) -> int:
    return b.in_flight


def turn_counter(shared: SharedCounts | None, model: str) -> Callable[[], int] | None:
    """The next turn in ``model``'s rotation for the whole gateway: the turns every worker has
    taken, added up, so that N workers go round the replicas as one (each worker going round on
    its own sent its first request of a burst to the same replica). Two workers taking a turn at
    the same moment may get the same one. None without a table or a column (the router counts)."""
    col = None if shared is None else shared.column(model)
    if col is None or shared is None:
        return None
    mine = itertools.count(1)

    def turn() -> int:
        shared.set(col, next(mine), TURNS)
        return shared.total(col, TURNS) - 1

    return turn


class Follower:
    """Calls ``look`` every ``SYNC_S`` in a task of its own between ``start`` and ``stop``: how a
    worker follows what the other workers publish (ejection.py, health.py)."""

    def __init__(self, look: Callable[[], None], name: str) -> None:
        self._look = look
        self._name = name
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            self._look()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SharedCounts:
    """This worker's view of the file: its own row to write, every row to read."""

    def __init__(self, path: str, rows: int, pid: int | None = None) -> None:
        self.rows = rows
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, file_size(rows))
        view = memoryview(self._map)
        self._pids = view[: 8 * rows].cast("q")
        self._names = view[8 * rows: 8 * rows + NAME_BYTES * COLUMNS]
        self._cells = view[8 * rows + NAME_BYTES * COLUMNS:].cast("q")
        self._columns: dict[str, int] = {}
        self._plane = rows * COLUMNS
        self.row = self._claim(os.getpid() if pid is None else pid)
        self._base = self.row * COLUMNS

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _claim(self, pid: int) -> int:
        with self._locked():
            free = [r for r in range(self.rows) if self._pids[r] == 0]
            dead = [r for r in range(self.rows) if self._pids[r] and not _alive(self._pids[r])]
            if not free and not dead:
                raise RuntimeError(f"every one of the {self.rows} worker rows is held by a live process")
            row = (dead or free)[0]
            self._zero(row)
            self._pids[row] = pid
            return row

    def column(self, name: str) -> int | None:
        """The column of ``name`` (the same in every worker), or None when the table is full or the
        name too long (the caller then counts that backend or model in this worker alone)."""
        col = self._columns.get(name)
        if col is not None:
            return col
        raw = name.encode()
        if len(raw) >= NAME_BYTES:
            return None
        with self._locked():
            for c in range(1, COLUMNS):
                slot = self._names[c * NAME_BYTES: (c + 1) * NAME_BYTES]
                stored = bytes(slot).rstrip(b"\0")
                if stored == raw:
                    break
                if not stored:
                    slot[: len(raw)] = raw
                    break
            else:
                return None
        self._columns[name] = c
        return c

    def _zero(self, row: int) -> None:
        for p in range(PLANES):
            start = p * self._plane + row * COLUMNS
            self._cells[start: start + COLUMNS] = memoryview(bytes(8 * COLUMNS)).cast("q")

    def set(self, col: int, value: int, plane: int = IN_FLIGHT) -> None:
        """This worker's count in column ``col``."""
        self._cells[plane * self._plane + self._base + col] = value

    def _column_cells(self, col: int, plane: int) -> memoryview:
        start = plane * self._plane + col
        return self._cells[start: start + self._plane: COLUMNS]

    def total(self, col: int, plane: int = IN_FLIGHT) -> int:
        """Every worker's count in column ``col``, added up."""
        return sum(self._column_cells(col, plane))

    def largest(self, col: int, plane: int) -> int:
        """The largest of the workers' values in column ``col``."""
        return max(self._column_cells(col, plane))

    def smallest_of_others(self, col: int, plane: int) -> int:
        """The smallest value other than 0 that another live worker holds in column ``col``; 0 if
        none (a dead worker's row keeps its values until uvicorn's replacement takes it over)."""
        cells = self._column_cells(col, plane)
        return min((v for r, v in enumerate(cells) if v and r != self.row and _alive(self._pids[r])), default=0)

    def close(self) -> None:
        """Give the row back (a clean shutdown; a crash leaves it to the next worker's claim)."""
        with self._locked():
            self._zero(self.row)
            self._pids[self.row] = 0
        self._pids.release()
        self._names.release()
        self._cells.release()
        self._map.close()
        os.close(self._fd)
