"""The raw-socket floor of net-queue's iops scenarios (``bench/iops.py --lib raw``).

The few names ``bench/iops.py`` uses of a queue library (``new``, ``Protocol``, ``Purpose``,
``CommunicatorOptions``, ``NetworkLocation``; a communicator's ``put``, ``get`` and ``with``),
over one plain blocking TCP socket and nothing else: no serializer, no acknowledgements, no
credit, no I/O thread. A message is an 8-byte length and the bytes of the caller's buffer,
sent from that buffer (``sendmsg`` of the header and a view of the array: no copy in user
space) on the caller's thread; ``get()`` reads the length and then the bytes straight into a
buffer of that size, reused for every message of that size (the scenario drops each message
at once: no user-space pass, no page faults after the first of each size). What the kernel
copies both ways is all it costs, so a library's Gbps over this row is how close it comes to
the machine.

Both directions run at once in ``async`` mode: the put thread and the get thread share the
socket (a blocking socket's send and receive sides are independent). ``None`` (the handshake
of the scenario) travels as a length with the top bit set and no bytes.
"""

from __future__ import annotations

import enum
import socket
import struct
import threading
from typing import Any, NamedTuple

__all__ = ("new", "Protocol", "Purpose", "CommunicatorOptions", "NetworkLocation")

_LENGTH = struct.Struct("!Q")
_NONE = 1 << 63  # the length word of a None message
_WAIT_S = 60.0  # bound on accepting the client: a hang fails the measurement, not the run


class Protocol(enum.Enum):
    TCP = "tcp"


class Purpose(enum.Enum):
    SERVER = "server"
    CLIENT = "client"


class NetworkLocation(NamedTuple):
    host: str = "127.0.0.1"
    port: int = 0


class CommunicatorOptions(NamedTuple):
    id: Any = None
    netloc: NetworkLocation = NetworkLocation()


class Message(NamedTuple):
    peer: Any
    data: Any


class RawCommunicator:
    """One TCP connection: a server listens at once and accepts its one client on first use
    (``bench/iops.py`` says READY after ``new()``), a client connects."""

    def __init__(self, purpose: Purpose, options: CommunicatorOptions) -> None:
        address = (options.netloc.host, options.netloc.port)
        self._listener: socket.socket | None = None
        self._sock: socket.socket | None = None
        if purpose is Purpose.SERVER:
            self._listener = socket.create_server(address)
            self._listener.settimeout(_WAIT_S)
        else:
            self._sock = self._tuned(socket.create_connection(address, timeout=_WAIT_S))
        self._accept_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._header = bytearray(_LENGTH.size)
        self._buffers: dict[int, memoryview] = {}  # size -> the buffer reused for it

    @staticmethod
    def _tuned(sock: socket.socket) -> socket.socket:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _connection(self) -> socket.socket:
        sock = self._sock
        if sock is None:
            with self._accept_lock:
                if self._sock is None:
                    assert self._listener is not None
                    self._sock = self._tuned(self._listener.accept()[0])
                    self._listener.close()
                sock = self._sock
        return sock

    def __enter__(self) -> RawCommunicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put(self, data: Any) -> None:
        if data is None:
            views = [memoryview(_LENGTH.pack(_NONE))]
        else:
            view = memoryview(data).cast("B")
            views = [memoryview(_LENGTH.pack(len(view))), view]
        sock = self._connection()
        with self._send_lock:
            while views:
                sent = sock.sendmsg(views)
                while views and sent >= len(views[0]):
                    sent -= len(views.pop(0))
                if views and sent:  # a short write (a signal): the rest, from where it stopped
                    views[0] = views[0][sent:]

    def _read_exactly(self, sock: socket.socket, view: memoryview) -> None:
        got = 0
        while got < len(view):
            count = sock.recv_into(view[got:])
            if not count:
                raise EOFError("the peer closed the connection")
            got += count

    def get(self) -> Message:
        sock = self._connection()
        self._read_exactly(sock, memoryview(self._header))
        (length,) = _LENGTH.unpack(self._header)
        if length == _NONE:
            return Message(None, None)
        buffer = self._buffers.get(length)
        if buffer is None:
            buffer = self._buffers[length] = memoryview(bytearray(length))
        self._read_exactly(sock, buffer)
        return Message(None, buffer)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        sock = self._sock
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the peer is gone already: nothing left to flush
        sock.close()


def new(protocol: Protocol, purpose: Purpose, options: CommunicatorOptions) -> RawCommunicator:
    assert protocol is Protocol.TCP
    return RawCommunicator(purpose, options)
