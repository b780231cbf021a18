"""Shared-memory segments for large message parts between processes on one host.

Over ``Protocol.UNIX`` a message part of ``ConnectionOptions.shm_threshold`` bytes or more
does not cross the socket: the sender copies it into a *segment* (an anonymous ``memfd``,
no ``/dev/shm`` involved), or sends a buffer netq handed out (:func:`shared_buffer`) as it
is, and the segment's descriptor crosses the socket with ``SCM_RIGHTS`` in the same
``sendmsg`` as (or one before) the DATA frame that describes it. The receiver checks the
descriptor (a sealed memfd, large enough) and maps it: ``get()`` returns an object backed by
the mapping. See docs/transports.md ("Shared memory") and docs/guarantees.md.

A segment file is ``capacity`` bytes of data followed by one page whose first byte is the
*release flag*: the sender sets it to 1 when it sends the segment, the receiver sets it to 0
(a ``pwrite`` on its descriptor) once the object it handed to ``get()`` is freed (a
``weakref.finalize`` on the mapping). Only segments whose flag is 0 are written again by the
sender's pool (:class:`SendPool`): what a receiver holds does not change under it while an
honest sender runs. Seals ``F_SEAL_SHRINK | F_SEAL_GROW`` are set before a segment is sent
and checked before it is mapped, so no peer can truncate a mapping under the other (which
would make reading it raise SIGBUS).

Stdlib only; Linux only (``os.memfd_create``, ``fcntl.F_ADD_SEALS``, ``socket.SCM_RIGHTS``):
:func:`unavailable` says why not elsewhere.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import socket
import stat
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ._buffer_address import ExportedAddress, address as _address

__all__ = ("unavailable", "Segment", "SendPool", "ShmCounters", "map_segment", "SegmentError",
           "shared_buffer", "shared_array", "handout_of", "PAGE", "MAX_FDS_PER_WRITE",
           "MAX_PENDING_FDS", "REQUIRED_SEALS", "fd_space")

PAGE = mmap.PAGESIZE
F_ADD_SEALS: int = getattr(fcntl, "F_ADD_SEALS", 1033)
F_GET_SEALS: int = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SHRINK: int = getattr(fcntl, "F_SEAL_SHRINK", 2)
F_SEAL_GROW: int = getattr(fcntl, "F_SEAL_GROW", 4)
REQUIRED_SEALS = F_SEAL_SHRINK | F_SEAL_GROW  # a segment's size is fixed once it is sent
# Descriptors per sendmsg (the kernel takes up to 253); the receiver makes room for this many
# per read and fails a link that sends more at once.
MAX_FDS_PER_WRITE = 32
# Descriptors received and not yet claimed by a DATA frame, past which the link fails: a
# sender's descriptors arrive at most one write ahead of the frames that claim them.
MAX_PENDING_FDS = 2 * MAX_FDS_PER_WRITE
# Reusable segments a link's sender keeps: as many as a credit window of 1 MiB parts can have
# on their way (32 MiB), with room for what the receiver's caller holds.
POOL_SEGMENTS = 64
POOL_BYTES = 2 << 30  # and their total capacity, at most (beyond: one-shot segments)
_RELEASE_WAIT = 0.002  # seconds a pool, all held, waits for a release before it grows
_RELEASE_WAIT_UP_TO = 2  # segments: larger pools grow at once
_SPARE_MIN = 8 << 20  # segments this large get a spare made ahead when the pool grows
_SPLIT_MIN = 4 << 20  # parts this large may be copied into their segment by two threads
_TRY_OTHER_EVERY = 8  # of those copies, one in this many goes the way that was slower
_RATE_WEIGHT = 0.25  # of a new measurement in a way's running copy rate
_TRACKFD = sys.version_info >= (3, 13)  # mmap(trackfd=False): no dup()ed descriptor per map


def unavailable() -> str | None:
    """Why shared memory cannot be used here (a sentence), or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"shared memory needs Linux memfds ({sys.platform} has none)"
    if not hasattr(os, "memfd_create"):
        return "os.memfd_create is missing (Python built without it)"
    if not hasattr(fcntl, "F_ADD_SEALS"):
        return "fcntl.F_ADD_SEALS is missing: memfds cannot be sealed"
    if not (hasattr(socket, "SCM_RIGHTS") and hasattr(socket.socket, "recvmsg_into")
            and hasattr(socket.socket, "sendmsg")):
        return "this platform's sockets cannot pass descriptors (SCM_RIGHTS)"
    try:
        fd = os.memfd_create("netq-probe", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as error:
        return f"memfd_create failed: {error}"
    try:
        fcntl.fcntl(fd, F_ADD_SEALS, REQUIRED_SEALS)
    except OSError as error:
        return f"memfds cannot be sealed here: {error}"
    finally:
        os.close(fd)
    return None


_UNAVAILABLE: list[str | None] = []


def unavailable_cached() -> str | None:
    """:func:`unavailable`, asked once per process."""
    if not _UNAVAILABLE:
        _UNAVAILABLE.append(unavailable())
    return _UNAVAILABLE[0]


def fd_space() -> int:
    """Ancillary buffer size for one read's descriptors."""
    return socket.CMSG_SPACE(MAX_FDS_PER_WRITE * 4)


class SegmentError(Exception):
    """A received descriptor is not what a segment must be (the caller blames the peer)."""


class ShmCounters:
    """A communicator's shared-memory totals (its links add to them; ints: GIL-atomic)."""

    __slots__ = ("bytes_out", "messages_out", "bytes_in", "messages_in", "pooled", "held",
                 "one_shot", "copied", "handed")

    def __init__(self) -> None:
        self.bytes_out = self.messages_out = 0  # sent through segments
        self.bytes_in = self.messages_in = 0  # received through segments
        self.pooled = 0  # segments in the senders' pools now
        self.held = 0  # of those, held by the peer (sent, not released) at the last look
        self.one_shot = 0  # parts sent in a fresh segment: every pooled one was held
        self.copied = 0  # parts copied into a segment (the rest were handed-out buffers)
        self.handed = 0  # parts sent from a buffer netq handed out: no copy


def _new_memfd(capacity: int) -> int:
    """A sealed memfd of ``capacity`` data bytes plus the flag page."""
    fd = os.memfd_create("netq-segment", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, capacity + PAGE)
        fcntl.fcntl(fd, F_ADD_SEALS, REQUIRED_SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _round(size: int) -> int:
    return -(-size // PAGE) * PAGE


class Segment:
    """A sender's segment: its memfd and a shared, writable mapping of all of it."""

    __slots__ = ("fd", "capacity", "map", "view", "address")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity = _round(max(capacity, 1))
        self.fd = _new_memfd(capacity)
        try:
            # Allocate the pages (fallocate: in one call, where a mapping's faults would
            # allocate them one by one) and map them all at once (MAP_POPULATE), so that the
            # first copy into the segment runs at memcpy speed. Without the fallocate,
            # populating a shared mapping of a hole maps the zero page, and the first copy
            # then faults on every page anyway.
            try:
                os.posix_fallocate(self.fd, 0, capacity + PAGE)
            except OSError:
                pass  # the copy allocates them instead
            self.map = mmap.mmap(self.fd, capacity + PAGE,
                                 flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self.map)
        self.address = _address(self.view)

    @property
    def held(self) -> bool:
        """Sent and not released by the receiver yet."""
        return self.map[self.capacity] != 0

    def fill(self, part: Any, copy: Callable[[int, int, int], object] = ctypes.memmove) -> None:
        """Copy ``part`` (a contiguous buffer, writable or read-only) to the start of the
        segment and mark it held. ``copy(target, source, size)`` releases the GIL
        (``ctypes.memmove``, or a pool's :meth:`SendPool.copy`): the link's other thread (and,
        in one process, the receiving side) runs while hundreds of MiB are copied."""
        size = len(part) if type(part) is not memoryview else part.nbytes
        with ExportedAddress(part) as source:
            if source is None:  # no address to be had: copy it in Python (holds the GIL)
                self.view[:size] = memoryview(part).cast("B")
            else:
                copy(self.address, source, size)
        self.map[self.capacity] = 1

    def close(self) -> None:
        self.view.release()
        self.map.close()
        os.close(self.fd)


class _Copier:
    """A second thread for the copy of a large part into its segment: the sender's copy is
    what a message over shared memory costs (the receiver maps it and copies nothing), and
    one thread copies at memory speed for one core. Two threads, each a half, use the core
    the receiver leaves idle. Lives as long as its pool (``stop``)."""

    __slots__ = ("_job", "_go", "_done", "_thread")

    def __init__(self) -> None:
        self._job: tuple[int, int, int] | None = None
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._run, name="netq-shm-copy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            job = self._job
            if job is None:
                return
            ctypes.memmove(*job)
            self._done.release()

    def copy(self, target: int, source: int, size: int) -> None:
        half = size // 2 & ~(PAGE - 1)
        self._job = (target + half, source + half, size - half)
        self._go.release()
        try:
            ctypes.memmove(target, source, half)
        finally:
            # The helper's half must be done before the segment is sent, or reused by the
            # next copy: wait for it even through an interrupt, then let the interrupt go on.
            interrupted: BaseException | None = None
            while True:
                try:
                    self._done.acquire()
                    break
                except BaseException as error:  # noqa: BLE001 - re-raised below
                    interrupted = error
            if interrupted is not None:
                raise interrupted

    def stop(self) -> None:
        self._job = None
        self._go.release()
        self._thread.join()


class CopyChoice:
    """Whether a large part is copied by one thread or two: one while no core is idle,
    otherwise whichever copied faster lately.

    Two threads copy a part up to 1.4x faster when a core is idle (the receiver's side of a
    segment is only a mapping). When none is, the second thread takes a core from something
    else: from other processes, which the scheduler then shares out so that the copy itself
    may still look as fast, and from the receiver, which must take the message and answer
    before the next one goes; the messages then go slower than with one thread. So the copy is
    split only while fewer tasks are runnable on the machine than the process has cores
    (``idle_core``: Linux's count of runnable tasks, this thread included), and then by the
    rates: each way keeps a running rate (bytes per second of the copy, a moving average of
    ``_RATE_WEIGHT``), the faster one is used, and one copy in ``_TRY_OTHER_EVERY`` goes the
    other way, so a change in the machine's load is seen within a few copies."""

    __slots__ = ("copies", "rates", "idle_core", "_loadavg")

    def __init__(self, idle_core: Callable[[], bool] | None = None) -> None:
        self.copies = 0
        self.rates = [0.0, 0.0]  # one thread, two threads (0: not measured yet)
        self._loadavg = -1  # the descriptor _idle_core reads (opened then; closed by close())
        self.idle_core = idle_core or self._idle_core

    def _idle_core(self) -> bool:
        """Is a core of this process's idle now: fewer tasks runnable on the machine (the
        calling thread among them) than the cores it may run on? True where the count cannot
        be read (then the copy rates alone decide). Reads ``/proc/loadavg`` again from its
        start through a descriptor kept open (the kernel writes the file anew for each read
        at offset 0): a look costs one system call, not an open, a read and a close, ahead
        of every large copy."""
        fd = self._loadavg
        try:
            if fd < 0:
                fd = self._loadavg = os.open(_RUNNABLE, os.O_RDONLY)
            runnable = int(os.pread(fd, 256, 0).split()[3].split(b"/")[0])
        except (OSError, ValueError, IndexError):
            return True
        return runnable < _cores()

    def close(self) -> None:
        """Close the descriptor :meth:`_idle_core` reads (a later look opens it again)."""
        fd, self._loadavg = self._loadavg, -1
        if fd >= 0:
            os.close(fd)

    def split(self) -> bool:
        """Copy the next part in two halves?"""
        if not self.idle_core():
            return False
        self.copies += 1
        single, double = self.rates
        faster = double >= single
        if self.copies % _TRY_OTHER_EVERY == 0:
            return not faster
        return faster

    def record(self, split: bool, size: int, seconds: float) -> None:
        rate = size / max(seconds, 1e-9)
        old = self.rates[split]
        self.rates[split] = rate if not old else old + _RATE_WEIGHT * (rate - old)


_RUNNABLE = "/proc/loadavg"  # its fourth field: tasks runnable now / tasks in all


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Probe:
    """The descriptor a link's first write carries (with its HELLO) where it takes segments:
    the peer sends segments only if it arrived (a path that forwards bytes only drops it).
    An empty memfd, closed once sent."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd = os.memfd_create("netq-probe", os.MFD_CLOEXEC)

    def close(self) -> None:
        os.close(self.fd)


class SendPool:
    """A link's reusable segments (sender side). One thread at a time (the link's lock).

    A pool that makes a segment (every segment it has is held, and it has room) also starts
    a *spare* of the same size on a helper thread: a stream of large messages to a receiver
    that keeps the previous one needs one segment more than the one just made, and
    populating a segment's pages (about 0.4 ms per MiB here) then overlaps the copy into
    the first instead of following it. Taking the spare starts no other (a third segment
    is made when needed, without a spare): at most one spare per size that appears, within
    the pool's bounds; it joins the pool only when taken.
    """

    __slots__ = ("segments", "counters", "_spare", "_lock", "_copier", "_choice")

    def __init__(self, counters: ShmCounters) -> None:
        self.segments: list[Segment] = []
        self.counters = counters
        self._spare: tuple[threading.Thread, list[Segment], int] | None = None
        self._copier: _Copier | None = None  # made by the first part copied in two halves
        self._choice = CopyChoice()
        # acquire() runs under the link's lock; trim() comes from the engine's timers.
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return sum(segment.capacity + PAGE for segment in self.segments)

    def _room(self, need: int, extra: int = 0) -> bool:
        return (len(self.segments) + extra < POOL_SEGMENTS
                and self.capacity + (extra + 1) * (need + PAGE) <= POOL_BYTES)

    def acquire(self, size: int) -> tuple[Segment, bool]:
        """A segment for ``size`` bytes the receiver does not hold, and whether it stays in
        the pool (False: a one-shot segment, closed once its descriptor is sent: every pooled
        segment is held and the pool is full)."""
        with self._lock:
            return self._acquire(size)

    def _acquire(self, size: int) -> tuple[Segment, bool]:
        need = _round(size)
        segments = self.segments
        free = [segment for segment in segments if not segment.held]
        if segments and not free and len(segments) <= _RELEASE_WAIT_UP_TO:
            # A receiver's credit comes back from inside get(), before its caller drops the
            # previous message: its segment is usually released a moment later. Wait that
            # moment (bounded) rather than grow the pool by a segment it does not need. Only
            # while the pool is that small: a larger one that is all held has many messages
            # on their way or kept by the receiver, and waiting would only slow it down.
            deadline = time.monotonic() + _RELEASE_WAIT
            while not free and time.monotonic() < deadline:
                time.sleep(_RELEASE_WAIT / 20)
                free = [segment for segment in segments if not segment.held]
        counters = self.counters
        # Held by the receiver once this one is sent (one-shot segments are not counted).
        counters.held = len(segments) - len(free) + 1
        for segment in free:
            if need <= segment.capacity <= 2 * need:
                segments.remove(segment)
                segments.append(segment)  # most recently used last
                return segment, True
        if free and not self._room(need):
            segments.remove(free[0])  # a free segment of the wrong size makes room
            free[0].close()
            counters.pooled -= 1
        if self._room(need):
            spare = self._take_spare(need)
            if spare is None and need >= _SPARE_MIN and self._room(need, 1):
                self._start_spare(need)  # populated while this one is made and filled
            segment = spare or Segment(need)
            segments.append(segment)
            counters.pooled += 1
            return segment, True
        counters.held -= 1
        counters.one_shot += 1
        return Segment(need), False

    def _start_spare(self, need: int) -> None:
        made: list[Segment] = []

        def make() -> None:
            try:
                made.append(Segment(need))
            except (OSError, ValueError):
                pass  # no memory for a spare: the next growth makes its segment itself

        thread = threading.Thread(target=make, name="netq-shm-spare", daemon=True)
        thread.start()
        self._spare = (thread, made, need)

    def _take_spare(self, need: int) -> Segment | None:
        """The spare, when it is of this size (waiting for it to be ready: it is further
        along than a new one would be); None otherwise."""
        spare = self._spare
        if spare is None or spare[2] != need:
            self._drop_spare()
            return None
        self._spare = None
        spare[0].join()
        return spare[1][0] if spare[1] else None

    def _drop_spare(self) -> None:
        spare = self._spare
        if spare is not None:
            self._spare = None
            spare[0].join()
            for segment in spare[1]:
                segment.close()

    def copy(self, target: int, source: int, size: int) -> None:
        """What :meth:`Segment.fill` copies with: one ``memmove``, or for a large part where
        the process may run on two cores, two halves on two threads when that has been the
        faster way lately (:class:`CopyChoice`)."""
        if size < _SPLIT_MIN or _cores() < 2:
            ctypes.memmove(target, source, size)
            return
        choice = self._choice
        split = choice.split()
        started = time.perf_counter()
        if split:
            copier = self._copier
            if copier is None:
                copier = self._copier = _Copier()
            copier.copy(target, source, size)
        else:
            ctypes.memmove(target, source, size)
        choice.record(split, size, time.perf_counter() - started)

    def held(self) -> int:
        return sum(1 for segment in self.segments if segment.held)

    def trim(self) -> None:
        """Close the segments the receiver does not hold (an idle link)."""
        with self._lock:
            self._trim()

    def _trim(self) -> None:
        self._drop_spare()
        keep = []
        for segment in self.segments:
            if segment.held:
                keep.append(segment)
            else:
                segment.close()
                self.counters.pooled -= 1
        self.segments = keep

    def close(self) -> None:
        """The link ended: close every segment (a receiver still mapping one keeps its
        memory until it lets go; it is never written again)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        self._drop_spare()
        self._choice.close()
        copier, self._copier = self._copier, None
        if copier is not None:
            copier.stop()
        for segment in self.segments:
            segment.close()
        self.counters.pooled -= len(self.segments)
        self.segments = []


# ------------------------------------------------------------------- receiving

_nofile_raised = False


def _raise_nofile() -> None:
    """Each received part held by the caller keeps a descriptor (two before Python 3.13): let
    the process hold as many as its hard limit allows, once."""
    global _nofile_raised
    _nofile_raised = True
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, 1 << 20), hard))
    except (ImportError, ValueError, OSError):
        pass


def _release(fd: int, offset: int, counters: ShmCounters | None) -> None:
    """The object ``get()`` returned is gone: tell the sender (flag byte 0) and let go."""
    try:
        os.pwrite(fd, b"\0", offset)
    except OSError:
        pass
    os.close(fd)


def map_segment(fd: int, size: int, readonly: bool) -> Any:
    """Check a received descriptor and map ``size`` bytes of it: the part ``get()`` hands
    out. A read-only part (the sender's buffer was: ``bytes``, a read-only array) is a
    read-only ``memoryview`` (format ``"B"``) of a read-only map, the kind a large read-only
    part is on the socket path too; a writable one a copy-on-write ``mmap``. Takes
    ownership of ``fd`` (closed when the mapping is freed, or at once on failure). Raises
    :class:`SegmentError` saying what is wrong."""
    try:
        try:
            seals = fcntl.fcntl(fd, F_GET_SEALS)
        except OSError as error:
            raise SegmentError(f"a descriptor that is not a memfd ({error.strerror})") from None
        if seals & REQUIRED_SEALS != REQUIRED_SEALS:
            raise SegmentError(f"an unsealed memfd (seals {seals:#x}, need "
                               f"F_SEAL_SHRINK|F_SEAL_GROW)")
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SegmentError("a descriptor that is not a memfd (not a regular file)")
        length = info.st_size
        if length % PAGE or length - PAGE < size or size <= 0:
            raise SegmentError(f"a segment of {length} bytes for a part of {size} (the frame "
                               f"lies about its size)")
        if not _nofile_raised:
            _raise_nofile()
        access = mmap.ACCESS_READ if readonly else mmap.ACCESS_COPY
        try:
            if _TRACKFD:
                part = mmap.mmap(fd, size, access=access, trackfd=False)  # type: ignore[call-arg]
            else:
                part = mmap.mmap(fd, size, access=access)
        except OSError as error:
            if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                raise  # ours, not the peer's
            raise SegmentError(f"the segment cannot be mapped: {error.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    weakref.finalize(part, _release, fd, length - PAGE, None)
    if readonly:
        return memoryview(part)  # holds the map: released once the view and its users go
    return part


# ------------------------------------------------------------------- handed-out buffers

_HANDOUTS: dict[int, tuple[int, int, int]] = {}  # base address -> (fd, capacity, nbytes)
_HANDOUTS_LOCK = threading.Lock()


def _forget(address: int, fd: int) -> None:
    with _HANDOUTS_LOCK:
        _HANDOUTS.pop(address, None)
    os.close(fd)


def shared_buffer(nbytes: int) -> memoryview:
    """A writable buffer of ``nbytes`` bytes in a segment: a ``put()`` of it (or of an array
    over all of it, from its start) sends the segment's descriptor instead of copying it."""
    if nbytes <= 0:
        raise ValueError("a shared buffer has at least one byte")
    why = unavailable_cached()
    if why is not None:
        raise OSError(errno.ENOSYS, why)
    capacity = _round(nbytes)
    fd = _new_memfd(capacity)
    try:
        mapping = mmap.mmap(fd, capacity + PAGE, flags=mmap.MAP_SHARED)
    except BaseException:
        os.close(fd)
        raise
    view = memoryview(mapping)[:nbytes]
    address = _address(view)
    with _HANDOUTS_LOCK:
        _HANDOUTS[address] = (fd, capacity, nbytes)
    weakref.finalize(mapping, _forget, address, fd)
    return view


def callers_numpy() -> Any:
    """numpy, which the caller has imported (netq never imports it on its own); a
    RuntimeError saying so where it has not."""
    if "numpy" not in sys.modules:
        raise RuntimeError("shared_array needs numpy: import numpy first (netq does not)")
    # The statement, not sys.modules["numpy"]: while another thread still imports numpy,
    # sys.modules holds it half made, and the statement waits for that import to end.
    import numpy

    return numpy


def shared_array(shape: Any, dtype: Any = "float64", order: str = "C") -> Any:
    """A numpy array of ``shape`` and ``dtype`` in a segment (see :func:`shared_buffer`).
    Needs numpy, imported by the caller already."""
    numpy = callers_numpy()
    dtype = numpy.dtype(dtype)
    count = 1
    for extent in (shape if isinstance(shape, tuple) else (shape,)):
        count *= int(extent)
    buffer = shared_buffer(max(count * dtype.itemsize, 1))
    return numpy.frombuffer(buffer, dtype, count).reshape(shape, order=order)


def handout_of(part: Any) -> tuple[int, int] | None:
    """``(fd, size)`` when ``part`` (a writable view) starts at a handed-out buffer."""
    if not _HANDOUTS or type(part) is not memoryview or part.readonly:
        return None
    try:
        address = _address(part)
    except (TypeError, ValueError):
        return None
    found = _HANDOUTS.get(address)
    if found is None or part.nbytes > found[1]:
        return None
    return found[0], found[1]


def flag_handout(fd: int, capacity: int) -> None:
    """A handed-out buffer is on its way: its release flag says held."""
    os.pwrite(fd, b"\1", capacity)


Releaser = Callable[[int], None]
