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
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

__all__ = ("NativeHeap", "TRIM_AFTER", "TRIM_INTERVAL", "TRIM_AVAILABLE")

TRIM_AFTER = 64 * 1024 * 1024  # bytes moved through native buffers between two trims
TRIM_INTERVAL = 1.0  # seconds between two trims, at least


def _find_malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on
    except (OSError, AttributeError):
        return None
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _find_malloc_trim()
TRIM_AVAILABLE = _MALLOC_TRIM is not None


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
