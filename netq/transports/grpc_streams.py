"""gRPC transport: one bidirectional stream of raw-bytes messages per link (``Protocol.GRPC``).

The service is ``netq.Link/Stream``, served through a generic method handler with no
(de)serializers: no protobuf, no generated code. Each gRPC message carries a slice of the
link's netq byte stream: a packet of 1 MiB of body plus its frame header (:data:`PACKET_LIMIT`),
or small packets joined up to :data:`MESSAGE_LIMIT` (1 MiB + 64 KiB), the message-size limit set
on both ends, so nothing ever meets gRPC's 4 MiB default.

Push, never poll: a client opens one long-lived stream and the server writes to it as soon as
netq has a packet for it. A new stream is a new link (the engine resumes the session); a stream
that ends is a closed link: cleanly when the peer half-closes, as :class:`ConnectionLost` when
it is cancelled or its connection breaks (a killed client's TCP connection closes and the
server's handler is cancelled within milliseconds; gRPC keepalive and netq's heartbeat catch a
peer that goes silent without closing).

Threads: none of our own beyond the base's I/O thread. ``grpc.aio`` runs on an asyncio loop
that the I/O thread itself drives while it waits (``_wait`` runs the loop until the carrier
posts something, a user thread wakes it, or the engine's timeout expires). Packets therefore go
from the engine to ``call.write`` and from ``call.read`` to the engine without a thread
hand-off, and a server holds any number of clients on its one thread (a synchronous grpc server
would pin one pool thread per open stream). gRPC's own C-core threads and its aio poller thread
are gRPC's, process-wide, and not ours to stop.

Flow control: ``_send_packet`` appends to the stream's outbound deque; a writer task awaits
``write()``, which waits for HTTP/2 flow control. The engine stops handing packets to a stream
whose deque holds :data:`OUTBOUND_LIMIT` bytes and is woken when it drains below half. Each
write waits for its completion; packets that queue up meanwhile go out joined as one gRPC
message (a packet is a byte-stream slice, so joining neighbours is lossless). netq's credits
bound what a peer may have in flight, so memory stays bounded on both ends.

Security: TLS and mutual TLS from :class:`netq.SecurityOptions` (server: ``certificate``/``key``,
``client_ca`` requires client certificates; client: trusts ``certificate``, presents
``client_certificate``/``key``, checks ``server_hostname``). A server certificate the client
does not trust is fatal (:class:`AuthenticationError`, as on TCP). The authkey handshake is the
protocol core's, inside the stream. ``NetworkLocation(path=...)`` listens/connects on a Unix
socket (``unix:`` target) instead of TCP.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import socket
import threading

# gRPC's C core logs connection events (GOAWAY, ...) to stderr at INFO; keep it to errors unless
# the user asked for more. Only effective if grpc was not imported before this module.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

try:
    import grpc  # noqa: E402  (absolute: this module is not called grpc, so cannot shadow it)
    import grpc.aio  # noqa: E402
except ImportError as missing:  # pragma: no cover - depends on the installation
    raise ImportError("Protocol.GRPC needs grpcio: pip install 'netq[grpc]' "
                      f"(grpcio==1.85.1): {missing}") from missing

from ..exceptions import AuthenticationError, ConnectionLost  # noqa: E402
from .packets import PACKET_SIZE, PacketTransport  # noqa: E402

__all__ = ("GRPCTransport", "SERVICE", "METHOD", "OUTBOUND_LIMIT", "MESSAGE_LIMIT", "PACKET_LIMIT")

LOGGER = logging.getLogger("netq")

SERVICE = "netq.Link"
METHOD = "Stream"
PATH = f"/{SERVICE}/{METHOD}"
MESSAGE_LIMIT = PACKET_SIZE + 64 * 1024  # bytes per gRPC message, both ways, both ends
# A packet carries 1 MiB of message body plus the frame header and descriptor in front of it,
# so a 1 MiB message is one gRPC message rather than 1 MiB and a 40-byte tail.
PACKET_LIMIT = PACKET_SIZE + 4096
OUTBOUND_LIMIT = 4 * PACKET_SIZE  # bytes queued per stream before the engine holds back
ACK_DELAY = 250e-6  # seconds an ACK may wait for a reply to ride along (delayed ACK)
_CLOSE_GRACE = 1.0  # seconds a client's closing stream gets before it is cancelled
_STOP_GRACE = 0.5  # seconds server.stop() lets handlers finish before cancelling them
_STOP_TIMEOUT = 10.0  # seconds the final shutdown of the carrier may take at most
_KEEPALIVE_MS = 10_000  # HTTP/2 PING after 10 s without traffic ...
_KEEPALIVE_TIMEOUT_MS = 5_000  # ... and the connection is dead if it is not answered in 5 s
# Fatal TLS verdicts on the client: the server is not who the trusted certificate says.
_UNTRUSTED = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed",
              "Hostname Verification Check failed", "is not in peer certificate")
_END = None  # outbound marker: no more packets, finish the stream


def _outside_running_loop(function):
    """``function()``, on a helper thread when the calling thread is inside an event loop.

    The transport's own loop runs on the constructor's thread once (the server binds) and on
    a closing thread once (shutdown). asyncio lets only one loop run per thread, and a Jupyter
    kernel runs every cell inside its loop (so does a coroutine calling ``netq.aio.new``):
    there our loop runs on a short-lived thread that the caller waits for.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return function()
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, function()))
        except BaseException as error:  # noqa: BLE001 - re-raised on the caller's thread
            outcome.append((False, error))

    helper = threading.Thread(target=run, name="netq-grpc-setup", daemon=True)
    helper.start()
    helper.join()
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    return value


def _connect_timeout(connection) -> float:
    """Seconds a new channel may take to become ready (a frozen server must not hold us)."""
    return max(1.0, 3 * connection.heartbeat)


def _channel_options(connection, server: bool) -> list[tuple[str, object]]:
    options = [
        ("grpc.max_send_message_length", MESSAGE_LIMIT),
        ("grpc.max_receive_message_length", MESSAGE_LIMIT),
        ("grpc.keepalive_time_ms", _KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", _KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.bdp_probe", 1),
        ("grpc.http2.max_frame_size", PACKET_SIZE),  # HTTP/2 frames of up to 1 MiB, not 16 KiB
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
        # gRPC gives a connection attempt (TCP, TLS, HTTP/2 settings) max(backoff, its
        # "min reconnect backoff") to complete: that option is its minimum connect timeout.
        # Set to our backoff, a handshake needing more than reconnect_max (a TLS channel over
        # a 300 ms round trip) never completed. Give it what the I/O thread waits for.
        connect_ms = int(_connect_timeout(connection) * 1000)
        options += [
            # One TCP connection per client communicator, even with many in one process
            # (gRPC would otherwise multiplex every channel to one target over one connection,
            # and one broken connection would take every client down at once).
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", reconnect_ms),
            ("grpc.min_reconnect_backoff_ms", max(reconnect_ms, connect_ms)),
            ("grpc.max_reconnect_backoff_ms",
             max(reconnect_ms, int(connection.reconnect_max * 1000))),
        ]
    return options


def _read_file(path) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as file:
        return file.read()


def _forget_traceback(error: BaseException) -> None:
    """Break the cycle a caught gRPC error closes (its traceback holds the frames that hold
    the call and the channel), so they are freed now rather than at the next garbage
    collection: gRPC's process-wide poller (a thread, sockets) lives as long as they do."""
    for _ in range(8):  # the chain of causes is short; never loop on a malformed one
        if error is None:
            return
        error.__traceback__ = None
        error = error.__context__ or error.__cause__


class _Stream:
    """One gRPC stream carrying one link, and its outbound deque (all on the I/O thread)."""

    __slots__ = ("transport", "packets", "queued", "drained", "ready", "waiting", "blocked",
                 "link", "ended", "closing", "call", "grpc_channel", "writer", "hold_until",
                 "hold_bytes", "hold_timer")

    def __init__(self, transport: GRPCTransport) -> None:
        self.transport = transport
        self.packets: collections.deque = collections.deque()
        self.queued = 0  # bytes pushed
        self.drained = 0  # bytes written to gRPC
        self.ready = asyncio.Event()
        self.waiting = False  # the writer sleeps on ``ready``
        self.blocked = False  # the engine holds packets back until the backlog shrinks
        self.link = None
        self.ended = False  # the link was reported closed, or released by the base
        self.closing = False  # _close_channel ran
        self.call = None  # client: the grpc.aio call
        self.grpc_channel = None  # client: the grpc.aio channel of this stream
        self.writer: asyncio.Task | None = None  # client: the writer task
        self.hold_until: float | None = None  # loop time until which acknowledgements wait
        self.hold_bytes = 0  # bytes queued on the link when the hold began
        self.hold_timer: asyncio.TimerHandle | None = None  # ends the hold

    def push(self, packet) -> None:
        self.packets.append(packet)
        if packet is not _END:
            self.queued += len(packet)
        if self.waiting:
            self.waiting = False
            self.ready.set()

    def has_room(self) -> bool:
        if self.queued - self.drained < OUTBOUND_LIMIT:
            return True
        self.blocked = True
        return False

    async def drain(self, write) -> bool:
        """Write packets until the end marker (True); a failed write raises."""
        packets = self.packets
        ready = self.ready
        while True:
            if not packets:
                ready.clear()
                self.waiting = True
                await ready.wait()
                continue
            packet = packets.popleft()
            if packet is _END:
                return True
            size = len(packet)
            if packets and packets[0] is not _END and size + len(packets[0]) <= MESSAGE_LIMIT:
                # Packets that queued up while the previous write was in flight (ACK and
                # CREDIT frames, small messages, the tail of one message and the head of the
                # next) go as one gRPC message: a packet is a slice of the byte stream, so
                # joining neighbours is lossless, and each write waits for its completion,
                # which costs far more than the join.
                parts = [packet]
                while packets and packets[0] is not _END \
                        and size + len(packets[0]) <= MESSAGE_LIMIT:
                    part = packets.popleft()
                    parts.append(part)
                    size += len(part)
                packet = b"".join(parts)
            await write(packet)
            self.drained += size
            if self.blocked and self.queued - self.drained < OUTBOUND_LIMIT // 2:
                self.blocked = False
                self.transport.wake()


class GRPCTransport(PacketTransport):
    """netq links as gRPC bidirectional streams, ``grpc.aio`` driven by the I/O thread."""

    family_name = "grpc"

    def __init__(self, engine) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop_waiting = False  # the I/O thread is inside loop.run_forever() in _wait
        self._wake_pending = False  # a stop of the loop is on its way from another thread
        self._grpc_server = None
        self._refusing = False
        self._streams: set[_Stream] = set()
        self._attempt: asyncio.Task | None = None
        self._loop_closed = False
        super().__init__(engine)

    # ----------------------------------------------------------------- the loop

    def wake(self) -> None:
        if self._loop_waiting and threading.get_ident() == self._io_ident:
            self._loop.stop()  # a carrier callback: return to the engine after this turn
        elif self._idle and not self._wake_pending and not self._loop_closed:
            # Sticky: if the I/O thread has not entered the loop yet, the stop runs first thing.
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:
                pass  # the loop is closed: the I/O thread is gone

    def _sleep(self, timeout: float) -> None:
        loop = self._loop
        if self._inbox or timeout <= 0:
            # Still give gRPC a turn: queued writes go out, completed reads come in.
            loop.call_soon(loop.stop)
            loop.run_forever()
        else:
            timer = loop.call_later(timeout, loop.stop)
            self._loop_waiting = True
            try:
                loop.run_forever()
            finally:
                self._loop_waiting = False
                timer.cancel()
        self._wake_pending = False

    def _run_until(self, coroutine, timeout: float):
        """Run ``coroutine`` to completion on the loop (thread not in the loop); its result."""
        loop = self._loop
        task = loop.create_task(coroutine)
        task.add_done_callback(lambda _: loop.stop())
        timer = loop.call_later(timeout, loop.stop)
        deadline = loop.time() + timeout
        try:
            while not task.done() and loop.time() < deadline:
                loop.run_forever()  # a stray stop (a late wake-up) only costs a turn
        finally:
            timer.cancel()
        if not task.done():
            task.cancel()
            raise TimeoutError(f"gRPC did not finish within {timeout} s")
        return task.result()

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
        self._probe_port()
        # The constructor's thread runs the loop this once; the I/O thread takes over later.
        _outside_running_loop(lambda: self._run_until(self._start_server(), _STOP_TIMEOUT))

    def _probe_port(self) -> None:
        """Raise OSError now if the port is taken. gRPC reports a failed bind too, but its
        failure path leaves process-wide state behind (sockets that are never closed)."""
        netloc = self._options.netloc
        if netloc.path is not None or netloc.port == 0:
            return
        family, kind, proto, _, address = socket.getaddrinfo(
            netloc.host, netloc.port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
            probe.bind(address)

    async def _start_server(self) -> None:
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            METHOD: grpc.stream_stream_rpc_method_handler(self._serve_stream)})
        server = grpc.aio.server(handlers=[handler],
                                 options=_channel_options(self._options.connection, True))
        target = self._target()
        security = self._security()
        failure = None
        try:
            if security is not None:
                port = server.add_secure_port(target, self._server_credentials(security))
            else:
                port = server.add_insecure_port(target)
        except RuntimeError as error:
            failure = str(error)
        if failure is not None:
            # Raised outside the except block and without the server in any frame: the error
            # reaches the caller of netq.new() without holding gRPC objects alive.
            await server.stop(None)
            del server
            raise OSError(errno.EADDRINUSE, f"gRPC could not bind {target}: {failure}")
        await server.start()
        self._grpc_server = server
        netloc = self._options.netloc
        self.address = os.fspath(netloc.path) if netloc.path is not None else (netloc.host, port)

    async def _serve_stream(self, request_iterator, context):
        """One client's stream, for as long as it lasts."""
        if self._refusing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the netq server is closing")
        # Headers at once: the client's wait_for_connection() returns when the stream is up.
        await context.send_initial_metadata(())
        stream = _Stream(self)
        self._streams.add(stream)
        link = stream.link = self.channel_opened(stream, context.peer())
        reader = asyncio.ensure_future(self._read_requests(stream, request_iterator))
        try:
            await stream.drain(context.write)
        except asyncio.CancelledError:
            # The client went away (cancelled, killed, connection broken) or the server stops.
            self._ended(stream, ConnectionLost(link.peer_id, "the gRPC stream was cancelled"))
            raise
        except Exception as error:  # noqa: BLE001 - a failed write is a lost link
            self._ended(stream, ConnectionLost(link.peer_id, f"gRPC write failed: {error!r}"))
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
            self._ended(stream, ConnectionLost(link.peer_id, f"gRPC read failed: {error!r}"))
        else:
            self._ended(stream, None)  # the client half-closed: a clean end

    def _stop_listening(self) -> None:
        self._refusing = True

    # ----------------------------------------------------------------- client

    def _start_connect(self) -> None:
        self._attempt = self._loop.create_task(self._open_stream())

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
            await asyncio.wait_for(call.wait_for_connection(), _connect_timeout(connection))
        except (grpc.aio.AioRpcError, asyncio.TimeoutError) as failure:
            _forget_traceback(failure)
            call.cancel()
            await channel.close(None)
            error = self._connect_error(failure)
            if isinstance(error, AuthenticationError):
                # Retrying cannot help: end a link with the reason, which the engine makes
                # fatal (every put and get fails with it, as on TCP).
                stream = _Stream(self)
                stream.link = self.channel_opened(stream, self._options.netloc)
                self._ended(stream, error)
            else:
                self.connect_failed(error)
            return
        except asyncio.CancelledError:
            call.cancel()
            await channel.close(None)
            raise
        stream = _Stream(self)
        stream.call = call
        stream.grpc_channel = channel
        self._streams.add(stream)
        stream.link = self.channel_opened(stream, self._options.netloc)
        stream.writer = asyncio.ensure_future(self._client_writer(stream))
        await self._client_reader(stream)

    @staticmethod
    def _connect_error(failure: BaseException):
        if isinstance(failure, asyncio.TimeoutError):
            return ConnectionLost(None, "gRPC: the server did not answer")
        text = f"{failure.details()} {failure.debug_error_string()}"
        if any(marker in text for marker in _UNTRUSTED):
            return AuthenticationError(
                f"TLS: the server's certificate is not trusted: {failure.details()}")
        return ConnectionLost(None, f"gRPC: {failure.code().name}: {failure.details()}")

    async def _client_writer(self, stream: _Stream) -> None:
        call = stream.call
        try:
            if await stream.drain(call.write):
                await call.done_writing()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the reader sees the call end as well
            self._ended(stream, ConnectionLost(stream.link.peer_id,
                                               f"gRPC write failed: {error!r}"))
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
            _forget_traceback(failure)
            error = ConnectionLost(link.peer_id, f"gRPC stream broke: {failure.code().name}: "
                                                 f"{failure.details()}")
        finally:
            self._ended(stream, error)
            self._streams.discard(stream)
            if stream.writer is not None:
                stream.writer.cancel()
            channel = stream.grpc_channel
            # Forget the gRPC objects at once (the link may live on in the engine for a while).
            stream.call = stream.grpc_channel = stream.writer = None
            await channel.close(None)

    # ----------------------------------------------------------------- both

    def _ended(self, stream: _Stream, error) -> None:
        """The stream is over: report its link closed, once."""
        if stream.ended or stream.link is None:
            return
        stream.ended = True
        self.channel_closed(stream.link, error)

    def _packet_limit(self, link) -> int:
        max_size = self._options.connection.max_size
        return PACKET_LIMIT if max_size >= PACKET_SIZE else max_size

    def _can_send(self, link) -> bool:
        stream: _Stream = link.channel
        if not stream.has_room():
            return False
        hold_until = stream.hold_until
        if hold_until is not None:
            if self._loop.time() < hold_until and link.conn.bytes_queued == stream.hold_bytes:
                return False  # still nothing but the held ACK frames
            self._release_hold(stream)
            return True
        if link.direct_ok and self.engine._getters and link.conn.output_is_only_acks():
            # Delayed acknowledgement: someone is blocked in get() for the message this ACK
            # answers and will likely reply at once; the reply then carries the ACK in the
            # same gRPC message (one write and one read fewer each way, and the reply does
            # not queue behind the ACK's write). Never longer than ACK_DELAY, and only while
            # nothing but ACK frames is queued (never CREDIT: a sender may be waiting for it).
            stream.hold_until = self._loop.time() + ACK_DELAY
            stream.hold_bytes = link.conn.bytes_queued
            stream.hold_timer = self._loop.call_later(ACK_DELAY, self.wake)
            return False
        return True

    @staticmethod
    def _release_hold(stream: _Stream) -> None:
        stream.hold_until = None
        if stream.hold_timer is not None:
            stream.hold_timer.cancel()  # no wake-up for an ACK that already left
            stream.hold_timer = None

    def _send_packet(self, link, payload: bytes) -> None:
        link.channel.push(payload)

    def _close_channel(self, link) -> None:
        stream: _Stream = link.channel
        if stream.closing:
            return
        stream.closing = True
        stream.ended = True  # the base dropped the link: no channel_closed for it any more
        stream.push(_END)  # the writer sends what is queued, then ends the stream
        call = stream.call
        if call is not None and not call.done() and not self._loop_closed:
            # Client: the server ends the stream once it has read our end; if it does not
            # within the grace (frozen, cut off), cancel it.
            self._loop.call_later(_CLOSE_GRACE, call.cancel)

    def _stop_carrier(self) -> None:
        if not self._loop_closed:
            # The I/O thread at the end, or the constructor's thread when binding failed.
            _outside_running_loop(self._stop_loop)

    def _stop_loop(self) -> None:
        try:
            self._run_until(self._shutdown_grpc(), _STOP_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - closing must go on
            LOGGER.warning("netq %s: gRPC shutdown: %r", self.engine.purpose.value, error)
        finally:
            self._close_loop()

    async def _shutdown_grpc(self) -> None:
        attempt = self._attempt
        if attempt is not None and not attempt.done():
            attempt.cancel()
        # Close every client channel (its calls are cancelled and finish), then the server
        # (handlers already have their end marker: they return at once).
        for stream in list(self._streams):
            if stream.grpc_channel is not None:
                await stream.grpc_channel.close(None)
        if self._grpc_server is not None:
            await self._grpc_server.stop(_STOP_GRACE)
        tasks = [task for task in asyncio.all_tasks(self._loop)
                 if task is not asyncio.current_task()]
        if attempt is not None:
            tasks.append(attempt)
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_GRACE)
        # Let gRPC deliver the completions of what was just cancelled to this loop while it
        # still runs (a completion for a closed loop is reported as an error by gRPC).
        await asyncio.sleep(0.01)

    def _close_loop(self) -> None:
        loop = self._loop
        self._loop_closed = True
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            gathered = asyncio.gather(*pending, return_exceptions=True)
            gathered.add_done_callback(lambda _: loop.stop())
            timer = loop.call_later(_STOP_TIMEOUT, loop.stop)
            while not gathered.done() and not timer.cancelled():
                loop.run_forever()
                if loop.time() >= timer.when():
                    break
            timer.cancel()
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        except RuntimeError:
            pass  # a stray stop: the generators are gone with the loop anyway
        loop.close()
        # Drop every gRPC object now: the communicator and its transport reference each
        # other, so without this they would live (and keep gRPC's process-wide poller, its
        # sockets and threads) until the next cyclic garbage collection.
        self._grpc_server = None
        self._attempt = None
        for stream in self._streams:
            stream.call = stream.grpc_channel = stream.writer = None
        self._streams.clear()
