"""Hand freed native memory back to the OS where the C allocator keeps it (glibc).

The gRPC transport's bytes pass through gRPC's core as native buffers, allocated and freed on
gRPC's threads and ours. glibc serves them from per-thread arenas, and once a block of several
MiB has been freed (a 16 MiB message, say) it raises its mmap threshold to that size: from then
on every buffer below it comes from an arena too, and what is freed there stays in the process
(up to twice the threshold per arena before glibc trims on its own, plus any free pages between
live blocks). Under a steady mix of large and small messages a gRPC process's RSS then climbs
far past what it holds, though no Python object accumulates.

:class:`NativeHeap` asks glibc to return the free pages of every arena (``malloc_trim(0)``) once
enough bytes have passed through since the last time, and at most once per
:data:`TRIM_INTERVAL`. This is an action, not a setting: the allocator's tuning (and the user's
program) is left as it is. Where there is no ``malloc_trim`` (musl, macOS, Windows) it does
nothing.

The other side of that threshold: until a block larger than a transport's buffers has been
freed, glibc maps every block from its threshold up (128 KiB at first, then the size of the
largest mapped block freed) with ``mmap`` and unmaps it when freed, so each one is faulted in
all over again: a stream of 1 MiB packets (gRPC's read buffers, the packets' ``bytes``) pays
for every page of every packet, where a program that once freed a larger block reuses them.
:func:`expect_blocks` frees one block of the size a transport works with, which is what raises
glibc's threshold (to that size, and its own trimming to twice it): the same action as the
program's own first large free, once per process; :class:`NativeHeap`'s trims keep returning
what is freed.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

__all__ = ("NativeHeap", "TRIM_AFTER", "TRIM_INTERVAL", "TRIM_AVAILABLE", "expect_blocks")

TRIM_AFTER = 64 * 1024 * 1024  # bytes moved through native buffers between two trims
TRIM_INTERVAL = 1.0  # seconds between two trims, at least


def _find_glibc() -> ctypes.CDLL | None:
    """The C library the interpreter runs on, if it is one with ``malloc_trim`` (glibc), its
    ``malloc_trim``, ``malloc`` and ``free`` declared."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    return libc


_GLIBC = _find_glibc()
_MALLOC_TRIM: Callable[[int], int] | None = _GLIBC.malloc_trim if _GLIBC is not None else None
TRIM_AVAILABLE = _MALLOC_TRIM is not None
_expected = 0  # the largest block expect_blocks() freed in this process


def expect_blocks(nbytes: int) -> bool:
    """Allocate and free one block of ``nbytes`` bytes (glibc only; once per size, only
    upward): glibc then serves blocks below it from its arenas and reuses them, as after the
    program's own free of such a block. True when it did."""
    global _expected
    if _GLIBC is None or nbytes <= _expected:
        return False
    _expected = nbytes
    _GLIBC.free(_GLIBC.malloc(nbytes))  # untouched: a map made and unmade, no page faulted
    return True


class NativeHeap:
    """Counts the bytes one transport moved through native buffers and trims when due.

    Used by one thread (the transport's I/O thread): :meth:`moved` per packet, and
    :meth:`trim_if_due` between turns of its loop.
    """

    __slots__ = ("_moved", "_next_at", "trims")

    def __init__(self) -> None:
        self._moved = 0
        self._next_at = 0.0
        self.trims = 0  # how often glibc was asked (for tests and diagnostics)

    def moved(self, nbytes: int) -> None:
        self._moved += nbytes

    def trim_if_due(self, now: float) -> bool:
        """Trim (True) once :data:`TRIM_AFTER` bytes have moved and the interval has passed."""
        if self._moved < TRIM_AFTER or now < self._next_at or _MALLOC_TRIM is None:
            return False
        self._moved = 0
        self._next_at = now + TRIM_INTERVAL
        _MALLOC_TRIM(0)
        self.trims += 1
        return True
