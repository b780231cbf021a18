"""One I/O thread for many client loops of a process. Engine side.

A communicator's loop (:class:`netq.loop.IOLoop`) runs on a thread of its own, except a
client's, from the ``OWN_THREADS``-th client of a process on (``ConnectionOptions.io_thread``
``"auto"``; ``"shared"`` always, ``"own"`` never): a fleet simulated in one process, or a
thousand devices' worth of clients, then runs one I/O thread, not a thousand that contend for
one interpreter lock and cost a kernel context switch each time one of them wakes.

How one thread serves many loops: each member's carrier has a poller descriptor that is
readable whenever its wait would report something (``CarrierInfo.poll_fd``: an epoll set is
itself pollable); the shared thread watches all of them in one epoll set of its own and keeps
each member's next timer in a heap. A member whose descriptor is ready, or whose timer is
due, gets one turn (:meth:`SharedMember.turn`: the loop's usual turn with a wait of 0), which
says when it wants the next. The thread starts with its first member and ends with its last.

What the members share is the thread: a done-callback or a ``get()`` wait that blocks on it
holds up every shared client of the process (callbacks should be quick on any I/O thread).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import select
import threading
import time
from typing import Protocol

__all__ = ("OWN_THREADS", "SharedIOThread", "SharedMember", "can_share", "client_thread",
           "own_thread_ended")

OWN_THREADS = 8  # client loops of a process that get a thread of their own under "auto"
LOGGER = logging.getLogger("netq")
_COMPACT_SLACK = 64  # stale heap entries tolerated beyond two per member before a rebuild


class SharedMember(Protocol):
    """What the shared thread needs of a loop (:class:`netq.loop.IOLoop`)."""

    poll_fd: int  # readable whenever the loop's carrier has something to report

    def begin(self) -> None:
        """Its first turn: the loop takes this thread as its own (a client starts to connect)."""

    def turn(self) -> float | None:
        """One turn; seconds until it wants the next (0: at once), or None once it has ended."""

    def end(self, error: BaseException | None) -> None:
        """It has ended (``error``: why its turn raised): shut down, tell the engine."""


class SharedIOThread:
    """The I/O thread a process's shared client loops run on (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._joining: list[SharedMember] = []
        self._members: dict[int, SharedMember] = {}  # poll_fd -> member
        self._thread: threading.Thread | None = None
        self._epoll: select.epoll | None = None
        self._wake_fd = -1
        self.ident: int | None = None  # the thread's ident while it runs

    def __len__(self) -> int:
        with self._lock:
            return len(self._members) + len(self._joining)

    def add(self, member: SharedMember) -> None:
        """Run ``member`` on the shared thread (starting the thread if it is not running)."""
        with self._lock:
            self._joining.append(member)
            if self._thread is None:
                self._epoll = select.epoll()
                self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                self._epoll.register(self._wake_fd, select.EPOLLIN)
                self._thread = threading.Thread(target=self._run, name="netq-io-shared",
                                                daemon=True)
                self._thread.start()
            else:
                os.eventfd_write(self._wake_fd, 1)

    # ----------------------------------------------------------------- the thread

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as error:  # no member may wait for a dead thread
            LOGGER.exception("netq: the shared I/O thread failed")
            with self._lock:
                stranded = [*self._members.values(), *self._joining]
                self._members.clear()
                self._joining.clear()
                self._close_locked()
            for member in stranded:
                self._end(member, error)

    def _serve(self) -> None:
        self.ident = threading.get_ident()
        epoll = self._epoll
        assert epoll is not None
        wake_fd = self._wake_fd
        members = self._members
        due: dict[SharedMember, float] = {}  # each member's next turn (monotonic seconds)
        heap: list[tuple[float, int, SharedMember]] = []  # (when, tiebreak, member), lazy
        order = itertools.count()
        ready: list[SharedMember] = []
        while True:
            with self._lock:
                joining, self._joining = self._joining, []
                if not joining and not members:
                    self._close_locked()  # add() from now on starts a new thread
                    return
            for member in joining:
                members[member.poll_fd] = member
                try:
                    epoll.register(member.poll_fd, select.EPOLLIN)
                except OSError:  # closed already: its first turn finds it aborted and ends
                    pass
                ready.append(member)  # begun in its first turn below
                due[member] = -math.inf
            if ready:
                timeout = 0.0
            elif heap and heap[0][0] < math.inf:
                # Whole milliseconds, rounded up: rounding down would wake before the timer
                # and spin until it is due.
                timeout = max(0.0, math.ceil((heap[0][0] - time.monotonic()) * 1e3) * 1e-3)
            else:
                timeout = -1
            for fd, _ in epoll.poll(timeout):
                if fd == wake_fd:
                    try:
                        os.eventfd_read(wake_fd)
                    except BlockingIOError:
                        pass
                    continue
                watched = members.get(fd)
                if watched is not None:
                    ready.append(watched)
            now = time.monotonic()
            while heap and heap[0][0] <= now:
                when, _, member = heapq.heappop(heap)
                if due.get(member) == when:
                    ready.append(member)
            stepped: set[SharedMember] = set()
            for member in ready:
                if member in stepped or member not in due:
                    continue
                stepped.add(member)
                wait, error = self._turn(member, due[member] == -math.inf)
                if wait is None:
                    del due[member]
                    del members[member.poll_fd]
                    try:  # before its carrier closes the descriptor (its number is reused)
                        epoll.unregister(member.poll_fd)
                    except OSError:
                        pass
                    self._end(member, error)
                    continue
                when = time.monotonic() + wait
                due[member] = when
                heapq.heappush(heap, (when, next(order), member))
            ready.clear()
            if len(heap) > 2 * len(due) + _COMPACT_SLACK:
                heap = [(when, next(order), member) for member, when in due.items()]
                heapq.heapify(heap)

    @staticmethod
    def _turn(member: SharedMember, first: bool) -> tuple[float | None, BaseException | None]:
        try:
            if first:
                member.begin()
            return member.turn(), None
        except BaseException as error:  # noqa: BLE001 - the member's engine must hear of it
            return None, error

    @staticmethod
    def _end(member: SharedMember, error: BaseException | None) -> None:
        try:
            member.end(error)
        except Exception:  # one member's shutdown must not stop the thread the others run on
            LOGGER.exception("netq: a shared client loop failed to shut down")

    def _close_locked(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        if self._wake_fd >= 0:
            os.close(self._wake_fd)
            self._wake_fd = -1
        self._thread = None
        self.ident = None


# ============================================================================ per process

_lock = threading.Lock()
_shared = SharedIOThread()
_own_clients = 0  # client loops of this process running on a thread of their own


def can_share() -> bool:
    """Whether this platform lets one thread watch many carriers (epoll sets nest: Linux)."""
    return hasattr(select, "epoll") and hasattr(os, "eventfd")


def client_thread(choice: str, poll_fd: int | None) -> SharedIOThread | None:
    """Where a client loop runs (``choice``: ``ConnectionOptions.io_thread``; ``poll_fd``:
    its carrier's, None where it has none): the shared thread, or None for a thread of its
    own, counted until :func:`own_thread_ended`."""
    global _own_clients
    with _lock:
        if poll_fd is None or not can_share() or choice == "own" \
                or (choice == "auto" and _own_clients < OWN_THREADS):
            _own_clients += 1
            return None
        return _shared


def own_thread_ended() -> None:
    global _own_clients
    with _lock:
        _own_clients -= 1


def _after_fork_in_child() -> None:
    # The parent's threads do not exist here: the child's clients start afresh.
    global _shared, _own_clients, _lock
    _lock = threading.Lock()
    _shared = SharedIOThread()
    _own_clients = 0


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
