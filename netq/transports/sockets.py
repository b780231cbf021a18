"""Byte-stream carriers: TCP (plain or TLS) and Unix domain sockets.

A :class:`netq.carrier.Carrier` over a readiness poller (:class:`~netq.transports.poller.Poller`:
epoll on Linux) watching the listening socket, every channel and a wake-up descriptor. The
loop (:class:`netq.loop.IOLoop`) reads straight into the buffers the protocol core points at
(``recv_into``) and writes the core's iovec list with one scatter-gather ``sendmsg`` (one
``send`` per buffer where the platform has no ``sendmsg``: Windows). TLS runs over memory BIOs
(``TLSStream``: many records per syscall both ways); its handshake is driven by the channel's
first reads and writes. An OpenSSL object must not be written by two threads, so TLS channels
are written by the loop's thread only (``user_threads_write`` off), small buffers joined first.

One module for the three socket kinds: they share the poller, the reads and writes and the
connect path, and differ only in the TLS layer and in how a Unix socket's address and stale
file are handled (a small subclass at the end).
"""

from __future__ import annotations

import array
import dataclasses
import errno
import logging
import os
import socket
import ssl
import stat
import sys
from collections.abc import MutableSequence
from typing import cast

from ..carrier import FAILED, OPENED, READABLE, Address, CarrierInfo, Event, Opened
from ..exceptions import (
    AuthenticationError,
    ConnectionLost,
    UnsupportedProtocol,
)
from ..exposure import owner_only
from ..options import CommunicatorOptions, Purpose
from ..protocol.sending import Buffer
from .connection_failures import FailedHandshakes, address_taken, connect_error
from .fd_passing import FD_SPACE, keep_fds, shm_unavailable
from .poller import (
    EPOLL_READABLE_BITS,
    EPOLL_WRITABLE_BITS,
    EVENT_READ,
    EVENT_WRITE,
    Poller,
    WakeUp,
)
from .tls_contexts import tls_context
from .tls_stream import Scratch, TLSStream

__all__ = ("TCPCarrier", "UnixCarrier", "SocketCarrier", "SocketChannel")

LOGGER = logging.getLogger("netq")
_READ = EVENT_READ
_WRITE = EVENT_WRITE
_READABLE_BITS = EPOLL_READABLE_BITS
_WRITABLE_BITS = EPOLL_WRITABLE_BITS
# Connections accepted per readable event of the listener before the links already served get
# their turn (the listener stays readable, so the rest come on the next turn of the loop).
_ACCEPTS_PER_EVENT = 256
_SOMAXCONN_FILE = "/proc/sys/net/core/somaxconn"
_TLS_JOIN = 256 * 1024  # small buffers are joined up to this size for one SSL write
# A Unix socket's send buffer (SO_SNDBUF; the kernel caps it at net.core.wmem_max). The
# default (about 208 KiB) lets a large message cross in slices that small, each a wake-up of
# both I/O threads; TCP loopback grows its buffers to 4 MiB by itself (tcp_wmem), so a Unix
# socket left at the default lost to it from 64 KiB messages up.
UNIX_SEND_BUFFER = 4 * 1024 * 1024
ACK_HOLD = 250e-6  # seconds an ACK may wait for the reply that a waiting get() is about to send
# Windows has no socket.sendmsg: plain links then send the core's buffers one per call (small
# messages are already coalesced into one buffer by the core; large ones go from their own).
GATHER_WRITES = hasattr(socket.socket, "sendmsg")
SocketAddress = str | tuple[object, ...]  # a Unix socket's path, or an IP (host, port, ...)
# What the poller hands back for the sockets that are not channels.
_WAKE, _LISTEN, _CONNECT = "wake", "listen", "connect"
_SAID_NO_SHM: list[str] = []  # why Unix sockets here pass no descriptors, once said


class SocketChannel:
    """One link's socket and, on TLS, the TLS layer over it
    (:class:`~netq.transports.tls_stream.TLSStream`).

    ``sock`` is the plain, non-blocking socket (what the poller watches, what plain links
    read and write); ``tls`` is what TLS links read and write through (None on plain links).
    Closing ``sock`` ends both.
    """

    __slots__ = ("sock", "tls", "handshaking", "armed")

    def __init__(self, sock: socket.socket, tls: TLSStream | None) -> None:
        self.sock = sock
        self.tls = tls
        self.handshaking = tls is not None  # the TLS handshake is not done yet
        self.armed = False  # the poller reports the socket writable (a write was short)

    def fileno(self) -> int:
        return self.sock.fileno()


class SocketCarrier:
    """TCP, TLS and Unix sockets as a :class:`netq.carrier.Carrier`: a readiness poller over
    the listening socket, every channel and a wake-up descriptor."""

    def __init__(self, options: CommunicatorOptions, purpose: Purpose) -> None:
        self._options = options
        self._purpose = purpose
        self._server = purpose is Purpose.SERVER
        self._poller = Poller()
        self._wake_up = WakeUp()
        self._poller.register(self._wake_up, _READ, _WAKE)
        self._wake_pending = False
        # A thread is in wait(), past its look at _rearm; it stays set after a wait that did
        # not block, as the loop may then not come back before a wake-up (a shared I/O thread
        # gives each of its carriers a wait of 0 per turn): what needs a look wakes it.
        self._waiting = False
        self._events: list[Event] = []  # reported by the next wait() (accepts, attempts)
        # Channels whose write interest changes at the next wait(): a write may come from a
        # user's thread, and only the thread that waits may touch the poller.
        self._rearm: set[SocketChannel] = set()
        self._buffered: set[SocketChannel] = set()  # TLS: plaintext taken from the socket
        self._channels: set[SocketChannel] = set()
        self._listener: socket.socket | None = None
        self._connecting: socket.socket | None = None
        self._ssl = self._make_ssl_context()
        self._failed_handshakes = FailedHandshakes()
        self._gather = GATHER_WRITES
        # Where TLS channels' ciphertext lands on its way from the socket into OpenSSL: one
        # buffer for all of them, as only the loop's thread reads.
        self._tls_scratch = Scratch()
        address: Address = None
        if self._server:
            address = self._listen()  # bind now so a taken port raises from netq.new()
        self.info = CarrierInfo(
            address=address, target=self._target_text(), any_thread_waits=True,
            user_threads_write=self._ssl is None,
            attempt_limit=3 * options.connection.heartbeat, ack_hold=ACK_HOLD,
            poll_fd=self._poller.fileno())

    # ----------------------------------------------------------------- set-up

    def _make_ssl_context(self) -> ssl.SSLContext | None:
        security = self._options.security
        if security is None or security.certificate is None:  # not security.tls
            return None
        return tls_context(self._server, security)

    def _target_text(self) -> str:
        """Where a client's attempts go, as its messages write it."""
        return str(self._options.netloc)

    def _address(self) -> tuple[int, SocketAddress]:
        """The address family and the address to listen on or connect to."""
        netloc = self._options.netloc
        infos = socket.getaddrinfo(netloc.host, netloc.port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        return family, address

    def _new_socket(self, family: int) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        return sock

    def _tune(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _watch_peer_host(self, sock: socket.socket) -> None:
        """Client: the kernel fails the connection once the server's host stops answering
        for 3 heartbeats (keepalive probes while nothing is in flight, a user timeout while
        something is), so that the loop can wait for a slow handshake (``watches_peer_host``):
        a server's kernel acknowledges a connection it queued long before netq answers it.
        Options a platform lacks are skipped; the netq heartbeat still watches a link once
        its handshake is done."""
        seconds = max(1, round(self._options.connection.heartbeat))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", seconds), ("TCP_KEEPINTVL", seconds),
                            ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", 3 * seconds * 1000)):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)

    def _listen(self) -> Address:
        family, address = self._address()
        sock = self._new_socket(family)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as error:
                if error.errno != errno.EADDRINUSE or family == socket.AF_UNIX:
                    raise
                raise address_taken(self._options.netloc.host, self._options.netloc.port) from None
            self._bound(address)
            sock.listen(listen_backlog())
        except BaseException:
            sock.close()
            self._close_wake()
            raise
        self._listener = sock
        self._poller.register(sock, _READ, _LISTEN)
        return cast(Address, sock.getsockname())

    def _bound(self, address: SocketAddress) -> None:
        """The listening socket is bound and not yet listening: nobody can connect yet."""

    def _close_wake(self) -> None:
        self._poller.close()
        self._wake_up.close()

    # ----------------------------------------------------------------- the carrier interface

    def admit(self, on: bool) -> None:
        if self._server:
            if not on:
                self._stop_listening()
        elif on:
            self._connect()
        else:
            self._abandon_connect()

    def explain(self) -> str | None:
        return None

    def wake(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            self._wake_up.signal()

    def wait(self, timeout: float) -> list[Event]:
        poller = self._poller
        # Set before the look at _rearm: a write on another thread that arms a channel after
        # the look sees it set and wakes this wait (no lost write interest).
        self._waiting = True
        if self._rearm:
            for channel in list(self._rearm):
                self._rearm.discard(channel)
                if channel in self._channels:
                    poller.modify(channel.sock, _READ | _WRITE if channel.armed else _READ,
                                  channel)
        events = self._events
        if events:
            self._events = []
            timeout = 0
        else:
            events = []
        if self._buffered:
            timeout = 0
        if self._failed_handshakes.count:
            self._failed_handshakes.summarize()
        epoll = poller.epoll
        if epoll is None:
            for data, mask in poller.select(timeout):
                self._ready(data, mask, events)
        else:
            # Poller.select and _ready, inline: one pass and no Python call on every turn of
            # the loop. epoll.poll rounds a timeout up to whole milliseconds itself.
            registered = poller.registered
            for fd, event in epoll.poll(timeout if timeout > 0 else 0, len(registered) or 1):
                entry = registered.get(fd)
                if entry is not None:
                    mask = ((_WRITE if event & _WRITABLE_BITS else 0)
                            | (_READ if event & _READABLE_BITS else 0)) & entry[1]
                    if mask:
                        data = entry[0]
                        if type(data) is SocketChannel:
                            if mask & _WRITE:
                                data.armed = False  # reported once: a short write arms it again
                                poller.modify(data.sock, _READ, data)
                            events.append((mask, data, None))
                        else:
                            self._ready(data, mask, events)
        if timeout > 0:
            self._waiting = False
        if self._buffered:
            for channel in self._buffered:
                events.append((READABLE, channel, None))
            self._buffered.clear()
        return events

    def read_into(self, channel: SocketChannel, buffer: memoryview,
                  fds: MutableSequence[int] | None = None) -> int:
        tls = channel.tls
        if tls is None:
            if fds is None:
                return channel.sock.recv_into(buffer)
            # A Unix link's every read: bytes alone are taken here, descriptors by keep_fds.
            count, ancillary, flags, _ = channel.sock.recvmsg_into([buffer], FD_SPACE)
            if not ancillary and not flags:
                return count  # bytes alone (most reads)
            return keep_fds(count, ancillary, flags, fds)
        if channel.handshaking and not self._handshake(channel):
            raise BlockingIOError
        return self._read_tls(channel, tls, buffer)

    def write(self, channel: SocketChannel, buffers: list[Buffer],
              fds: list[int] | None = None) -> int:
        tls = channel.tls
        try:
            if fds:
                rights = array.array("i", fds).tobytes()
                sent = channel.sock.sendmsg(
                    buffers, [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
                total = sum(map(len, buffers))
            elif tls is not None:
                if channel.handshaking and not self._handshake(channel):
                    return 0
                chunk = self._tls_chunk(buffers)
                sent = tls.send(chunk)
                total = len(chunk)
            elif self._gather:
                sent = channel.sock.sendmsg(buffers)
                total = sum(map(len, buffers)) if len(buffers) > 1 else len(buffers[0])
            else:
                sent = channel.sock.send(buffers[0])
                total = len(buffers[0])
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError,
                ssl.SSLWantReadError):
            sent, total = 0, 1
        if sent < total and not channel.armed:
            channel.armed = True  # the socket is full: report it writable when it has room
            self._rearm.add(channel)
            if self._waiting:
                self.wake()  # a user's thread wrote while the loop waits: it must look again
        return sent

    def close(self, channel: SocketChannel | None) -> None:
        if channel is None:
            self._stop_listening()
            self._abandon_connect()
            for open_channel in list(self._channels):
                self.close(open_channel)
            self._close_wake()
            return
        if channel not in self._channels:
            return
        self._channels.discard(channel)
        self._rearm.discard(channel)
        self._buffered.discard(channel)
        try:
            self._poller.unregister(channel.sock)
        except (KeyError, ValueError, OSError):
            pass
        try:
            channel.sock.close()
        except OSError:
            pass

    # ----------------------------------------------------------------- waiting

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._poller.unregister(self._listener)
            self._listener.close()
            self._listener = None
            self._unlink_socket_file()

    def _unlink_socket_file(self) -> None:
        pass

    def _report_later(self, event: Event) -> None:
        self._events.append(event)
        self._look_again()

    def _look_again(self) -> None:
        """Something for the next wait() to report that no descriptor shows: a loop that
        may not come back by itself must be woken (see _waiting)."""
        if self._waiting:
            self.wake()

    def _ready(self, data: object, mask: int, events: list[Event]) -> None:
        """What a ready descriptor means: the wake-up, the listener, a connect that ended, or
        a channel to read or write (reported as an event)."""
        if data is _WAKE:
            self._drain_wake()
        elif data is _LISTEN:
            self._accept(events)
        elif data is _CONNECT:
            self._connected(events)
        else:
            assert isinstance(data, SocketChannel)
            if mask & _WRITE:
                data.armed = False  # reported once: a short write arms it again
                self._poller.modify(data.sock, _READ, data)
            events.append((mask, data, None))

    def _drain_wake(self) -> None:
        self._wake_up.drain()
        self._wake_pending = False

    # ----------------------------------------------------------------- server side

    def _accept(self, events: list[Event]) -> None:
        listener = self._listener
        assert listener is not None  # a listen event comes only from the registered listener
        for _ in range(_ACCEPTS_PER_EVENT):
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return  # out of descriptors: try again on the next event
                raise
            sock.setblocking(False)
            try:
                events.append(self._opened(sock, address, server_side=True))
            except OSError as error:  # reset before the TLS layer was set up: not our failure
                sock.close()
                LOGGER.info("netq server: connection from %s lost at once: %s", address, error)

    def _opened(self, sock: socket.socket, address: Address, server_side: bool) -> Event:
        """The OPENED event of a connected socket, its channel set up (OSError: it broke)."""
        channel = self._open_channel(sock, server_side)
        if channel.tls is not None:  # read_into and write run the TLS record layer
            return (OPENED, channel, Opened(address))
        # A plain socket reads and writes with its own methods (C functions: no Python call).
        return (OPENED, channel, Opened(address, read_into=sock.recv_into,
                                        write=sock.sendmsg if self._gather else None))

    def _open_channel(self, sock: socket.socket, server_side: bool) -> SocketChannel:
        self._tune(sock)
        if not server_side:
            self._watch_peer_host(sock)
        context = self._ssl
        stream: TLSStream | None = None
        if context is not None:
            hostname = None
            if not server_side:
                security = self._options.security
                assert security is not None  # the TLS context was made from it
                hostname = security.server_hostname or self._options.netloc.host
            stream = TLSStream(sock, context, server_side, hostname, self._tls_scratch)
        channel = SocketChannel(sock, stream)
        self._channels.add(channel)
        self._poller.register(sock, _READ, channel)
        return channel

    # ----------------------------------------------------------------- client side

    def _connect(self) -> None:
        try:
            family, address = self._address()
            sock = self._new_socket(family)
        except OSError as error:
            self._report_later((FAILED, None, f"cannot resolve or open a socket: {error}"))
            return
        code = sock.connect_ex(address)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self._report_later((FAILED, None, connect_error(code, family)))
            return
        self._connecting = sock
        self._poller.register(sock, _WRITE, _CONNECT)

    def _connected(self, events: list[Event]) -> None:
        sock = self._connecting
        assert sock is not None  # a connect event comes only from the pending attempt
        self._poller.unregister(sock)
        self._connecting = None
        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            sock.close()
            events.append((FAILED, None, connect_error(code, sock.family)))
            return
        try:
            address = sock.getpeername()
            events.append(self._opened(sock, address, server_side=False))
        except OSError as error:
            sock.close()
            events.append((FAILED, None, str(error)))

    def _abandon_connect(self) -> None:
        if self._connecting is not None:
            self._poller.unregister(self._connecting)
            self._connecting.close()
            self._connecting = None

    # ----------------------------------------------------------------- TLS

    def _handshake(self, channel: SocketChannel) -> bool:
        """Drive a TLS channel's handshake; True once done. Raises when it failed."""
        stream = channel.tls
        assert stream is not None
        try:
            stream.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError) as want:
            # Wait for what the handshake needs, and only that: a socket watched for writing
            # is always writable, so waiting for a silent peer's answer that way would spin
            # the loop until the heartbeat drops the link.
            if isinstance(want, ssl.SSLWantWriteError) and not channel.armed:
                channel.armed = True
                self._rearm.add(channel)
            return False
        except (ssl.SSLError, OSError) as error:
            # A server says so (at a bounded rate); a client retries, and its engine reports
            # the failing attempts at a bounded rate (the error reaches it as the link's).
            peer = _peer(channel.sock)
            if self._server:
                self._failed_handshakes.failed(f"TLS handshake with {peer} failed: {error}",
                                               peer_left=peer is _PEER_LEFT)
            else:
                LOGGER.debug("netq client: TLS handshake with %s failed: %s", peer, error)
            if isinstance(error, ssl.SSLCertVerificationError) and not self._server:
                # The server is not who the trusted certificate says: retrying cannot help.
                raise AuthenticationError(f"TLS: {error.verify_message}") from None
            raise ConnectionLost(None, f"TLS handshake failed: {error}") from None
        channel.handshaking = False
        if stream.buffered:
            # The peer's first data came with its last handshake flight: it is out of the
            # socket already, so no readable event will report it.
            self._buffered.add(channel)
            self._look_again()
        return True

    def _read_tls(self, channel: SocketChannel, stream: TLSStream, buffer: memoryview) -> int:
        """A TLS read returns at most one record (16 KiB): fill ``buffer`` record by record
        (one read of the loop per buffer, not per record) until the socket is drained."""
        size = len(buffer)
        got = 0
        try:
            while got < size:
                count = stream.recv_into(buffer[got:] if got else buffer)
                if count == 0:
                    break  # the end of the stream: what was read first, then 0
                got += count
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            if not got:
                raise BlockingIOError from None
            return got
        if got == size and stream.buffered:
            self._buffered.add(channel)  # more already taken from the socket
            self._look_again()
        return got

    @staticmethod
    def _tls_chunk(buffers: list[Buffer]) -> Buffer:
        first = buffers[0]
        if len(buffers) == 1 or len(first) >= _TLS_JOIN:
            return first
        joined = bytearray()
        for buffer in buffers:
            if len(joined) + len(buffer) > _TLS_JOIN and joined:
                break
            joined += buffer
        return joined


_PEER_LEFT = "a peer that left"


def _peer(sock: socket.socket) -> object:
    try:
        return sock.getpeername()
    except OSError:
        return _PEER_LEFT


def listen_backlog() -> int:
    """The listen backlog a server asks for: the system's maximum (Linux:
    ``net.core.somaxconn``, which caps whatever is asked), so that a storm of clients
    connecting at once waits in the kernel's queue instead of having its SYNs dropped and
    retried seconds later."""
    try:
        with open(_SOMAXCONN_FILE) as file:
            return max(int(file.read().split()[0]), socket.SOMAXCONN)
    except (OSError, ValueError, IndexError):
        return max(socket.SOMAXCONN, 4096)


class TCPCarrier(SocketCarrier):
    """TCP, or TLS when ``SecurityOptions.certificate`` is set."""


class UnixCarrier(SocketCarrier):
    """Unix domain stream sockets: same host, no TCP/IP stack, no TLS needed."""

    def __init__(self, options: CommunicatorOptions, purpose: Purpose) -> None:
        if not hasattr(socket, "AF_UNIX"):
            raise UnsupportedProtocol(
                f"Protocol.UNIX needs Unix domain sockets (socket.AF_UNIX), which Python on "
                f"{sys.platform} does not have: use Protocol.TCP on 127.0.0.1 instead")
        super().__init__(options, purpose)
        if options.connection.shared_memory:
            why = shm_unavailable()
            if why is None and self._ssl is not None:
                why = "descriptors do not travel inside TLS (a Unix socket with TLS options)"
            elif why is None and not self._gather:
                why = "this platform's sockets have no sendmsg"
            if why is None:
                self.info = dataclasses.replace(self.info, passes_fds=True)
            elif why not in _SAID_NO_SHM:
                _SAID_NO_SHM.append(why)  # once per process and reason
                LOGGER.info("netq: Protocol.UNIX without shared memory: %s; large parts go "
                            "through the socket", why)

    def _address(self) -> tuple[int, SocketAddress]:
        return socket.AF_UNIX, self._options.netloc.unix_path()

    def _target_text(self) -> str:
        return f"unix:{self._options.netloc.unix_path()}"  # the socket file, from the port

    def _tune(self, sock: socket.socket) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER)
        except OSError:
            pass  # the default buffer still works, only slower

    def _watch_peer_host(self, sock: socket.socket) -> None:
        pass  # the server is on this host: its exit ends the connection at once

    def _bound(self, address: SocketAddress) -> None:
        if not isinstance(address, str):
            raise TypeError(f"a Unix socket is bound to a path, not {address!r}")
        owner_only(address)  # before listen: no other user connects in between

    def _listen(self) -> Address:
        path = self._options.netloc.unix_path()
        self._remove_stale(path)
        address = super()._listen()
        self._path: str | None = path
        return address

    @staticmethod
    def _remove_stale(path: str) -> None:
        """A socket file nobody listens on is left over from a crash: remove it."""
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise FileExistsError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)
        else:
            raise OSError(errno.EADDRINUSE, f"a server already listens on {path}")
        finally:
            probe.close()

    def _unlink_socket_file(self) -> None:
        path = getattr(self, "_path", None)
        if path is not None:
            self._path = None
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
