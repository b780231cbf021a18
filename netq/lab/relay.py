"""A loopback link emulator: one byte relay with shaping, faults and recording.

::

    with nq.new(purpose=nq.Purpose.SERVER, options=...) as server, \\
            Relay(server.address, delay=0.025, rate=10e6) as wan:   # 50 ms RTT, 10 MB/s
        client = nq.new(options=nq.CommunicatorOptions(netloc=wan.netloc))

:class:`Relay` listens on loopback (or takes a listening socket you made, as
:class:`netq.lab.netem.NetemLink` does) and relays every accepted connection to ``upstream``
byte for byte, both ways, on one thread (a selector loop). It never looks inside the bytes, so
it carries TLS, gRPC (HTTP/2) and MQTT as well as plain netq frames. Each direction of each
connection (``UP``: client to upstream, ``DOWN``: back) is shaped like a link by a
:class:`netq.lab.shaping.Shape`: a rate cap (the bottleneck), a one-way delay and jitter, and a
bounded buffer past which the relay stops reading that side.

Faults (thread-safe; each is in effect when the call returns):

    shape(...)       change rate / delay / jitter / buffer, both directions or one
    delay(s, jitter) the delay of both directions (the other settings stay)
    blackhole()      a silent network: stop reading, writing and accepting; every socket stays
                     open (what is in flight waits, as TCP retransmissions would)
    drop(direction)  keep reading that direction but throw its bytes away (lost in transit)
    refuse()         reset every new connection at once (existing ones keep flowing)
    restore()        undo blackhole(), drop() and refuse(); the shape is left as it is
    reset(rst=True)  end every relayed connection, both sides (RST, or a plain close)
    truncate(n)      the next chunk longer than ``n`` bytes (either direction) is cut to its
                     first ``n`` bytes, which are forwarded, then that connection is closed
    close()          stop the thread and close every socket

Descriptors: a byte relay drops what a Unix socket carries beside the bytes (``SCM_RIGHTS``),
as a proxy between hosts would. ``pass_fds=True`` (Unix upstream only) forwards them instead,
each with the chunk it came with and at the same byte, so a same-host link through the relay
keeps netq's shared memory (netq._shm) under every fault: the descriptors of a chunk that a
fault throws away (drop, a connection that ends) are closed, those of a truncated chunk go
with its first bytes, and ``truncate(0)`` forwards none.

Recording: a ``tap`` (see :class:`Tap`) sees every chunk read, on the relay thread, and is
told how many bytes of each direction reached the other side when a connection ends;
:class:`netq.lab.trace.Recorder` decodes netq frames from it. Counters: :meth:`Relay.stats`.

Packet loss is something a byte relay cannot produce (TCP below it repairs every loss): for
that, :class:`netq.lab.netem.NetemLink` gives a relay a listening socket across a veth pair
shaped by the kernel's ``netem``.

``python -m netq.lab.relay --upstream HOST:PORT [--delay S] [--rate B/S] ...`` runs one in its
own process (so it does not share an interpreter lock with what it measures): it prints
``READY {"addr": "127.0.0.1:PORT"}``, relays until its stdin closes, then prints
``RESULT {...stats...}``.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import os
import random
import selectors
import socket
import struct
import threading
import time
from typing import Protocol

from ..options import NetworkLocation
from .shaping import Shape

__all__ = ("Relay", "RelayStats", "Tap", "UP", "DOWN", "BOTH", "CONTROL_TIMEOUT")

UP = "up"  # client -> upstream
DOWN = "down"  # upstream -> client
BOTH = "both"
CONTROL_TIMEOUT = 10.0  # seconds a control waits for the relay thread
# Ancillary room per recvmsg() with pass_fds: more descriptors than a netq write sends at once
# (netq._shm.MAX_FDS_PER_WRITE); what does not fit is closed by the kernel (MSG_CTRUNC).
_ANCILLARY = socket.CMSG_SPACE(64 * 4) if hasattr(socket, "CMSG_SPACE") else 0


@dataclasses.dataclass(frozen=True)
class RelayStats:
    bytes_up: int  # client -> upstream, forwarded
    bytes_down: int  # upstream -> client, forwarded
    accepted: int  # connections relayed (upstream connected)
    refused: int  # connections turned away (refuse(), or upstream unreachable)
    reset: int  # relayed connections ended by reset()
    truncated: int  # relayed connections ended by truncate()
    active: int  # relayed right now
    held: int = 0  # bytes waiting in the relay right now (all connections, both ways)
    dropped: int = 0  # bytes thrown away by drop()
    descriptors: int = 0  # descriptors forwarded (pass_fds)


class Tap(Protocol):
    """What a recording tap is told, on the relay thread (keep it short)."""

    def read(self, link: int, direction: str, data: bytes, forwarded: bool) -> None:
        """``data`` was read from ``direction``'s source; ``forwarded``: False if dropped."""

    def closed(self, link: int, direction: str, delivered: int) -> None:
        """The connection ended; ``delivered`` bytes of this direction reached its target."""


class _Direction:
    """One way of a relayed connection: chunks read from ``source``, each due at a time."""

    def __init__(self, name: str, source: socket.socket, target: socket.socket) -> None:
        self.name = name
        self.source = source
        self.target = target
        # [release_at, memoryview, descriptors that go with its first byte]
        self.pending: collections.deque = collections.deque()
        self.pending_bytes = 0
        self.departure = 0.0  # when the bottleneck is free again
        self.last_release = 0.0
        self.delivered = 0  # bytes written to target
        self.eof = False  # the source said EOF
        self.shut = False  # EOF passed on to the target

    def due(self, now: float) -> bool:
        return bool(self.pending) and self.pending[0][0] <= now

    def close_descriptors(self) -> None:
        """The chunks that will never be written: their descriptors are ours to close."""
        for entry in self.pending:
            _close_all(entry[2])
            entry[2] = ()


class _Connection:
    def __init__(self, link: int, client: socket.socket, upstream: socket.socket) -> None:
        self.link = link
        self.client = client
        self.upstream = upstream
        self.up = _Direction(UP, client, upstream)
        self.down = _Direction(DOWN, upstream, client)
        self.truncating = False  # the truncated chunk is being flushed; close after it

    @property
    def directions(self) -> tuple[_Direction, _Direction]:
        return self.up, self.down


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN (what a crashed peer or a middlebox reset looks like)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def _close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _received_fds(ancdata) -> list[int]:
    """The descriptors of recvmsg()'s ancillary data (SCM_RIGHTS; a truncated one is cut to
    whole descriptors)."""
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            whole = array.array("i")
            whole.frombytes(data[:len(data) - len(data) % whole.itemsize])
            fds.extend(whole)
    return fds


def _directions(direction: str) -> tuple[str, ...]:
    if direction == BOTH:
        return UP, DOWN
    if direction in (UP, DOWN):
        return (direction,)
    raise ValueError(f"direction: {UP!r}, {DOWN!r} or {BOTH!r}, not {direction!r}")


class Relay:
    """See the module docstring.

    ``upstream``: ``(host, port)`` (a NetworkLocation or ``server.address`` will do) or a Unix
    socket path. The relay listens on the upstream's family on loopback, on ``path`` for a
    Unix upstream (required then), or on ``listener`` if given (a bound, listening socket the
    relay takes over). ``delay``, ``jitter``, ``rate``, ``buffer``: the :class:`Shape` of both
    directions (``shape()`` sets each). ``tap``: a recording :class:`Tap`. ``name``: of the
    relay thread. ``refuse_with_reset``: when the upstream is unreachable, turn the client
    away with RST (True) or a plain close (False). ``pass_fds``: forward the descriptors a
    Unix socket carries (see the module docstring). Starts at once unless ``start=False``.
    """

    def __init__(self, upstream, *, delay: float = 0.0, jitter: float = 0.0,
                 rate: float | None = None, buffer: int | None = None,
                 path: str | os.PathLike | None = None, listener: socket.socket | None = None,
                 tap: Tap | None = None, name: str = "netq-relay",
                 refuse_with_reset: bool = True, pass_fds: bool = False,
                 start: bool = True) -> None:
        shape = Shape(delay, jitter, rate, buffer)
        if isinstance(upstream, (str, os.PathLike)):
            self.upstream = os.fspath(upstream)
            self._family = socket.AF_UNIX
        else:
            host = str(upstream[0])
            self.upstream = (host, int(upstream[1]))
            self._family = socket.AF_INET6 if ":" in host else socket.AF_INET
        if pass_fds and self._family != socket.AF_UNIX:
            raise ValueError("pass_fds needs a Unix upstream: descriptors cross no other socket")
        self._pass_fds = pass_fds
        self._unix_path = None
        if listener is None:
            if self._family == socket.AF_UNIX:
                if path is None:
                    raise ValueError("a Unix upstream needs a path to listen on")
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(os.fspath(path))
                self._unix_path = os.fspath(path)
            else:
                listener = socket.socket(self._family, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("::1" if self._family == socket.AF_INET6 else "127.0.0.1", 0))
            listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self.address = listener.getsockname() if listener.family == socket.AF_UNIX \
            else listener.getsockname()[:2]
        self._shapes = {UP: shape, DOWN: shape}
        self._tap = tap
        self._refuse_with_reset = refuse_with_reset
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._controls: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._connections: list[_Connection] = []
        self._registered: dict[socket.socket, int] = {}
        self._links = 0
        self._blackholed = False
        self._refusing = False
        self._dropping: set[str] = set()
        self._truncate_at: int | None = None
        self._counts = dict(bytes_up=0, bytes_down=0, accepted=0, refused=0, reset=0,
                            truncated=0, dropped=0, descriptors=0)
        self._stopping = False
        self._closed = False
        self.failure: BaseException | None = None  # what ended the relay thread, if anything
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        if start:
            self.start()

    def __repr__(self) -> str:
        return f"<Relay {self.address} -> {self.upstream} {self._shapes[UP]}>"

    # ================================================================== user side

    @property
    def netloc(self) -> NetworkLocation:
        """Where clients connect instead of the upstream."""
        if isinstance(self.address, str):
            return NetworkLocation(path=self.address)
        return NetworkLocation(self.address[0], self.address[1])

    @property
    def links(self) -> int:
        """Connections relayed so far."""
        return self._links

    def start(self) -> Relay:
        if not self._thread.is_alive() and not self._closed:
            self._thread.start()
        return self

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def shape(self, direction: str = BOTH, *, delay: float | None = None,
              jitter: float | None = None, rate: float | None = ...,  # type: ignore[assignment]
              buffer: int | None = ...) -> None:  # type: ignore[assignment]
        """Change the shape of ``direction`` (UP, DOWN or BOTH); what is not given stays.
        ``rate=None`` lifts the cap; ``buffer=None`` goes back to the default."""
        def apply():
            for name in _directions(direction):
                old = self._shapes[name]
                self._shapes[name] = Shape(
                    old.delay if delay is None else delay,
                    old.jitter if jitter is None else jitter,
                    old.rate if rate is ... else rate,
                    old.buffer if buffer is ... else buffer)
        self._control(apply)

    def shapes(self) -> dict[str, Shape]:
        """The shape of each direction: ``{UP: Shape, DOWN: Shape}``."""
        return dict(self._shapes)

    def delay(self, seconds: float, jitter: float = 0.0) -> None:
        self.shape(BOTH, delay=seconds, jitter=jitter)

    def blackhole(self) -> None:
        self._control(lambda: setattr(self, "_blackholed", True))

    def drop(self, direction: str = UP) -> None:
        self._control(lambda: self._dropping.update(_directions(direction)))

    def refuse(self) -> None:
        self._control(lambda: setattr(self, "_refusing", True))

    def restore(self) -> None:
        def restore():
            self._blackholed = False
            self._refusing = False
            self._dropping.clear()
        self._control(restore)

    def reset(self, rst: bool = True) -> int:
        """End every relayed connection (RST, or a plain close); how many there were."""
        return self._control(lambda: self._reset_all(rst))

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError("n >= 0")
        self._control(lambda: setattr(self, "_truncate_at", n))

    def stats(self) -> RelayStats:
        """The counters, read on the relay thread (so a byte a peer already received is
        counted) or, once closed, as they were left."""
        if self._thread.is_alive():
            try:
                return self._control(self._stats)
            except RuntimeError:
                pass  # closed meanwhile
        return self._stats()

    def close(self) -> None:
        """Stop relaying, close every socket and end the thread. Idempotent."""
        self._closed = True
        if self._thread.is_alive():
            self._stopping = True
            self._wake()
            self._thread.join(CONTROL_TIMEOUT)
        elif self._thread.ident is None:  # never started: the thread's cleanup never ran
            self._cleanup()

    # ================================================================== plumbing

    def _stats(self) -> RelayStats:
        with self._lock:
            held = sum(d.pending_bytes for c in self._connections for d in c.directions)
            return RelayStats(active=len(self._connections), held=held, **self._counts)

    def _control(self, action):
        """Run ``action`` on the relay thread; its result once it ran."""
        if not self._thread.is_alive():
            if self._thread.ident is None and not self._closed:
                return action()  # not started yet: nothing runs concurrently
            raise RuntimeError("the relay is closed")
        done = threading.Event()
        outcome: list = []

        def run():
            try:
                outcome.append((True, action()))
            except BaseException as error:  # noqa: BLE001 - raised on the caller's thread
                outcome.append((False, error))
            done.set()

        self._controls.append(run)
        self._wake()
        if not done.wait(CONTROL_TIMEOUT):
            raise TimeoutError("the relay thread did not answer")
        if not outcome:
            raise RuntimeError("the relay closed before the control ran")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # already awake (buffer full) or closing

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    # ================================================================== the loop

    def _run(self) -> None:
        try:
            while not self._stopping:
                # One clock reading for both: a chunk that is due gets write interest, one
                # that is not yet due sets the timeout; none falls between the two.
                now = time.monotonic()
                self._update_interest(now)
                for key, mask in self._selector.select(self._timeout(now)):
                    sock = key.fileobj
                    if sock is self._wake_r:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except BlockingIOError:
                            pass
                    elif sock is self._listener:
                        self._accept()
                    else:
                        connection = key.data
                        if connection not in self._connections:
                            continue  # ended earlier in this round
                        if mask & selectors.EVENT_READ:
                            self._read(connection, connection.up if sock is connection.client
                                       else connection.down)
                        if mask & selectors.EVENT_WRITE and connection in self._connections:
                            self._flush(connection)
                while self._controls:
                    self._controls.popleft()()
                if not self._blackholed:
                    for connection in list(self._connections):
                        self._flush(connection)
        except BaseException as error:  # noqa: BLE001 - kept for the owner (failure)
            self.failure = error
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        for connection in list(self._connections):
            self._end(connection, rst=True)
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        if self._unix_path is not None:
            try:
                os.unlink(self._unix_path)
            except OSError:
                pass
        while self._controls:  # nobody will run them: let their callers go
            self._controls.popleft()()

    def _timeout(self, now: float) -> float | None:
        if self._blackholed:
            return None
        soonest = None
        for connection in self._connections:
            for direction in connection.directions:
                if direction.pending:
                    at = direction.pending[0][0]
                    if at <= now:
                        continue  # due: it waits for its target to be writable, not for time
                    soonest = at if soonest is None else min(soonest, at)
        return None if soonest is None else soonest - now

    def _interest(self, sock: socket.socket, connection: _Connection, now: float) -> int:
        mask = 0
        for direction in connection.directions:
            if direction.source is sock and not direction.eof and not connection.truncating \
                    and direction.pending_bytes < self._shapes[direction.name].limit:
                mask |= selectors.EVENT_READ
            if direction.target is sock and direction.due(now):
                mask |= selectors.EVENT_WRITE
        return mask

    def _update_interest(self, now: float) -> None:
        wanted: dict[socket.socket, tuple[int, _Connection | None]] = {}
        if not self._blackholed:
            wanted[self._listener] = (selectors.EVENT_READ, None)
            for connection in self._connections:
                for sock in (connection.client, connection.upstream):
                    mask = self._interest(sock, connection, now)
                    if mask:
                        wanted[sock] = (mask, connection)
        for sock in list(self._registered):
            if sock not in wanted:
                self._selector.unregister(sock)
                del self._registered[sock]
        for sock, (mask, owner) in wanted.items():
            if sock not in self._registered:
                self._selector.register(sock, mask, owner)
            elif self._registered[sock] != mask:
                self._selector.modify(sock, mask, owner)
            self._registered[sock] = mask

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # nothing more to accept (BlockingIOError), or aborted
                return
            if self._refusing:
                self._count("refused")
                _reset(client)
                continue
            upstream = socket.socket(self._family, socket.SOCK_STREAM)
            try:
                upstream.settimeout(5)
                upstream.connect(self.upstream)  # local: at once, or refused at once
            except OSError:
                upstream.close()
                self._count("refused")
                # No upstream: the client sees its connection refused, as without us.
                _reset(client) if self._refuse_with_reset else client.close()
                continue
            for sock in (client, upstream):
                sock.setblocking(False)
                if sock.family != socket.AF_UNIX:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._connections.append(_Connection(self._links, client, upstream))
                self._links += 1
            self._count("accepted")

    def _read(self, connection: _Connection, direction: _Direction) -> None:
        shape = self._shapes[direction.name]
        fds: list[int] | tuple[()] = ()
        try:
            if self._pass_fds:
                data, ancdata, _, _ = direction.source.recvmsg(shape.chunk, _ANCILLARY)
                fds = _received_fds(ancdata)
            else:
                data = direction.source.recv(shape.chunk)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by that side: pass the reset on
            self._end(connection, rst=True)
            return
        if not data:
            _close_all(fds)
            direction.eof = True
            self._flush(connection)
            return
        dropped = direction.name in self._dropping
        if self._tap is not None:
            self._tap.read(connection.link, direction.name, data, not dropped)
        if dropped:
            self._count("dropped", len(data))
            _close_all(fds)
            return
        now = time.monotonic()
        view = memoryview(data)
        if self._truncate_at is not None and len(view) > self._truncate_at:
            view = view[:self._truncate_at]
            self._truncate_at = None
            connection.truncating = True
            if not len(view):
                _close_all(fds)
                fds = ()
        departure = now
        if shape.rate is not None:  # the bottleneck: one chunk after the other at the rate
            departure = max(now, direction.departure) + len(view) / shape.rate
            direction.departure = departure
        release = departure + shape.delay
        if shape.jitter:
            release += random.uniform(0, shape.jitter)
        release = max(release, direction.last_release)  # a delayed link still keeps order
        direction.last_release = release
        # (An empty view is kept too: truncate(0) closes after it, forwarding nothing.)
        direction.pending.append([release, view, fds])
        with self._lock:
            direction.pending_bytes += len(view)
        self._flush(connection)

    def _flush(self, connection: _Connection) -> None:
        """Write what is due both ways; pass EOFs on; end the connection when both are done."""
        if connection not in self._connections or self._blackholed:
            return
        now = time.monotonic()
        for direction in connection.directions:
            while direction.due(now):
                entry = direction.pending[0]
                view = entry[1]
                if len(view):
                    try:
                        if entry[2]:
                            fds = entry[2]
                            sent = direction.target.sendmsg([view], [(
                                socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                            entry[2] = ()  # they went with the first byte: ours are copies
                            _close_all(fds)
                            self._count("descriptors", len(fds))
                        else:
                            sent = direction.target.send(view)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        self._end(connection, rst=True)
                        return
                    self._count("bytes_up" if direction is connection.up else "bytes_down", sent)
                    with self._lock:
                        direction.pending_bytes -= sent
                    direction.delivered += sent
                    if sent < len(view):
                        entry[1] = view[sent:]
                        break
                direction.pending.popleft()
            if connection.truncating and not any(d.pending for d in connection.directions):
                self._count("truncated")
                self._end(connection, rst=False)
                return
            if direction.eof and not direction.pending and not direction.shut:
                direction.shut = True
                try:
                    direction.target.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        if all(d.shut for d in connection.directions):
            self._end(connection, rst=False)

    def _reset_all(self, rst: bool) -> int:
        connections = list(self._connections)
        for connection in connections:
            self._end(connection, rst=rst)
        self._count("reset", len(connections))
        return len(connections)

    def _end(self, connection: _Connection, rst: bool) -> None:
        with self._lock:
            if connection not in self._connections:
                return
            self._connections.remove(connection)
        for direction in connection.directions:
            direction.close_descriptors()
        for sock in (connection.client, connection.upstream):
            if sock in self._registered:
                self._selector.unregister(sock)
                del self._registered[sock]
            if rst:
                _reset(sock)
            else:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
        if self._tap is not None:
            for direction in connection.directions:
                self._tap.closed(connection.link, direction.name, direction.delivered)


# ====================================================================== its own process

def _main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(prog="python -m netq.lab.relay", description=(
        "A shaped loopback relay: READY {addr} on stdout, relays until stdin closes, then "
        "RESULT {stats}."))
    parser.add_argument("--upstream", required=True, help="HOST:PORT to relay to")
    parser.add_argument("--delay", type=float, default=0.0, help="one way, seconds")
    parser.add_argument("--jitter", type=float, default=0.0, help="seconds, uniform, per chunk")
    parser.add_argument("--rate", type=float, default=None, help="bytes/s each way")
    parser.add_argument("--buffer", type=int, default=None, help="bytes held per direction")
    args = parser.parse_args(argv)
    host, port = args.upstream.rsplit(":", 1)
    with Relay((host.strip("[]"), int(port)), delay=args.delay, jitter=args.jitter,
               rate=args.rate, buffer=args.buffer) as relay:
        address = relay.address
        print("READY " + json.dumps({"addr": f"{address[0]}:{address[1]}",
                                     "limit": relay.shapes()[UP].limit}), flush=True)
        for _ in sys.stdin:
            pass
        stats = relay.stats()
    print("RESULT " + json.dumps(dataclasses.asdict(stats)), flush=True)
    return 0 if relay.failure is None else 1


if __name__ == "__main__":
    raise SystemExit(_main())
