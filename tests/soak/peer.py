"""One soak participant (server or client) in a child process: numbered, checksummed traffic and
a journal of everything it did, for :mod:`tests.soak.check` to judge.

    python3 tests/soak/peer.py '<spec as JSON>'

The spec is :func:`tests.netq_child.encode_options`'s form plus ``soak``: this peer's ``name``,
``incarnation`` (how many processes had this name before), ``seed``, ``journal`` (a file path),
``peers`` (client name -> id, for a server's targeted puts), ``rate`` (puts per second),
``large_every`` / ``max_size`` (sizes), ``budget_bytes`` (payload bytes this process may put).

It speaks :class:`tests.harness.Child`'s protocol on stdin/stdout (one JSON line per command):

    pause   seconds        the receiver stops calling get() for that long (a stalled reader);
                           answered once no get() is under way
    quiesce timeout_       stop putting; once every future has resolved (or after timeout_
                           seconds), answer with the sequence numbers still unresolved
    close   timeout_       close(timeout=timeout_), traffic may still be running; then take
                           what arrived and was not read, and check that no ``netq-``
                           thread or descriptor outlives it

Journal lines are JSON arrays ``[kind, time.time(), ...]``, one write() each, so a SIGKILL
loses at most the line being written:

    sent    seq, parts, sizes, target   before put() (parts 0) or put_many() (parts items);
                                        target: "server", a client's name, or the names a
                                        broadcast addressed, comma-separated
    done    seq, error, raised          the future resolved (error: None or its type name;
                                        raised: put() itself raised it, no future)
    recv    sender, incarnation, seq, part, parts, size, intact
    warn    text                        a WARNING on the ``netq`` logger
    block   started, ended              a put() that blocked for more than 1 s
    rss     bytes                       sampled every second
    start   pid, rss                    before the communicator is made
    closed  threads, fds                after close(): netq- threads left, extra descriptors
    crash   thread, traceback           an exception ended one of this process's threads
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import threading
import time
import traceback
import uuid
import zlib

import numpy  # here, before any thread: see _send

import netq as nq
from netq_child import decode_options, serve_commands

SMALL_SIZES = (0, 1, 7, 64, 200, 1000, 4096)


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fd_targets() -> dict[str, str]:
    """Every open descriptor and what it points at (a socket, a pipe, a memfd, a file)."""
    targets = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed between the listing and the readlink, or the listing's own
            pass
    return targets


ARRAY_MIN = 1024 * 1024  # large parts from this size are sometimes numpy arrays

def payload(name: str, incarnation: int, seq: int, part: int, size: int) -> bytes:
    """Deterministic bytes (cheap to make at 16 MiB), different for every message."""
    stamp = f"{name}:{incarnation}:{seq}:{part}|".encode()
    return (stamp * (size // len(stamp) + 1))[:size]


def draw_size(rng: random.Random, large_every: int, max_size: int) -> int:
    """Mostly small (0 B .. 4 KiB), some medium (4 KiB .. 256 KiB), one in ``large_every``
    large (256 KiB .. ``max_size``, log-uniform)."""
    roll = rng.random()
    if roll < 1 / large_every:
        return int(256 * 1024 * (max_size / (256 * 1024)) ** rng.random())
    if roll < 0.2:
        return int(4096 * 64 ** rng.random())
    return rng.choice(SMALL_SIZES) if rng.random() < 0.5 else rng.randrange(0, 4096)


class Journal:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, *fields) -> None:
        line = (json.dumps([fields[0], time.time(), *fields[1:]]) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)


# What a closing client logs when its goodbye could not get through before close(timeout=)
# ran out: the server keeps the session, as for a vanished process (a documented duplicate).
GOODBYE_UNFINISHED = "close() could not finish its goodbye"


class _WarningsToJournal(logging.Handler):
    def __init__(self, journal: Journal) -> None:
        super().__init__(logging.WARNING)
        self.journal = journal
        self.goodbye_unfinished = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if GOODBYE_UNFINISHED in text:
            self.goodbye_unfinished.set()
        self.journal.write("warn", text[:300])


class Peer:
    def __init__(self, spec: dict) -> None:
        soak = spec["soak"]
        self.name = soak["name"]
        self.incarnation = soak["incarnation"]
        self.rate = soak["rate"]
        self.large_every = soak["large_every"]
        self.max_size = soak["max_size"]
        self.budget_bytes = soak["budget_bytes"]
        self.peers = {name: uuid.UUID(peer) for name, peer in soak["peers"].items()}
        self.rng = random.Random(f"{soak['seed']}/{self.name}/{self.incarnation}")
        self.journal = Journal(soak["journal"])
        self.warnings = _WarningsToJournal(self.journal)
        # A thread that dies (the soak's own, or netq's) leaves puts unresolved that would be
        # judged as lost futures: journal why it died, the checker reports it as such.
        threading.excepthook = self._crashed
        logging.getLogger("netq").addHandler(self.warnings)
        self.fds_before = _fd_count()
        self.fd_targets_before = _fd_targets()
        protocol, purpose, options = decode_options(spec)
        self.is_server = purpose is nq.Purpose.SERVER
        self.journal.write("start", os.getpid(), _rss())
        self.comm = nq.new(protocol, purpose, options)
        self.sending = threading.Event()
        self.sending.set()
        self.stopped = threading.Event()
        self.paused_until = 0.0
        self.reader_paused = threading.Event()
        self.lock = threading.Lock()
        self.unresolved: set[int] = set()
        self.sent_bytes = 0
        self.threads = [threading.Thread(target=self._send, name="soak-send", daemon=True),
                        threading.Thread(target=self._receive, name="soak-receive", daemon=True),
                        threading.Thread(target=self._sample, name="soak-rss", daemon=True)]
        for thread in self.threads:
            thread.start()

    def _crashed(self, args: threading.ExceptHookArgs) -> None:
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value,
                                                  args.exc_traceback))
        name = args.thread.name if args.thread is not None else "?"
        self.journal.write("crash", name, text[-2000:])
        sys.__stderr__.write(f"thread {name} died:\n{text}")

    # ------------------------------------------------------------------ traffic

    def _target(self) -> tuple[tuple[uuid.UUID, ...], str]:
        if not self.is_server:
            return (), "server"
        if self.rng.random() < 0.3:
            return (), "*"
        live = set(self.comm.peers)
        names = sorted(name for name, peer in self.peers.items() if peer in live)
        if not names:
            return (), ""
        name = self.rng.choice(names)
        return (self.peers[name],), name

    def _send(self) -> None:
        seq = 0
        while not self.stopped.is_set():
            if not self.sending.is_set():
                self.stopped.wait(0.05)
                continue
            self.stopped.wait(self.rng.expovariate(self.rate))
            if self.stopped.is_set() or not self.sending.is_set():
                continue
            peers, target = self._target()
            if self.is_server and (not target or target == "*" and not self.comm.peers):
                continue
            parts = self.rng.choice((1, 1, 1, 2, 5)) if self.rng.random() < 0.3 else 0
            sizes = [draw_size(self.rng, self.large_every, self.max_size)
                     for _ in range(max(1, parts))]
            if self.sent_bytes + sum(sizes) > self.budget_bytes:
                sizes = [min(size, 4096) for size in sizes]
            items = []
            for part, size in enumerate(sizes):
                data = payload(self.name, self.incarnation, seq, part, size)
                crc = zlib.crc32(data)
                if size >= ARRAY_MIN and seq % 2:
                    # Every other large part as a numpy array, out of band: writable (a
                    # copy) or read-only (np.frombuffer over the bytes), half each. Over Unix
                    # sockets either travels in shared memory (netq._shm), and so does the
                    # pickle that holds the other large parts (bytes, in band). numpy is
                    # imported with the module: imported here first, while the get thread
                    # unpickles an array, CPython before 3.15 can fail both (gh-83065).
                    data = numpy.frombuffer(data, numpy.uint8)
                    if seq % 4 != 3:
                        data = data.copy()
                items.append((self.name, self.incarnation, seq, part, max(1, parts), crc, data))
            total = sum(sizes)
            if target == "*":
                target = ",".join(sorted(name for name, peer in self.peers.items()
                                         if peer in self.comm.peers))
            self.journal.write("sent", seq, parts, sizes, target)
            with self.lock:
                self.unresolved.add(seq)
                self.sent_bytes += total
            started = time.time()
            try:
                if parts:
                    future = self.comm.put_many(items, *peers)
                else:
                    future = self.comm.put(items[0], *peers)
            except nq.NetqError as error:
                # raised, not a future: a peer that left since comm.peers was read
                self._resolved(seq, error, raised=True)
                if isinstance(error, nq.ResourceClosed) and self.comm.closed:
                    return
                seq += 1
                continue
            finally:
                ended = time.time()
                if ended - started > 1.0:
                    self.journal.write("block", started, ended)
            future.add_done_callback(lambda f, seq=seq: self._resolved(seq, f.exception()))
            seq += 1

    def _resolved(self, seq: int, error: BaseException | None, raised: bool = False) -> None:
        name = None if error is None else type(error).__name__
        if isinstance(error, nq.BroadcastIncomplete):
            # Some peers did not acknowledge a broadcast: judged by why each of them did not.
            name = "+".join(sorted({type(each).__name__ for each in error.exceptions}))
        self.journal.write("done", seq, name, raised)
        with self.lock:
            self.unresolved.discard(seq)

    def _receive(self) -> None:
        while not self.stopped.is_set():
            if time.monotonic() < self.paused_until:
                self.reader_paused.set()
                self.stopped.wait(min(0.1, self.paused_until - time.monotonic()))
                continue
            try:
                message = self.comm.get(timeout=0.5)
            except nq.Empty:
                continue
            except nq.ResourceGone:  # we closed (then stop), or the server closed our session
                if self.comm.closed:
                    return
                continue
            except nq.NetqError as error:
                self.journal.write("recv_error", type(error).__name__, str(error)[:200])
                continue
            self._journal_received(message)

    def _journal_received(self, message: nq.Message) -> None:
        sender, incarnation, seq, part, parts, crc, data = message.data
        view = data if type(data) is bytes else memoryview(data).cast("B")
        # An array arrives as writable as it was sent (the sender's rule: read-only when
        # seq % 4 == 3).
        flags = getattr(data, "flags", None)
        kind_kept = flags is None or flags.writeable == (seq % 4 != 3)
        self.journal.write("recv", sender, incarnation, seq, part, parts, len(data),
                           zlib.crc32(view) == crc and kind_kept
                           and view == payload(sender, incarnation, seq, part, len(data)))

    def _sample(self) -> None:
        while not self.stopped.wait(1.0):
            self.journal.write("rss", _rss())

    # ------------------------------------------------------------------ commands

    def serve(self, command: dict):
        op = command["op"]
        if op == "pause":
            self.reader_paused.clear()
            self.paused_until = time.monotonic() + command["seconds"]
            # answered once the reader has seen it: a get() under way when the command came
            # may still return a message, none starts after the answer
            if not self.reader_paused.wait(10):
                self.journal.write("warn", "pause: the reader did not stop within 10 s "
                                   "(a get() still under way)")
            return None
        if op == "quiesce":
            self.sending.clear()
            deadline = time.monotonic() + command.get("timeout_", 60)
            while time.monotonic() < deadline:
                with self.lock:
                    if not self.unresolved:
                        return []
                time.sleep(0.1)
            with self.lock:
                return sorted(self.unresolved)
        if op == "close":
            timeout = command.get("timeout_")
            started = time.monotonic()
            self.comm.close(timeout=timeout)
            stats = self.comm.statistics()
            # close(timeout=) that ran out ends the link without the goodbye getting through
            # (the peer holds the session as for a vanished process), and so does a goodbye a
            # broken link interrupted and no reconnect finished within the timeout
            gave_up = (timeout is not None and time.monotonic() - started >= timeout) \
                or self.warnings.goodbye_unfinished.is_set()
            self.stopped.set()
            for thread in self.threads:
                thread.join(10)
            # What arrived and was not read (a paused reader) is still ours to get() after
            # close; a message in shared memory keeps its mapping's descriptors until taken.
            while True:
                try:
                    self._journal_received(self.comm.get(block=False))
                except (nq.ResourceGone, nq.Empty):
                    break
            deadline = time.monotonic() + 10
            while True:
                threads = [t.name for t in threading.enumerate()
                           if t.name.startswith("netq-") and t.is_alive()]
                extra = _fd_count() - self.fds_before
                if (not threads and extra <= 0) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            if extra > 0:
                # name what outlived close(), so a leak report says which kind of descriptor
                new = {fd: target for fd, target in _fd_targets().items()
                       if self.fd_targets_before.get(fd) != target}
                self.journal.write("warn", f"descriptors left after close(): {new}")
            self.journal.write("closed", threads, extra)
            return {"threads": threads, "fds": extra, "gave_up": gave_up,
                    "shm_bytes": stats.shm_bytes_in + stats.shm_bytes_out}
        raise ValueError(f"unknown op {op!r}")


def main() -> None:
    peer = Peer(json.loads(sys.argv[1]))
    serve_commands(peer.comm, peer.serve)


if __name__ == "__main__":
    main()
