"""Readiness polling for the byte-stream loop: ``select.epoll`` driven directly where the
platform has it (Linux), :mod:`selectors` elsewhere.

``selectors`` wraps every ready descriptor in a key object looked up through two mappings, and
the loop turns once per message on a busy round trip; on Linux this module asks ``epoll`` and
hands back what was registered with the descriptor, nothing else. Both forms answer
:meth:`Poller.select` with ``(data, mask)`` pairs, ``mask`` in ``EVENT_READ`` /
``EVENT_WRITE``, with the same rules as ``selectors``: an error or a hang-up reports a
descriptor ready for whatever it was registered for, so the read or write that follows meets
the error.

Not thread-safe: one thread (the one leading the loop) uses a poller at a time.
"""

from __future__ import annotations

import math
import select
import selectors
from typing import Any, Protocol

__all__ = ("EVENT_READ", "EVENT_WRITE", "Poller", "EPOLL")

EVENT_READ = selectors.EVENT_READ
EVENT_WRITE = selectors.EVENT_WRITE
EPOLL = hasattr(select, "epoll")


class _FileLike(Protocol):
    def fileno(self) -> int: ...


_EPOLLIN = getattr(select, "EPOLLIN", 0)
_EPOLLOUT = getattr(select, "EPOLLOUT", 0)
_NOT_IN = ~_EPOLLIN
_NOT_OUT = ~_EPOLLOUT


class Poller:
    """Which registered sockets are ready: ``register(sock, events, data)``, ``modify``,
    ``unregister``, ``select(timeout) -> [(data, mask), ...]``, ``close()``.

    ``epoll=False`` uses :mod:`selectors` even where epoll exists (the tests run both)."""

    def __init__(self, epoll: bool = EPOLL) -> None:
        # fd -> (data, events): what select() hands back, and which events were asked for
        self._registered: dict[int, tuple[Any, int]] = {}
        if epoll:
            self._epoll: Any = select.epoll()
            self._selector: selectors.BaseSelector | None = None
        else:
            self._epoll = None
            self._selector = selectors.DefaultSelector()

    def __len__(self) -> int:
        return len(self._registered)

    @staticmethod
    def _epoll_events(events: int) -> int:
        return (_EPOLLIN if events & EVENT_READ else 0) | (_EPOLLOUT if events & EVENT_WRITE
                                                           else 0)

    def register(self, sock: _FileLike, events: int, data: Any) -> None:
        fd = sock.fileno()
        if fd in self._registered:
            raise KeyError(f"{sock!r} (fd {fd}) is already registered")
        if self._selector is not None:
            self._selector.register(sock, events, data)
        else:
            self._epoll.register(fd, self._epoll_events(events))
        self._registered[fd] = (data, events)

    def modify(self, sock: _FileLike, events: int, data: Any) -> None:
        fd = sock.fileno()
        if fd not in self._registered:
            raise KeyError(f"{sock!r} (fd {fd}) is not registered")
        if self._selector is not None:
            self._selector.modify(sock, events, data)
        else:
            self._epoll.modify(fd, self._epoll_events(events))
        self._registered[fd] = (data, events)

    def unregister(self, sock: _FileLike) -> None:
        """Forget ``sock``: call it before the socket closes (its number may be reused)."""
        fd = sock.fileno()
        if self._registered.pop(fd, None) is None:
            raise KeyError(f"{sock!r} (fd {fd}) is not registered")
        if self._selector is not None:
            self._selector.unregister(sock)
        else:
            try:
                self._epoll.unregister(fd)
            except OSError:  # closed already: the kernel dropped it from the set itself
                pass

    def select(self, timeout: float | None) -> list[tuple[Any, int]]:
        """Wait up to ``timeout`` seconds (None: without limit) for a registered socket to be
        ready; ``(data, mask)`` for each that is, in no particular order."""
        if self._selector is not None:
            return [(key.data, mask) for key, mask in self._selector.select(timeout)]
        if timeout is None:
            timeout = -1
        elif timeout <= 0:
            timeout = 0
        else:
            # Round up to whole milliseconds (epoll's unit): rounding down would return
            # before the deadline and spin the loop for the rest of it.
            timeout = math.ceil(timeout * 1e3) * 1e-3
        registered = self._registered
        ready = []
        for fd, event in self._epoll.poll(timeout, len(registered) or 1):
            entry = registered.get(fd)
            if entry is None:
                continue
            data, events = entry
            mask = ((EVENT_WRITE if event & _NOT_IN else 0)
                    | (EVENT_READ if event & _NOT_OUT else 0)) & events
            if mask:
                ready.append((data, mask))
        return ready

    def close(self) -> None:
        self._registered.clear()
        if self._selector is not None:
            self._selector.close()
        else:
            self._epoll.close()
