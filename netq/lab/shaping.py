"""How :class:`netq.lab.relay.Relay` shapes each direction of a link: a :class:`Shape`.

* **rate** (bytes/s, or None: unlimited): the bottleneck. Each chunk read is given a departure
  time ``max(now, previous departure) + size / rate``, i.e. a token bucket with no burst: the
  bytes leave no faster than the cap, whatever arrives.
* **delay** (s, one way) and **jitter** (s, uniform 0..jitter added per chunk): propagation.
  A chunk is released to the other side at ``departure + delay + jitter``; order is kept.
  Chunks wait in a per-direction queue stamped with their due time, so a long delay does not
  slow the relay down: everything in flight waits at once, as on a real long fat pipe.
* **buffer** (bytes): the most a direction holds (in flight + queued behind the bottleneck).
  Past it the relay stops reading that side, and backpressure flows back through the kernel
  as on a real link, instead of the relay buffering without bound. The default is the
  bandwidth-delay product plus 1 MiB when a rate is set (so the relay never limits a link
  below its rate), else 4 MiB.

The relay applies a shape chunk by chunk as it reads (:attr:`Shape.chunk` bytes per read, about
1 ms of the rate); this module holds only the numbers and what follows from them.
"""

from __future__ import annotations

import dataclasses

__all__ = ("Shape", "CHUNK", "MIN_CHUNK", "DEFAULT_BUFFER", "QUEUE")

CHUNK = 256 * 1024  # most bytes per recv()
MIN_CHUNK = 8 * 1024  # least bytes per recv() on a rate-capped direction
DEFAULT_BUFFER = 4 * 1024 * 1024  # per direction, without a rate cap
QUEUE = 1024 * 1024  # per direction, on top of the bandwidth-delay product


@dataclasses.dataclass(frozen=True)
class Shape:
    """How one direction of a link behaves: see the module docstring."""

    delay: float = 0.0
    jitter: float = 0.0
    rate: float | None = None
    buffer: int | None = None  # None: the bandwidth-delay product + 1 MiB, or 4 MiB uncapped

    def __post_init__(self) -> None:
        if self.delay < 0 or self.jitter < 0:
            raise ValueError("delay and jitter >= 0")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("rate > 0 (or None: unlimited)")
        if self.buffer is not None and self.buffer <= 0:
            raise ValueError("buffer > 0")

    @property
    def limit(self) -> int:
        """Bytes a direction may hold before the relay stops reading its source."""
        if self.buffer is not None:
            return self.buffer
        if self.rate is None:
            return DEFAULT_BUFFER
        return int(self.rate * (self.delay + self.jitter)) + QUEUE

    @property
    def chunk(self) -> int:
        """Bytes per recv(): about 1 ms of the rate, so a burst is not released as one lump."""
        if self.rate is None:
            return CHUNK
        return int(max(MIN_CHUNK, min(CHUNK, self.rate / 1000)))
