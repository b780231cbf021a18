"""Byte-stream transports: TCP (plain or TLS) and Unix domain sockets.

One I/O thread per communicator runs a readiness loop (:class:`~netq.transports.poller.Poller`:
epoll on Linux) over the listening socket, every link and a wake-up socketpair. Reads go
straight into the buffers the protocol core points at
(``recv_into``); writes are scatter-gather ``sendmsg`` of the core's iovec list (one ``send``
per buffer of that list where the platform has no ``sendmsg``: Windows). TLS runs over
memory BIOs (``_TLSStream``: many records per syscall both ways); an OpenSSL object must not be
written by two threads, so TLS links are written by the I/O thread only, with small buffers
joined first. The loop itself (engine service, reconnects, closing) is
:class:`netq.transports.base.Transport`'s.

One module for the three socket kinds (over the ~400 lines the other transport modules keep
to): they share the selector loop, the reads and writes and the connect path, and differ only
in the TLS handshake (interleaved with those reads and writes, so it belongs beside them) and
in how a Unix socket's address and stale file are handled (a small subclass at the end).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import ssl
import stat
import sys
import time
from typing import cast

from ..contract import EngineAPI
from ..exceptions import AuthenticationError, ConnectionLost, UnsupportedProtocol
from ..exposure import owner_only
from ..protocol import Connection
from ..protocol.connection import Buffer
from .base import Link, Transport
from .poller import EVENT_READ, EVENT_WRITE, Poller

__all__ = ("TCPTransport", "UnixTransport", "SocketLink")

LOGGER = logging.getLogger("netq")
_READ = EVENT_READ
_WRITE = EVENT_WRITE
_READS_PER_EVENT = 32  # recv calls per readable event before serving other links
# Connections accepted per readable event of the listener before the links already served get
# their turn (the listener stays readable, so the rest come on the next turn of the loop).
_ACCEPTS_PER_EVENT = 256
_SOMAXCONN_FILE = "/proc/sys/net/core/somaxconn"
_TLS_JOIN = 256 * 1024  # small buffers are joined up to this size for one SSL write
_TLS_WRITE = 256 * 1024  # plaintext encrypted per TLS send: bounds the ciphertext a link holds
_TLS_FILL = 256 * 1024  # bytes taken from a TLS link's socket per recv (many records at once)
_TLS_READ_PER_EVENT = 4 << 20  # TLS bytes read per readable event before serving other links
ACK_HOLD = 250e-6  # seconds an ACK may wait for the reply that a waiting get() is about to send
LEAD_BELOW = 256 * 1024  # bytes handed to a waiting get() below which callers may lead the loop
# Windows has no socket.sendmsg: plain links then send the core's buffers one per call (small
# messages are already coalesced into one buffer by the core; large ones go from their own).
GATHER_WRITES = hasattr(socket.socket, "sendmsg")
SocketAddress = str | tuple[object, ...]  # a Unix socket's path, or an IP (host, port, ...)


class SocketLink(Link):
    """A link of a socket transport: its OS socket and, on TLS, the TLS layer over it.

    ``sock`` is the plain, non-blocking socket (what the selector watches, what plain links
    read and write); ``tls`` is the :class:`_TLSStream` that TLS links read and write through
    (None on plain links). Closing ``sock`` ends both.
    """

    __slots__ = ("sock", "tls")

    def __init__(self, sock: socket.socket, tls: _TLSStream | None, conn: Connection,
                 address: object) -> None:
        super().__init__(conn, address, tls_handshaking=tls is not None)
        self.sock = sock
        self.tls = tls


def _socket_link(link: Link) -> SocketLink:
    """``link`` as a socket transport's link (the engine hands back only the links the
    transport gave it; anything else is a programming error)."""
    if not isinstance(link, SocketLink):
        raise TypeError(f"a socket transport was given a link it does not own: {link!r}")
    return link


class SocketTransport(Transport):
    """The selector loop shared by TCP, TLS and Unix sockets."""

    family_name = "tcp"
    caller_leads = True

    def __init__(self, engine: EngineAPI) -> None:
        super().__init__(engine)
        self._selector = Poller()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector.register(self._wake_reader, _READ, "wake")
        self._wake_pending = False
        self._held: set[SocketLink] = set()  # links whose ACK frames wait for a reply (ACK_HOLD)
        self._listener: socket.socket | None = None
        self._connecting: socket.socket | None = None
        self._connect_started = 0.0
        self._ssl = self._make_ssl_context()
        self._gather = GATHER_WRITES
        self.direct_writes = self._ssl is None
        self._read_link = self._read if self._ssl is None else self._read_tls
        # Where TLS links' ciphertext lands on its way from the socket into OpenSSL: one
        # buffer for all links, as only the I/O thread reads.
        self._tls_scratch = memoryview(bytearray(_TLS_FILL if self._ssl is not None else 0))
        if self._server:
            self._listen()  # bind now so a taken port raises from netq.new()

    # ----------------------------------------------------------------- set-up

    def _make_ssl_context(self) -> ssl.SSLContext | None:
        security = self._options.security
        if security is None or security.certificate is None:  # not security.tls
            return None
        if self._server:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(security.certificate, security.key)
            if security.client_ca is not None:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(security.client_ca)
        else:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.load_verify_locations(security.certificate)
            if security.client_certificate is not None:
                context.load_cert_chain(security.client_certificate, security.key)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

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

    def _listen(self) -> None:
        family, address = self._address()
        sock = self._new_socket(family)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            self._bound(address)
            sock.listen(listen_backlog())
        except BaseException:
            sock.close()
            self._close_wake()
            raise
        self._listener = sock
        self.address = sock.getsockname()
        self._selector.register(sock, _READ, "listen")

    def _bound(self, address: SocketAddress) -> None:
        """The listening socket is bound and not yet listening: nobody can connect yet."""

    def _close_wake(self) -> None:
        self._selector.close()
        self._wake_reader.close()
        self._wake_writer.close()

    # ----------------------------------------------------------------- waiting

    def wake(self) -> None:
        self.unpark()
        if self._idle and not self._wake_pending:
            self._wake_pending = True
            try:
                self._wake_writer.send(b"\0")
            except (BlockingIOError, OSError):
                pass

    def abort(self) -> None:
        self._wake_pending = False
        super().abort()

    def _wait(self, timeout: float) -> None:
        if self._held:
            timeout = min(timeout, self._release_holds())
        turns = self._turns
        if turns.active:  # the main thread leads: a Ctrl-C may interrupt the wait at once
            turns.waiting()
            try:
                ready = self._selector.select(timeout)
            finally:
                turns.working()
        else:
            ready = self._selector.select(timeout)
        for data, mask in ready:
            if data == "wake":
                self._drain_wake()
            elif data == "listen":
                self._accept()
            elif data == "connect":
                self._connected()
            else:
                self._service_link(data, mask)

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            self._unlink_socket_file()

    def _close_resources(self) -> None:
        self._close_wake()

    def _unlink_socket_file(self) -> None:
        pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        self._wake_pending = False

    # ----------------------------------------------------------------- server side

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None  # a "listen" event comes only from the registered listener
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
            if self.engine.closing:
                sock.close()
                continue
            try:
                self._open_link(sock, address, server_side=True)
            except OSError as error:  # reset before the TLS layer was set up: not our failure
                sock.close()
                LOGGER.info("netq server: connection from %s lost at once: %s", address, error)

    def _open_link(self, sock: socket.socket, address: object, server_side: bool) -> None:
        self._tune(sock)
        context = self._ssl
        stream: _TLSStream | None = None
        if context is not None:
            hostname = None
            if not server_side:
                security = self._options.security
                assert security is not None  # the TLS context was made from it
                hostname = security.server_hostname or self._options.netloc.host
            stream = _TLSStream(sock, context, server_side, hostname, self._tls_scratch)
        link = SocketLink(sock, stream, self.engine.new_connection(), address)
        self._links.add(link)
        self._selector.register(sock, _READ | _WRITE, link)
        link.write_registered = True
        if stream is not None:
            self._tls_handshake(link)

    # ----------------------------------------------------------------- client side

    def _connect(self) -> None:
        if not self._wants_connection():
            return
        where = str(self._options.netloc)
        self.engine.connect_started()
        try:
            family, address = self._address()
            sock = self._new_socket(family)
        except OSError as error:
            self._attempt_failed(where, f"cannot resolve or open a socket: {error}")
            return
        code = sock.connect_ex(address)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self._attempt_failed(where, _connect_error(code, family))
            return
        self._connecting = sock
        self._connect_started = time.monotonic()
        self._selector.register(sock, _WRITE, "connect")

    def _connect_pending(self) -> bool:
        return self._connecting is not None

    def _attempt_failed(self, where: str, reason: str) -> None:
        self.engine.connect_failed(where, reason)
        self._schedule_reconnect()

    def _check_connect(self, now: float) -> None:
        if self._connecting is not None and now - self._connect_started > self._connect_timeout():
            self._abandon_connect()
            self._attempt_failed(str(self._options.netloc),
                                 f"timed out after {self._connect_timeout():.0f} s "
                                 f"(no answer: a firewall or an unreachable host?)")

    def _connected(self) -> None:
        sock = self._connecting
        assert sock is not None  # a "connect" event comes only from the pending attempt
        self._selector.unregister(sock)
        self._connecting = None
        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        where = str(self._options.netloc)
        if code:
            sock.close()
            self._attempt_failed(where, _connect_error(code, sock.family))
            return
        try:
            self._open_link(sock, sock.getpeername(), server_side=False)
        except OSError as error:
            sock.close()
            self._attempt_failed(where, str(error))

    def _abandon_connect(self) -> None:
        if self._connecting is not None:
            self._selector.unregister(self._connecting)
            self._connecting.close()
            self._connecting = None

    # ----------------------------------------------------------------- links

    def _tls_handshake(self, link: SocketLink) -> None:
        stream = link.tls
        if stream is None:
            raise TypeError(f"TLS handshake on a plain link: {link!r}")
        try:
            stream.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError) as want:
            # Wait for what the handshake needs, and only that: a socket registered for
            # writing is always writable, so waiting for a silent peer's answer that way
            # would spin this thread until the heartbeat drops the link.
            needs_write = isinstance(want, ssl.SSLWantWriteError)
            if needs_write != link.write_registered:
                self._selector.modify(link.sock, _READ | _WRITE if needs_write else _READ, link)
                link.write_registered = needs_write
            return
        except (ssl.SSLError, OSError) as error:
            # A server says so each time; a client retries, and its engine reports the
            # failing attempts at a bounded rate (the error reaches it through link_closed).
            LOGGER.log(logging.WARNING if self._server else logging.DEBUG,
                       "netq %s: TLS handshake with %s failed: %s",
                       self.engine.purpose.value, link.address, error)
            if isinstance(error, ssl.SSLCertVerificationError) and not self._server:
                # The server is not who the trusted certificate says: retrying cannot help.
                link.error = AuthenticationError(f"TLS: {error.verify_message}")
                link.session = None
            else:
                link.error = ConnectionLost(None, f"TLS handshake failed: {error}")
            self._drop(link)
            return
        link.tls_handshaking = False
        with link.lock:
            self.write_now(link)
            if not link.dropped and stream.buffered:
                # The peer's first data came with its last handshake flight: it is out of
                # the socket already, so no readable event will report it.
                self._read_tls(link)

    def _service_link(self, link: SocketLink, mask: int) -> None:
        if link.dropped:
            return
        if link.tls_handshaking:
            self._tls_handshake(link)
            if link.tls_handshaking or link.dropped:
                return
        # Looked at before reading: the message read now is what a blocked get() waited for.
        consumer_waiting = self.engine.consumer_waiting
        session = link.session
        with link.lock:
            if mask & _WRITE:
                link.write_blocked = False
                self.write_now(link)
            if mask & _READ and not link.dropped:
                if consumer_waiting and session is not None:
                    messages, size = self.engine.received_on(link)
                    self._read_link(link)
                    messages_now, size_now = self.engine.received_on(link)
                    if messages_now > messages and size_now - size < LEAD_BELOW:
                        # Small messages handed to a waiting get(): it may lead the loop from
                        # now on. Large ones keep the I/O thread reading the next while the
                        # caller takes this one (reading and consuming overlap).
                        self._handed_off = True
                else:
                    self._read_link(link)
            if not link.dropped and link.conn.bytes_queued:
                if consumer_waiting and link.direct_ok and link.conn.output_is_only_acks():
                    self._hold_acks(link)
                else:
                    self.write_now(link)
        self.engine.after_io(link)

    def _hold_acks(self, link: SocketLink) -> None:
        """Delayed acknowledgement: let the ACK frames just queued wait up to ``ACK_HOLD``.

        Someone was blocked in get() for the message they acknowledge and usually replies at
        once; the reply's write then carries them (one write and one read fewer each way, and
        the peer's next read finds the reply instead of a lone ACK). Never longer than
        ``ACK_HOLD``, and only while nothing but ACK frames is queued: a CREDIT frame may be
        what a sender waits for, so it always goes at once.
        """
        if not link.ack_hold_until:
            link.ack_hold_until = time.monotonic() + ACK_HOLD
            self._held.add(link)

    def _holds_due(self, now: float) -> bool:
        for link in list(self._held):
            if link.ack_hold_until <= now:
                return True
        return False

    def _release_holds(self) -> float:
        """Write the held ACKs that are due (I/O thread); seconds until the next is due."""
        now = time.monotonic()
        wait = ACK_HOLD
        for link in list(self._held):
            due = link.ack_hold_until - now
            if due > 0 and not link.dropped and link.conn.output_is_only_acks():
                wait = min(wait, due)
                continue
            self._held.discard(link)
            link.ack_hold_until = 0.0
            if not link.dropped and link.conn.has_output:
                with link.lock:
                    self.write_now(link)
        return wait

    def _read(self, link: SocketLink) -> None:
        """Read a plain (not TLS: :meth:`_read_tls`) link until drained or its share is read."""
        conn = link.conn
        sock = link.sock
        for _ in range(_READS_PER_EVENT):
            buffer = conn.receive_buffer()
            try:
                count = sock.recv_into(buffer)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if link.error is None:
                    link.error = ConnectionLost(link.peer_id, f"receive failed: {error}")
                self._drop(link)
                return
            if count == 0:
                self._end_of_stream(link)
                return
            link.last_received_at = time.monotonic()
            if not self._received(link, conn.receive_done(count)):
                return
            if count < len(buffer):
                # Drained. (A large direct read keeps going: more of the body is usually on
                # its way, and another recv_into is cheaper than a round through select.)
                return

    def _read_tls(self, link: SocketLink) -> None:
        """``_read`` for a TLS link (:class:`_TLSStream`). A TLS read returns at most one
        record (16 KiB), so a short read does not mean the link is drained, and a large body
        takes many reads: fill the core's buffer record by record and hand it over once (one
        ``receive_done`` per buffer, not per record), until the socket is drained or this
        event's share is read (then only what was already taken from the socket, which no
        readable event would report again)."""
        conn = link.conn
        stream = link.tls
        if stream is None:
            raise TypeError(f"TLS read on a plain link: {link!r}")
        recv_into = stream.recv_into
        left = _TLS_READ_PER_EVENT
        while True:
            buffer = conn.receive_buffer()
            size = len(buffer)
            got = 0
            drained = eof = False
            failure: OSError | None = None
            try:
                while got < size:
                    count = recv_into(buffer[got:] if got else buffer, left > 0)
                    if count == 0:
                        eof = True
                        break
                    got += count
                    left -= count
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError,
                    InterruptedError):
                drained = True
            except OSError as error:
                failure = error
            if got:
                link.last_received_at = time.monotonic()
                if not self._received(link, conn.receive_done(got)):
                    return
            if failure is not None:
                if link.error is None:
                    link.error = ConnectionLost(link.peer_id, f"receive failed: {failure}")
                self._drop(link)
                return
            if eof:
                self._end_of_stream(link)
                return
            if drained:
                return

    def write_now(self, link: Link) -> None:
        """Write queued output until done or the socket is full (link lock held)."""
        if not isinstance(link, SocketLink):
            raise TypeError(f"a socket transport was given a link it does not own: {link!r}")
        if link.dropped or link.tls_handshaking:
            return
        conn = link.conn
        sock = link.sock
        tls = link.tls
        gather = self._gather
        blocked = conn.bytes_queued > 0
        while blocked:
            buffers = conn.outgoing()
            try:
                if tls is not None:
                    sent = tls.send(self._tls_chunk(buffers))
                elif gather:
                    sent = sock.sendmsg(buffers)
                else:
                    sent = sock.send(buffers[0])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError,
                    ssl.SSLWantReadError):
                sent = 0
            except OSError as error:
                if link.error is None:
                    link.error = ConnectionLost(link.peer_id, f"send failed: {error}")
                link.write_blocked = True
                if self.on_io_thread:
                    self._drop(link)
                return
            if not sent:
                break
            blocked = conn.sent(sent)
        if link.ack_hold_until and not blocked:
            link.ack_hold_until = 0.0  # the held ACKs left with this write
            self._held.discard(link)
        link.write_blocked = blocked
        if blocked != link.write_registered and self.on_io_thread:
            self._selector.modify(link.sock, _READ | _WRITE if blocked else _READ, link)
            link.write_registered = blocked

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

    def _release(self, link: Link) -> None:
        link = _socket_link(link)
        self._held.discard(link)
        try:
            self._selector.unregister(link.sock)
        except (KeyError, ValueError):
            pass
        try:
            link.sock.close()
        except OSError:
            pass


def _want_write() -> ssl.SSLWantWriteError:
    return ssl.SSLWantWriteError(ssl.SSL_ERROR_WANT_WRITE,
                                 "the socket cannot take the TLS output yet")


class _TLSStream:
    """A TLS link's socket: OpenSSL over memory BIOs (``ssl.SSLObject``), not an SSLSocket.

    An SSLSocket reads every record with two ``read`` calls (its header, then its body) and
    writes every record with a ``write`` of its own: about 130 syscalls per MiB received and
    64 per MiB sent. Here up to _TLS_FILL bytes of ciphertext are taken from the socket per
    ``recv`` and records are decrypted from memory, and up to _TLS_WRITE bytes of plaintext
    are encrypted at once and sent with one ``send``.

    It offers the calls the transport makes on an SSLSocket, with the same outcomes:
    ``do_handshake``, ``recv_into`` (0 at the end of the stream, with or without the peer's
    close_notify), ``send`` (like a non-blocking SSL_write: until all the ciphertext of a
    send is in the socket it raises ``SSLWantWriteError`` and the caller retries with the
    same data, so a closing link waits for it like for any unsent output), ``fileno`` and
    ``close``; ``SSLWantReadError``/``SSLWantWriteError`` when the socket is not ready,
    ``SSLError`` or ``OSError`` on failure. Only the I/O thread reads (the scratch buffer is
    the transport's); writes happen under the link's lock.
    """

    __slots__ = ("sock", "tls", "incoming", "outgoing", "scratch", "unsent", "encrypted")

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_side: bool,
                 hostname: str | None, scratch: memoryview) -> None:
        self.sock = sock
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=server_side,
                                    server_hostname=hostname)
        self.scratch = scratch
        self.unsent = memoryview(b"")  # ciphertext out of the outgoing BIO, not yet sent
        self.encrypted = 0  # plaintext bytes of the pending send() (its ciphertext unsent)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    @property
    def buffered(self) -> bool:
        """Input already taken from the socket (a readable event will not report it)."""
        return bool(self.incoming.pending or self.tls.pending())

    def do_handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if not self._flush():
                    raise _want_write() from None
                if not self._fill():
                    raise
            except ssl.SSLError:
                try:
                    self._flush()  # the alert that says why, as an SSLSocket sends it
                except OSError:
                    pass
                raise
        if not self._flush():
            raise _want_write()

    def recv_into(self, buffer: memoryview, fill: bool = True) -> int:
        """Decrypt into buffer what has arrived; from the socket too unless ``fill`` is
        false (then ``SSLWantReadError`` once what was already taken is read)."""
        while True:
            try:
                # With a buffer, SSLObject.read returns the count (typeshed says bytes).
                return cast(int, self.tls.read(len(buffer), buffer))
            except ssl.SSLWantReadError:
                if not (fill and self._fill()):
                    raise
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return 0

    def send(self, data: Buffer) -> int:
        if not self.encrypted:
            view = memoryview(data).cast("B")
            self.encrypted = self.tls.write(view[:_TLS_WRITE] if len(view) > _TLS_WRITE
                                            else view)
        if not self._flush():
            raise _want_write()
        count, self.encrypted = self.encrypted, 0
        return count

    def _fill(self) -> bool:
        """Move what the socket holds (up to _TLS_FILL bytes) into the incoming BIO; False
        when it holds nothing yet."""
        try:
            count = self.sock.recv_into(self.scratch)
        except (BlockingIOError, InterruptedError):
            return False
        if not count:
            self.incoming.write_eof()
            return True
        self.incoming.write(self.scratch[:count])
        if self.outgoing.pending:
            # What reading made OpenSSL say (post-handshake messages). A failure to send it
            # is the next send's to report: this is a read.
            try:
                self._flush()
            except OSError:
                pass
        return True

    def _flush(self) -> bool:
        """Send the ciphertext not sent yet; True when all of it is in the socket."""
        while True:
            if not self.unsent:
                if not self.outgoing.pending:
                    return True
                self.unsent = memoryview(self.outgoing.read())
            try:
                count = self.sock.send(self.unsent)
            except (BlockingIOError, InterruptedError):
                return False
            self.unsent = self.unsent[count:]


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


def _connect_error(code: int, family: int) -> str:
    """A connect() errno as a sentence that says what it means for a netq client: "refused"
    only when the kernel said so (ECONNREFUSED: a reset in answer to our SYN, or no socket
    listening on the file)."""
    text = os.strerror(code).lower()
    if code == errno.ECONNREFUSED:
        return f"{text} (nothing listens there: is the server running, on this port?)"
    if code in (errno.ENOENT,):
        return f"{text} (no socket file: is the server running?)"
    if code in (errno.EAGAIN, errno.EWOULDBLOCK):
        if family == socket.AF_UNIX:
            return (f"{text} (the server's queue of connections to accept is full: it is busy "
                    f"accepting others)")
        return f"{text} (no free local port for another connection)"
    if code in (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"{text} (the host does not answer)"
    return text


class TCPTransport(SocketTransport):
    """TCP, or TLS when ``SecurityOptions.certificate`` is set."""


class UnixTransport(SocketTransport):
    """Unix domain stream sockets: same host, no TCP/IP stack, no TLS needed."""

    family_name = "unix"

    def __init__(self, engine: EngineAPI) -> None:
        if not hasattr(socket, "AF_UNIX"):
            raise UnsupportedProtocol(
                f"Protocol.UNIX needs Unix domain sockets (socket.AF_UNIX), which Python on "
                f"{sys.platform} does not have: use Protocol.TCP on 127.0.0.1 instead")
        super().__init__(engine)

    def _address(self) -> tuple[int, SocketAddress]:
        return socket.AF_UNIX, self._options.netloc.unix_path()

    def _tune(self, sock: socket.socket) -> None:
        pass

    def _bound(self, address: SocketAddress) -> None:
        if not isinstance(address, str):
            raise TypeError(f"a Unix socket is bound to a path, not {address!r}")
        owner_only(address)  # before listen: no other user connects in between

    def _listen(self) -> None:
        path = self._options.netloc.unix_path()
        self._remove_stale(path)
        super()._listen()
        self._path: str | None = path

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
