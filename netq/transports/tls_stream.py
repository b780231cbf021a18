"""A TLS link's socket: OpenSSL over memory BIOs (:class:`TLSStream`), and the scratch buffer
its ciphertext lands in on the way from the socket (:class:`Scratch`).

The byte-stream carrier (:mod:`netq.transports.sockets`) reads and writes a TLS channel
through a :class:`TLSStream` and drives its handshake by the channel's first reads and writes.
"""

from __future__ import annotations

import socket
import ssl
from typing import cast

from ..protocol.sending import Buffer

__all__ = ("Scratch", "TLSStream")

_TLS_WRITE = 256 * 1024  # plaintext encrypted per TLS send: bounds the ciphertext a link holds
_TLS_FILL = 256 * 1024  # bytes taken from a TLS link's socket per recv (many records at once)
# ... starting from this (one full record and its framing), grown 4x per recv that filled it:
# a process of many idle TLS clients keeps a small buffer each, a busy link reaches _TLS_FILL.
_TLS_FILL_FIRST = 17 * 1024


class Scratch:
    """Where TLS ciphertext lands between the socket and OpenSSL (copied into the BIO at once):
    one per carrier, as one thread at a time leads its loop; made on first use and grown up
    to _TLS_FILL by the reads that fill it."""

    __slots__ = ("_view",)

    def __init__(self) -> None:
        self._view: memoryview | None = None

    @property
    def view(self) -> memoryview:
        view = self._view
        if view is None:
            view = self._view = memoryview(bytearray(_TLS_FILL_FIRST))
        return view

    def grow(self) -> None:
        size = len(self.view)
        if size < _TLS_FILL:
            self._view = memoryview(bytearray(min(_TLS_FILL, 4 * size)))


def _want_write() -> ssl.SSLWantWriteError:
    return ssl.SSLWantWriteError(ssl.SSL_ERROR_WANT_WRITE,
                                 "the socket cannot take the TLS output yet")


class TLSStream:
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
                 hostname: str | None, scratch: Scratch) -> None:
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
            scratch = self.scratch.view
            count = self.sock.recv_into(scratch)
        except (BlockingIOError, InterruptedError):
            return False
        if not count:
            self.incoming.write_eof()
            return True
        self.incoming.write(scratch[:count])
        if count == len(scratch):
            self.scratch.grow()
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
