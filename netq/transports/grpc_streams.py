"""gRPC transport: one bidirectional stream of raw-bytes messages per link (``Protocol.GRPC``).

The service is ``netq.Link/Stream``, served through a generic method handler with no
(de)serializers: no protobuf, no generated code. Each gRPC message is one packet of the
link's netq byte stream (at most :data:`PACKET_SIZE` = 1 MiB); message-size limits are set on
both ends to the packet size plus a margin, so nothing ever meets gRPC's 4 MiB default.

Push, never poll: a client opens one long-lived stream; the server writes to it as soon as the
netq I/O thread hands it a packet. A new stream is a new link (the base resumes the session);
the stream ending is the link closing: cleanly when the peer half-closes, as
:class:`ConnectionLost` when it is cancelled or the connection breaks (a killed client's TCP
connection closes and the server's handler is cancelled within milliseconds; gRPC keepalive
and netq's own heartbeat catch a peer that goes silent without closing).

Threads: the communicator's netq I/O thread (the base's) plus one asyncio loop thread
(``netq-grpc-<purpose>-<id>``) that runs every gRPC call of the communicator with
``grpc.aio``: a server holds any number of clients on that one thread (no thread per stream,
unlike the synchronous server). gRPC's C-core threads are gRPC's and go away with it.

Flow control: the I/O thread puts packets into a per-link outbound deque; the loop writes them
with ``await write()``, which waits for HTTP/2 flow control. The I/O thread stops handing
packets to a link whose deque holds :data:`OUTBOUND_LIMIT` bytes, and is woken when it
drains below half of that. On top of that, netq's credits bound what a peer may have in
flight, so memory is bounded on both ends.

Security: TLS and mutual TLS from :class:`netq.SecurityOptions` (``certificate``/``key`` for
the server, ``client_ca`` to require client certificates; a client trusts ``certificate``,
presents ``client_certificate``/``key``, checks ``server_hostname``); a server certificate the
client does not trust is fatal (:class:`AuthenticationError`), as on TCP. The authkey
handshake is the protocol core's, inside the stream.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import threading
import time

# gRPC's C core logs connection events (GOAWAY, ...) to stderr at INFO; keep it to errors unless
# the user asked for more. Only effective if grpc was not imported before netq's transport.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc  # noqa: E402  (absolute: this module is not called grpc, it does not shadow it)
import grpc.aio  # noqa: E402

from ..exceptions import AuthenticationError, ConnectionLost  # noqa: E402
from .packets import PACKET_SIZE, PacketTransport  # noqa: E402

__all__ = ("GRPCTransport", "SERVICE", "METHOD", "OUTBOUND_LIMIT", "MESSAGE_LIMIT")

LOGGER = logging.getLogger("netq")

SERVICE = "netq.Link"
METHOD = "Stream"
PATH = f"/{SERVICE}/{METHOD}"
MESSAGE_LIMIT = PACKET_SIZE + 64 * 1024  # bytes per gRPC message, both ways, both ends
OUTBOUND_LIMIT = 4 * PACKET_SIZE  # bytes queued per link for the loop before the I/O thread waits
_CLOSE_GRACE = 1.0  # seconds a closing stream gets to deliver its last packets
_STOP_GRACE = 0.5  # seconds server.stop() lets calls finish before cancelling them
_JOIN_TIMEOUT = 10.0  # seconds to wait for the loop thread at the very end
_KEEPALIVE_MS = 10_000  # HTTP/2 PING every 10 s on an idle connection ...
_KEEPALIVE_TIMEOUT_MS = 5_000  # ... and the connection is dead if it is not answered in 5 s
# Fatal TLS verdicts on the client: the server is not who the trusted certificate says.
_UNTRUSTED = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "is not in peer certificate")
_END = None  # outbound marker: no more packets, finish the stream


def _channel_options(connection, server: bool) -> list[tuple[str, object]]:
    options = [
        ("grpc.max_send_message_length", MESSAGE_LIMIT),
        ("grpc.max_receive_message_length", MESSAGE_LIMIT),
        ("grpc.keepalive_time_ms", _KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", _KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.bdp_probe", 1),
        ("grpc.enable_retries", 0),  # a lost stream is netq's to resume, not gRPC's to replay
    ]
    if server:
        options += [
            ("grpc.so_reuseport", 0),  # a taken port must fail the bind, not be shared
            ("grpc.http2.min_ping_interval_without_data_ms", _KEEPALIVE_MS // 2),
            ("grpc.http2.min_time_between_pings_ms", _KEEPALIVE_MS // 2),
        ]
    else:
        reconnect_ms = max(1, int(connection.reconnect_min * 1000))
        options += [
            # One TCP connection per client communicator, even with many in one process
            # (gRPC would otherwise multiplex every channel to the same target over one).
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", reconnect_ms),
            ("grpc.min_reconnect_backoff_ms", reconnect_ms),
            ("grpc.max_reconnect_backoff_ms", max(reconnect_ms,
                                                  int(connection.reconnect_max * 1000))),
        ]
    return options


def _read_file(path) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as file:
        return file.read()


class _Stream:
    """One gRPC stream carrying one link: the outbound deque between the I/O thread and the loop.

    The I/O thread appends (``push``); the loop's writer pops. The two byte counters are each
    written by one thread only, so their difference (the backlog) needs no lock.
    """

    __slots__ = ("transport", "loop", "packets", "queued", "drained", "waiting", "signalled",
                 "ready", "blocked", "link", "ended", "closing", "call", "grpc_channel", "context",
                 "writer_done")

    def __init__(self, transport: GRPCTransport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self.packets: collections.deque = collections.deque()
        self.queued = 0  # bytes pushed (I/O thread)
        self.drained = 0  # bytes written to gRPC (loop)
        self.waiting = False  # the writer sleeps on ``ready`` (loop)
        self.signalled = False  # a wake-up of the writer is on its way (I/O thread)
        self.ready = asyncio.Event()
        self.blocked = False  # the I/O thread waits for the backlog to shrink
        self.link = None
        self.ended = False  # the link was reported closed (once only)
        self.closing = False  # _close_channel ran
        self.call = None  # client: the grpc.aio call
        self.grpc_channel = None  # client: the grpc.aio channel of this stream
        self.context = None  # server: the handler's ServicerContext
        self.writer_done: asyncio.Future | None = None

    @property
    def backlog(self) -> int:
        return self.queued - self.drained

    # -- I/O thread -------------------------------------------------------------------

    def push(self, packet) -> None:
        self.packets.append(packet)
        if packet is not _END:
            self.queued += len(packet)
        if self.waiting and not self.signalled:
            self.signalled = True
            try:
                self.loop.call_soon_threadsafe(self.ready.set)
            except RuntimeError:
                pass  # the loop is closed: the stream is gone anyway

    def has_room(self) -> bool:
        if self.backlog < OUTBOUND_LIMIT:
            return True
        self.blocked = True
        return self.backlog < OUTBOUND_LIMIT  # it may have drained meanwhile

    # -- loop ---------------------------------------------------------------------------

    async def drain(self, write) -> bool:
        """Write packets until the end marker (True) or until writing fails (False)."""
        packets = self.packets
        while True:
            if not packets:
                self.signalled = False
                self.ready.clear()
                self.waiting = True
                if not packets:
                    await self.ready.wait()
                self.waiting = False
                continue
            packet = packets.popleft()
            if packet is _END:
                return True
            await write(packet)
            self.drained += len(packet)
            if self.blocked and self.backlog < OUTBOUND_LIMIT // 2:
                self.blocked = False
                self.transport.wake()


class GRPCTransport(PacketTransport):
    """netq links as gRPC bidirectional streams (``grpc.aio`` on one loop thread)."""

    family_name = "grpc"

    def __init__(self, engine) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._run_loop,
            name=f"netq-grpc-{engine.purpose.value}-{str(engine.id)[:8]}", daemon=True)
        self._loop_thread.start()
        self._grpc_server = None
        self._refusing = False
        self._streams: set[_Stream] = set()  # loop thread only
        self._attempt = None  # client: the concurrent future of the connection attempt
        try:
            super().__init__(engine)
        except BaseException:
            self._stop_loop()
            raise

    # ----------------------------------------------------------------- the loop thread

    def _run_loop(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            # Stopped: finish whatever is still pending (cancelled calls' callbacks).
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def _on_loop(self, coroutine, timeout: float | None = None):
        """Run ``coroutine`` on the loop thread from another thread; its result."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout)

    def _stop_loop(self) -> None:
        if self._loop_thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:
                pass
            self._loop_thread.join(_JOIN_TIMEOUT)

    # ----------------------------------------------------------------- credentials

    def _security(self):
        security = self._options.security
        return security if security is not None and security.tls else None

    def _server_credentials(self, security):
        client_ca = _read_file(security.client_ca)
        return grpc.ssl_server_credentials(
            [(_read_file(security.key), _read_file(security.certificate))],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None)

    def _channel_credentials(self, security):
        client_certificate = _read_file(security.client_certificate)
        return grpc.ssl_channel_credentials(
            root_certificates=_read_file(security.certificate),
            private_key=_read_file(security.key) if client_certificate is not None else None,
            certificate_chain=client_certificate)

    def _target(self) -> str:
        netloc = self._options.netloc
        if netloc.path is not None:
            return f"unix:{os.fspath(netloc.path)}"
        host = f"[{netloc.host}]" if ":" in netloc.host else netloc.host
        return f"{host}:{netloc.port}"

    # ----------------------------------------------------------------- server

    def _listen(self) -> None:
        self._on_loop(self._start_server())

    async def _start_server(self) -> None:
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            METHOD: grpc.stream_stream_rpc_method_handler(self._serve_stream)})
        server = grpc.aio.server(handlers=[handler],
                                 options=_channel_options(self._options.connection, True))
        target = self._target()
        security = self._security()
        try:
            if security is not None:
                port = server.add_secure_port(target, self._server_credentials(security))
            else:
                port = server.add_insecure_port(target)
        except RuntimeError as error:
            await server.stop(None)
            raise OSError(errno.EADDRINUSE, f"gRPC could not bind {target}: {error}") from None
        await server.start()
        self._grpc_server = server
        netloc = self._options.netloc
        self.address = netloc.path if netloc.path is not None else (netloc.host, port)

    async def _serve_stream(self, request_iterator, context):
        """One client stream, for as long as it lasts (loop thread)."""
        if self._refusing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the netq server is closing")
        stream = _Stream(self, self._loop)
        stream.context = context
        # Headers now: the client's wait_for_connection() returns as soon as the stream is up.
        await context.send_initial_metadata(())
        self._streams.add(stream)
        stream.link = self.channel_opened(stream, context.peer())
        reader = asyncio.ensure_future(self._read_requests(stream, request_iterator))
        try:
            await stream.drain(context.write)
        except asyncio.CancelledError:
            # The client went away (cancelled, killed, connection broken) or the server stops.
            self._ended(stream, ConnectionLost(stream.link.peer_id, "the gRPC stream was cancelled"))
            raise
        except Exception as error:  # noqa: BLE001 - a failed write is a lost link
            self._ended(stream, ConnectionLost(stream.link.peer_id, f"gRPC write failed: {error}"))
        finally:
            reader.cancel()
            self._streams.discard(stream)
        # Returning ends the RPC with status OK after every packet written.

    async def _read_requests(self, stream: _Stream, request_iterator) -> None:
        link = stream.link
        received = self.packet_received
        try:
            async for packet in request_iterator:
                received(link, packet)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001
            self._ended(stream, ConnectionLost(link.peer_id, f"gRPC read failed: {error}"))
        else:
            self._ended(stream, None)  # the client half-closed: a clean end

    def _stop_listening(self) -> None:
        self._refusing = True

    # ----------------------------------------------------------------- client

    def _start_connect(self) -> None:
        self._attempt = asyncio.run_coroutine_threadsafe(self._open_stream(), self._loop)

    async def _open_stream(self) -> None:
        connection = self._options.connection
        options = _channel_options(connection, False)
        security = self._security()
        target = self._target()
        if security is not None:
            if security.server_hostname is not None:
                options.append(("grpc.ssl_target_name_override", security.server_hostname))
            channel = grpc.aio.secure_channel(target, self._channel_credentials(security),
                                              options=options)
        else:
            channel = grpc.aio.insecure_channel(target, options=options)
        call = channel.stream_stream(PATH)()
        try:
            # A server that accepted TCP but never answers (frozen) must not hold us forever.
            await asyncio.wait_for(call.wait_for_connection(),
                                   max(1.0, 3 * connection.heartbeat))
        except (grpc.aio.AioRpcError, asyncio.TimeoutError) as failure:
            call.cancel()
            await channel.close(None)
            error = self._connect_error(failure)
            if isinstance(error, AuthenticationError):
                # Retrying cannot help: end a link with the reason, which makes it fatal
                # (the engine fails every put and get with it, as on TCP).
                stream = _Stream(self, self._loop)
                stream.link = self.channel_opened(stream, self._options.netloc)
                self._ended(stream, error)
            else:
                self.connect_failed(error)
            return
        except asyncio.CancelledError:
            call.cancel()
            await channel.close(None)
            raise
        stream = _Stream(self, self._loop)
        stream.call = call
        stream.grpc_channel = channel
        self._streams.add(stream)
        stream.link = self.channel_opened(stream, self._options.netloc)
        stream.writer_done = asyncio.ensure_future(self._client_writer(stream))
        await self._client_reader(stream)

    @staticmethod
    def _connect_error(failure: BaseException):
        if isinstance(failure, asyncio.TimeoutError):
            return ConnectionLost(None, "gRPC: the server did not answer")
        text = f"{failure.details()} {failure.debug_error_string()}"
        if any(marker in text for marker in _UNTRUSTED):
            return AuthenticationError(f"TLS: the server's certificate is not trusted: "
                                       f"{failure.details()}")
        return ConnectionLost(None, f"gRPC: {failure.code().name}: {failure.details()}")

    async def _client_writer(self, stream: _Stream) -> None:
        call = stream.call
        try:
            if await stream.drain(call.write):
                await call.done_writing()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the reader sees the call's end too
            self._ended(stream, ConnectionLost(stream.link.peer_id, f"gRPC write failed: {error}"))
            call.cancel()

    async def _client_reader(self, stream: _Stream) -> None:
        call = stream.call
        link = stream.link
        received = self.packet_received
        eof = grpc.aio.EOF
        error = None
        try:
            while True:
                packet = await call.read()
                if packet is eof:
                    break
                received(link, packet)
            code = await call.code()
            if code is not grpc.StatusCode.OK:
                error = ConnectionLost(link.peer_id, f"gRPC stream ended: {code.name}: "
                                                     f"{await call.details()}")
        except asyncio.CancelledError:
            error = ConnectionLost(link.peer_id, "the gRPC stream was cancelled")
            raise
        except grpc.aio.AioRpcError as failure:
            error = ConnectionLost(link.peer_id, f"gRPC stream broke: {failure.code().name}: "
                                                 f"{failure.details()}")
        finally:
            self._ended(stream, error)
            self._streams.discard(stream)
            if stream.writer_done is not None:
                stream.writer_done.cancel()
            await stream.grpc_channel.close(None)

    # ----------------------------------------------------------------- both

    def _ended(self, stream: _Stream, error) -> None:
        """The stream is over (loop thread): report the link closed, once."""
        if stream.ended or stream.link is None:
            return
        stream.ended = True
        self.channel_closed(stream.link, error)

    def _can_send(self, link) -> bool:
        return link.channel.has_room()

    def _send_packet(self, link, payload: bytes) -> None:
        link.channel.push(payload)

    def _close_channel(self, link) -> None:
        stream: _Stream = link.channel
        if stream.closing:
            return
        stream.closing = True
        stream.ended = True  # the base dropped the link: no channel_closed for it any more
        stream.push(_END)  # the writer finishes what is queued, then ends the stream
        if stream.call is not None:
            # Client: if the server does not end the stream within the grace, cut it.
            try:
                self._loop.call_soon_threadsafe(self._loop.call_later, _CLOSE_GRACE,
                                                stream.call.cancel)
            except RuntimeError:
                pass

    def _stop_carrier(self) -> None:
        try:
            if self._grpc_server is not None:
                self._on_loop(self._grpc_server.stop(_STOP_GRACE), _JOIN_TIMEOUT)
                self._grpc_server = None
            self._on_loop(self._close_streams(), _JOIN_TIMEOUT)
        except (RuntimeError, TimeoutError) as error:  # a dead loop: stop it anyway
            LOGGER.warning("netq %s: gRPC shutdown: %s", self.engine.purpose.value, error)
        finally:
            self._stop_loop()

    async def _close_streams(self) -> None:
        for stream in list(self._streams):
            if stream.call is not None:
                stream.call.cancel()
                await stream.grpc_channel.close(None)
        attempt = self._attempt
        if attempt is not None and not attempt.done():
            attempt.cancel()
        # Give cancelled handlers and readers a turn to finish their bookkeeping.
        await asyncio.sleep(0)
