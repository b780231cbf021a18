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
import os
import select
import selectors
import socket
from typing import Any, Protocol

__all__ = ("EVENT_READ", "EVENT_WRITE", "EPOLL_READABLE_BITS", "EPOLL_WRITABLE_BITS", "Poller",
           "EPOLL", "WakeUp")

EVENT_READ = selectors.EVENT_READ
EVENT_WRITE = selectors.EVENT_WRITE
EPOLL = hasattr(select, "epoll")


class _FileLike(Protocol):
    def fileno(self) -> int: ...


_EPOLLIN = getattr(select, "EPOLLIN", 0)
_EPOLLOUT = getattr(select, "EPOLLOUT", 0)
_NOT_IN = ~_EPOLLIN
_NOT_OUT = ~_EPOLLOUT
# An epoll event with any of these bits makes a descriptor count as writable / readable (an
# error or a hang-up reports it ready for whatever it was registered for), for a loop that
# reads Poller.epoll itself (see Poller.epoll).
EPOLL_WRITABLE_BITS = _NOT_IN
EPOLL_READABLE_BITS = _NOT_OUT


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
        # For a loop that polls once per message and reads the answer itself (the socket
        # carrier's wait, which would otherwise pay a Python call per turn for select()):
        # the epoll set (None under selectors) and what each descriptor was registered with.
        # Read only: register/modify/unregister keep them.
        self.epoll: Any = self._epoll
        self.registered = self._registered

    def __len__(self) -> int:
        return len(self._registered)

    def fileno(self) -> int | None:
        """The epoll set's descriptor (readable while a registered socket is ready, so that
        another poller can watch this one); None under :mod:`selectors`."""
        return None if self._epoll is None else self._epoll.fileno()

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


class WakeUp:
    """A descriptor a poller watches so that another thread can end its wait: ``signal()``
    from any thread makes it readable until the waiting thread calls ``drain()``.

    An ``eventfd`` where the platform has one (Linux: one descriptor, made and signalled by
    one cheap system call each, which counts where a process opens a thousand communicators);
    a non-blocking socket pair elsewhere (or with ``eventfd=False``: the tests run both)."""

    def __init__(self, eventfd: bool = hasattr(os, "eventfd")) -> None:
        self._event: int | None = None
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None
        if eventfd:
            self._event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:
            self._reader, self._writer = socket.socketpair()
            self._reader.setblocking(False)
            self._writer.setblocking(False)

    def fileno(self) -> int:
        if self._event is not None:
            return self._event
        assert self._reader is not None
        return self._reader.fileno()

    def signal(self) -> None:
        """Any thread: make the descriptor readable (a no-op once closed)."""
        try:
            event = self._event  # read once: close() may set it to -1 meanwhile
            if event is not None:
                if event >= 0:
                    os.eventfd_write(event, 1)
            elif self._writer is not None:
                self._writer.send(b"\0")
        except (BlockingIOError, OSError):  # full (already signalled) or closed
            pass

    def drain(self) -> None:
        """The waiting thread: take every signal so far; the descriptor is not readable now."""
        try:
            event = self._event
            if event is not None:
                if event >= 0:
                    os.eventfd_read(event)
            elif self._reader is not None:
                while self._reader.recv(4096):
                    pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        if self._event is not None and self._event >= 0:
            # -1 first: a later signal() or drain() does nothing, never touching a reused number
            event, self._event = self._event, -1
            os.close(event)
        for sock in (self._reader, self._writer):
            if sock is not None:
                sock.close()
