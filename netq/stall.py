"""When to warn about a wait: the stall timer, one per ongoing wait.

A wait that lasts ``stall_warning`` seconds without progress is warned about, then again every
:data:`REPEAT_WARNING` seconds while it lasts. :class:`StallWarning` keeps that schedule and
nothing else: whoever waits (a ``put()`` waiting for send budget in
:meth:`netq.session.PeerSession.wait_for_space`, ``get()`` and ``close()`` in the
communicator, the receive budget in :mod:`netq.credit`, a client's attempts to reach its
server in :class:`netq.diagnostics.Reachability`) asks it whether a warning is due, and says
what it waits for in its own words (:mod:`netq.diagnostics` words most of them).

It sits below every one of them and imports nothing of netq: a timer knows times, not
sessions.
"""

from __future__ import annotations

__all__ = ("REPEAT_WARNING", "StallWarning")

REPEAT_WARNING = 30.0  # seconds between repeated warnings about the same ongoing wait


class StallWarning:
    """When to warn about one ongoing wait: once it has lasted ``stall_warning`` seconds
    without progress, then every ``repeat`` seconds while it lasts."""

    __slots__ = ("stall_warning", "repeat", "since", "warned_at", "summarized")

    def __init__(self, stall_warning: float, since: float,
                 repeat: float = REPEAT_WARNING) -> None:
        self.stall_warning = stall_warning
        self.repeat = repeat
        self.since = since  # when the wait (or its last progress) began
        self.warned_at: float | None = None  # when we last warned about it
        self.summarized = False  # its last warning went into a summary of many (no own line)

    def progress(self, now: float) -> None:
        """Something moved: the stall clock starts again (the repeat clock does not)."""
        self.since = now

    def due(self, now: float) -> bool:
        """True when a warning is due now; the caller logs it (it counts as given)."""
        if now - self.since < self.stall_warning:
            return False
        if self.warned_at is not None and now - self.warned_at < self.repeat:
            return False
        self.warned_at = now
        return True

    def defer(self, now: float, seconds: float) -> None:
        """The warning due now was not given: due again ``seconds`` from ``now``."""
        self.warned_at = now - self.repeat + seconds

    def next_due(self, now: float) -> float:
        """Seconds until a warning is next due (the first, or the next repeat)."""
        if self.warned_at is None:
            return max(self.stall_warning - (now - self.since), 0.0)
        return max(self.warned_at + self.repeat - now, 0.0)

    def until_due(self, now: float) -> float:
        """Seconds until the first warning could be due (0 once the stall is long enough)."""
        return max(self.stall_warning - (now - self.since), 0.0)

    @property
    def warned(self) -> bool:
        return self.warned_at is not None
