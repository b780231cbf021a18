"""A fault-injecting byte relay for the network-fault tests.

``FaultProxy(upstream)`` listens on loopback (the family of ``upstream``: TCP over IPv4 or IPv6,
or a Unix path) and relays every accepted connection to ``upstream`` byte for byte, both ways,
on one ``netq-proxy`` thread (a selector loop). It never looks inside the bytes, so it carries
TLS, gRPC (HTTP/2) and MQTT as well as plain netq frames. A client configured to connect to
``proxy.address`` instead of its upstream then sees the faults the test asks for, live:

    delay(seconds, jitter=0)  hold every chunk read from now on ``seconds`` (+ up to ``jitter``,
                              uniformly) before forwarding it; order is kept per direction
    blackhole()               a silent network: stop reading, writing and accepting; every socket
                              stays open (what is in flight waits in the kernel buffers, as
                              TCP retransmissions would), nothing is closed, nothing is said
    refuse()                  reset every new connection at once (existing ones keep flowing)
    restore()                 undo blackhole() and refuse(); delay is left as it is
    reset()                   RST every relayed connection, both sides (SO_LINGER 0)
    truncate(n)               the next chunk longer than ``n`` bytes (either direction) is cut
                              to its first ``n`` bytes, which are forwarded, and then that
                              connection is closed on both sides (a FIN after a partial frame)
    close()                   stop the thread and close every socket

Counters (``stats()``): bytes each way, connections accepted, refused, reset and truncated,
and how many are relayed right now. Every control is thread-safe: it is queued to the proxy
thread and waited for, so when it returns, the fault is in effect.

Memory: at most ``BUFFER_LIMIT`` bytes wait per direction of a connection; past it the proxy
stops reading that side (backpressure flows back through the kernel, as on a real link).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import selectors
import socket
import struct
import threading
import time

CHUNK = 256 * 1024  # bytes per recv()
BUFFER_LIMIT = 1024 * 1024  # bytes held per direction before the proxy stops reading its source
CONTROL_TIMEOUT = 10.0  # seconds a control waits for the proxy thread


@dataclasses.dataclass(frozen=True)
class ProxyStats:
    bytes_up: int  # client -> upstream, forwarded
    bytes_down: int  # upstream -> client, forwarded
    accepted: int  # connections relayed (upstream connected)
    refused: int  # connections reset at once (refuse(), or upstream unreachable)
    reset: int  # relayed connections ended by reset()
    truncated: int  # relayed connections ended by truncate()
    active: int  # relayed right now


class _Direction:
    """One way of a relayed connection: bytes read from ``source``, waiting for ``target``."""

    def __init__(self, source: socket.socket, target: socket.socket, up: bool) -> None:
        self.source = source
        self.target = target
        self.up = up
        self.pending: collections.deque = collections.deque()  # [release_at, memoryview]
        self.pending_bytes = 0
        self.last_release = 0.0
        self.eof = False  # the source said EOF
        self.shut = False  # EOF passed on to the target

    def due(self, now: float) -> bool:
        return bool(self.pending) and self.pending[0][0] <= now


class _Relay:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.up = _Direction(client, upstream, True)
        self.down = _Direction(upstream, client, False)
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


class FaultProxy:
    """See the module docstring. ``upstream``: ``(host, port)`` or a Unix socket path;
    ``path``: where to listen for a Unix upstream (required then)."""

    def __init__(self, upstream, path: str | os.PathLike | None = None) -> None:
        self.upstream = upstream
        if isinstance(upstream, tuple):
            host = upstream[0]
            self._family = socket.AF_INET6 if ":" in host else socket.AF_INET
            listener = socket.socket(self._family, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, 0))
            self.address = listener.getsockname()[:2]
        else:
            if path is None:
                raise ValueError("a Unix upstream needs a path to listen on")
            self._family = socket.AF_UNIX
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(os.fspath(path))
            self.address = os.fspath(path)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._controls: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._relays: list[_Relay] = []
        self._registered: dict[socket.socket, int] = {}
        self._delay = 0.0
        self._jitter = 0.0
        self._blackholed = False
        self._refusing = False
        self._truncate_at: int | None = None
        self._counts = dict(bytes_up=0, bytes_down=0, accepted=0, refused=0, reset=0,
                            truncated=0)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="netq-proxy", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<FaultProxy {self.address} -> {self.upstream}>"

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ================================================================== controls

    def delay(self, seconds: float, jitter: float = 0.0) -> None:
        self._control(lambda: self._set_delay(seconds, jitter))

    def blackhole(self) -> None:
        self._control(lambda: setattr(self, "_blackholed", True))

    def refuse(self) -> None:
        self._control(lambda: setattr(self, "_refusing", True))

    def restore(self) -> None:
        def restore():
            self._blackholed = False
            self._refusing = False
        self._control(restore)

    def reset(self) -> int:
        """RST every relayed connection; how many there were."""
        return self._control(self._reset_all)

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError("n >= 0")
        self._control(lambda: setattr(self, "_truncate_at", n))

    def stats(self) -> ProxyStats:
        """The counters, read on the proxy thread (so a byte a peer already received is
        counted) or, once closed, as they were left."""
        if self._thread.is_alive():
            try:
                return self._control(self._stats)
            except RuntimeError:
                pass  # closed meanwhile
        return self._stats()

    def _stats(self) -> ProxyStats:
        with self._lock:
            return ProxyStats(active=len(self._relays), **self._counts)

    def close(self) -> None:
        if self._thread.is_alive():
            self._stopping = True
            self._wake()
            self._thread.join(CONTROL_TIMEOUT)
        if self._family == socket.AF_UNIX:
            try:
                os.unlink(self.address)
            except OSError:
                pass

    def _set_delay(self, seconds: float, jitter: float) -> None:
        if seconds < 0 or jitter < 0:
            raise ValueError("delay and jitter >= 0")
        self._delay, self._jitter = seconds, jitter

    def _control(self, action):
        """Run ``action`` on the proxy thread; its result once it ran."""
        if not self._thread.is_alive():
            raise RuntimeError("the proxy is closed")
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
            raise TimeoutError("the proxy thread did not answer")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # already awake (buffer full) or closing

    # ================================================================== the loop

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._update_interest()
                events = self._selector.select(self._timeout())
                for key, mask in events:
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
                        relay = key.data
                        if relay.client.fileno() < 0:
                            continue  # closed earlier in this round
                        if mask & selectors.EVENT_READ:
                            self._read(relay, relay.up if sock is relay.client else relay.down)
                        if mask & selectors.EVENT_WRITE and relay.client.fileno() >= 0:
                            self._flush(relay)
                while self._controls:
                    self._controls.popleft()()
                if not self._blackholed:
                    for relay in list(self._relays):
                        self._flush(relay)
        finally:
            for relay in list(self._relays):
                self._end(relay, rst=True)
            self._selector.close()
            self._listener.close()
            self._wake_r.close()
            self._wake_w.close()
            while self._controls:  # nobody will run them: let their callers go
                self._controls.popleft()()

    def _timeout(self) -> float | None:
        if self._blackholed:
            return None
        now = time.monotonic()
        soonest = None
        for relay in self._relays:
            for direction in relay.directions:
                if direction.pending:
                    at = direction.pending[0][0]
                    soonest = at if soonest is None else min(soonest, at)
        return None if soonest is None else max(0.0, soonest - now)

    def _interest(self, sock: socket.socket, relay: _Relay) -> int:
        if self._blackholed:
            return 0
        mask = 0
        now = time.monotonic()
        for direction in relay.directions:
            if direction.source is sock and not direction.eof \
                    and direction.pending_bytes < BUFFER_LIMIT and not relay.truncating:
                mask |= selectors.EVENT_READ
            if direction.target is sock and direction.due(now):
                mask |= selectors.EVENT_WRITE
        return mask

    def _update_interest(self) -> None:
        wanted = {}
        if not self._blackholed:
            wanted[self._listener] = (selectors.EVENT_READ, None)
        for relay in self._relays:
            for sock in (relay.client, relay.upstream):
                mask = self._interest(sock, relay)
                if mask:
                    wanted[sock] = (mask, relay)
        for sock in list(self._registered):
            if sock not in wanted:
                self._selector.unregister(sock)
                del self._registered[sock]
        for sock, (mask, relay) in wanted.items():
            if sock not in self._registered:
                self._selector.register(sock, mask, relay)
            elif self._registered[sock] != mask:
                self._selector.modify(sock, mask, relay)
            self._registered[sock] = mask

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if self._refusing:
                self._count("refused")
                _reset(client)
                continue
            upstream = socket.socket(self._family, socket.SOCK_STREAM)
            try:
                upstream.settimeout(5)
                upstream.connect(self.upstream)  # loopback: at once, or refused at once
            except OSError:
                upstream.close()
                self._count("refused")
                _reset(client)
                continue
            for sock in (client, upstream):
                sock.setblocking(False)
                if self._family != socket.AF_UNIX:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._relays.append(_Relay(client, upstream))
            self._count("accepted")

    def _read(self, relay: _Relay, direction: _Direction) -> None:
        try:
            data = direction.source.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by that side: pass the reset on
            self._end(relay, rst=True)
            return
        if not data:
            direction.eof = True
            self._flush(relay)
            return
        now = time.monotonic()
        view = memoryview(data)
        if self._truncate_at is not None and len(view) > self._truncate_at:
            view = view[:self._truncate_at]
            self._truncate_at = None
            relay.truncating = True
        release = now + self._delay + (random.uniform(0, self._jitter) if self._jitter else 0)
        release = max(release, direction.last_release)  # a delayed link still keeps order
        direction.last_release = release
        # (An empty view is kept too: truncate(0) closes after it, forwarding nothing.)
        direction.pending.append([release, view])
        direction.pending_bytes += len(view)
        self._flush(relay)

    def _flush(self, relay: _Relay) -> None:
        """Write what is due both ways; pass EOFs on; end the relay when both are done."""
        if relay.client.fileno() < 0 or self._blackholed:
            return
        now = time.monotonic()
        for direction in relay.directions:
            while direction.due(now):
                entry = direction.pending[0]
                view = entry[1]
                if len(view):
                    try:
                        sent = direction.target.send(view)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        self._end(relay, rst=True)
                        return
                    self._count("bytes_up" if direction.up else "bytes_down", sent)
                    direction.pending_bytes -= sent
                    if sent < len(view):
                        entry[1] = view[sent:]
                        break
                direction.pending.popleft()
            if relay.truncating and not any(d.pending for d in relay.directions):
                self._count("truncated")
                self._end(relay, rst=False)
                return
            if direction.eof and not direction.pending and not direction.shut:
                direction.shut = True
                try:
                    direction.target.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        if all(d.shut for d in relay.directions):
            self._end(relay, rst=False)

    def _reset_all(self) -> int:
        relays = list(self._relays)
        for relay in relays:
            self._end(relay, rst=True)
        self._count("reset", len(relays))
        return len(relays)

    def _end(self, relay: _Relay, rst: bool) -> None:
        with self._lock:
            if relay not in self._relays:
                return
            self._relays.remove(relay)
        for sock in (relay.client, relay.upstream):
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

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount
