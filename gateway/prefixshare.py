"""The prefix index of prefix-aware routing, shared by the gateway's workers (``--workers N``).

With one index per worker, a prefix (a system prompt that many conversations share) was learned
once in every worker, and each worker could send it first to a different replica: up to N cold
copies of its KV cache. One table that every worker maps instead: what any worker sent where,
every worker knows.

The file (in the workers' private directory, beside the shared counts) is two int64 arrays of
``slots`` cells (a power of two), direct-mapped: a block's key (its chained hash,
prefix.block_hashes, salted with the model; 0 = empty) goes to cell ``key % slots`` of the first
array, and the cell of the same
index in the second holds up to ``HOLDERS`` replicas that were sent that prefix, the most recent
first. A holder is 21 bits: the backend's column in the shared counts (shared.py, 10 bits) and the
generation of its cache when it was recorded (11 bits). A new key in a taken cell replaces the old
one: the newest wins, where a worker's own index drops its least recently used.

The keys are the same in every worker because the parent gives the workers one PYTHONHASHSEED
(workers.py): ``block_hashes`` uses Python's str hash, cheap, but seeded per process otherwise.

No lock. A writer clears the key, writes the holders, then the key; a reader reads the key, the
holders and the key again, and takes the holders only if both reads are the key it looks for. Two
workers writing one cell at the same moment can still leave one block's holders under the other's
key. Such a wrong hint costs a cache miss at worst, and bounded loads (routing.py) keep it from
overloading a replica.

A backend that leaves rotation may have lost its cache: ``forget`` bumps its generation, and holders
recorded under an older one no longer count, in every worker. The generation is the largest of the
workers' cells in the counts' ``FORGOTTEN`` plane; a worker bumps it by writing that plus one in its
own row. So a replacement worker's zeroed row does not lower it, and no worker's bump is lost; each
worker that sees the same move bumps once, which forgets at most what was recorded in between.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Sequence

from gateway.backend import Backend
from gateway.prefix import stable_hash
from gateway.shared import FORGOTTEN, SharedCounts, column_of

FILE_NAME = "prefixes.bin"
HOLDERS = 3
_BITS = 21
_COL_BITS = 10  # shared.COLUMNS is 1,024
_ENTRY = (1 << _BITS) - 1
_COL = (1 << _COL_BITS) - 1
_GEN = (1 << (_BITS - _COL_BITS)) - 1
_U64 = (1 << 64) - 1


def slots_for(blocks: int) -> int:
    """The table's cells for an index of ``blocks`` (FLEET_PREFIX_INDEX_BLOCKS): the next power of two."""
    return 1 << max(blocks - 1, 1).bit_length()


def create(directory: str, slots: int) -> str:
    path = os.path.join(directory, FILE_NAME)
    with open(path, "wb") as f:
        f.truncate(16 * slots)
    return path


class PrefixTable:
    """This worker's map of the file; the generations live in the shared counts."""

    def __init__(self, path: str, slots: int, shared: SharedCounts) -> None:
        self.slots = slots
        self.shared = shared
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, 16 * slots)
        view = memoryview(self._map)
        self.keys = view[: 8 * slots].cast("Q")
        self.holders = view[8 * slots:].cast("q")

    def index(self, model: str) -> SharedPrefixIndex:
        return SharedPrefixIndex(self, stable_hash(model))

    def generation(self, col: int) -> int:
        return self.shared.largest(col, FORGOTTEN) & _GEN

    def forget(self, col: int) -> None:
        self.shared.set(col, self.shared.largest(col, FORGOTTEN) + 1, FORGOTTEN)

    def filled(self) -> int:
        return self.slots - self.keys.tolist().count(0)

    def close(self) -> None:
        self.keys.release()
        self.holders.release()
        self._map.close()
        os.close(self._fd)


class SharedPrefixIndex:
    """prefix.PrefixIndex's interface over the shared table, for one model (its salt)."""

    def __init__(self, table: PrefixTable, salt: int) -> None:
        self.table = table
        self._salt = salt

    def __len__(self) -> int:
        return self.table.filled()  # every model's blocks: one table

    def deepest(self, hashes: Sequence[int], usable: Sequence[Backend]) -> tuple[int, list[Backend]]:
        t = self.table
        by_col = {}
        for b in usable:
            col = column_of(t.shared, b)
            if col is not None:
                by_col[col] = (b, t.generation(col))
        if not by_col:
            return 0, []
        # The key arithmetic inline, locals only: this loop runs once per block of a prompt.
        keys, holders, mask, salt, u64 = t.keys, t.holders, t.slots - 1, self._salt, _U64
        for depth in range(len(hashes), 0, -1):
            key = (hashes[depth - 1] ^ salt) & u64 or 1
            i = key & mask
            if keys[i] != key:
                continue
            packed = holders[i]
            if keys[i] != key:
                continue
            found: list[Backend] = []
            for j in range(HOLDERS):
                e = (packed >> (_BITS * j)) & _ENTRY
                if not e:
                    break
                hit = by_col.get(e & _COL)
                if hit is not None and hit[1] == e >> _COL_BITS and hit[0] not in found:
                    found.append(hit[0])
            if found:
                return depth, found
        return 0, []

    def record(self, hashes: Iterable[int], b: Backend) -> None:
        t = self.table
        col = column_of(t.shared, b)
        if col is None:
            return  # no column (over 1,023 names): this backend's prefixes go unshared
        entry = col | t.generation(col) << _COL_BITS
        keys, holders, mask, salt, u64, first = t.keys, t.holders, t.slots - 1, self._salt, _U64, _ENTRY
        for h in hashes:
            key = (h ^ salt) & u64 or 1
            i = key & mask
            if keys[i] == key:
                old = holders[i]
                if old & first == entry:
                    continue  # the common case: the same prefix to the same replica again
                new, n = entry, 1
                for j in range(HOLDERS):
                    e = (old >> (_BITS * j)) & _ENTRY
                    if e and e & _COL != col and n < HOLDERS:
                        new |= e << (_BITS * n)
                        n += 1
                holders[i] = new
            else:
                keys[i] = 0
                holders[i] = entry
                keys[i] = key

    def forget(self, b: Backend) -> None:
        col = column_of(self.table.shared, b)
        if col is not None:
            self.table.forget(col)
