"""The gRPC carrier: :class:`GRPCCarrier`, netq links as ``/netq.Link/Stream`` calls.

What it holds (the asyncio loop driver is :mod:`.loop`, one stream's outbound side
:mod:`.streams`, options and credentials :mod:`.config`):

- server: probe the port, bind and start a ``grpc.aio`` server with one generic handler; each
  call is a link: a task posts the requests it reads as packets (``packet_received``), the
  handler itself drains the stream;
- client: one attempt is one gRPC channel and one call (``wait_for_connection`` bounded by
  :func:`~.config.connect_timeout`); a writer task drains the stream, the attempt's task reads;
  an untrusted server certificate ends the link with :class:`AuthenticationError` (fatal);
- both: a stream that ends is reported closed once (:meth:`GRPCCarrier._ended`); packet size
  (``_packet_limit``); back-pressure (``_can_send``: the stream's outbound deque has room);
  sending a packet (``_send``: one ``bytes``, pushed on the stream); the delayed-ACK setting
  (``ack_hold``: the loop holds ACK-only output up to :data:`ACK_DELAY` while someone waits
  in ``get()``; a held link is not blocked, so the reply may be written by the caller's
  thread, ``user_threads_write``); a blocked ``get()`` leads the netq loop (``any_thread_waits``);
  close (the end marker, then a grace before a client cancels); shutdown (channels, server,
  tasks, then the loop; every gRPC object dropped at once).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket

import grpc
import grpc.aio

from ...exceptions import AuthenticationError, ConnectionLost
from ...exposure import owner_only
from ...options import CommunicatorOptions, Purpose
from ...protocol.sending import Buffer
from ..connection_failures import address_taken
from ..packets import PACKET_SIZE
from .config import (
    channel_credentials,
    channel_options,
    connect_error,
    connect_timeout,
    forget_traceback,
    grpc_target,
    security_of,
    server_credentials,
)
from .loop import STOP_TIMEOUT, LoopDrivenCarrier, outside_running_loop
from .streams import END, METHOD, PACKET_LIMIT, PATH, SERVICE, CallStream

__all__ = ("GRPCCarrier", "ACK_DELAY")

LOGGER = logging.getLogger("netq")

ACK_DELAY = 250e-6  # seconds an ACK may wait for a reply to ride along (delayed ACK)
# Seconds the ACK of a large message that said another follows may wait for it: one gRPC
# message back per few large ones instead of one each (each costs both ends a write or read).
ACK_DEFER = 0.005
_CLOSE_GRACE = 1.0  # seconds a client's closing stream gets before it is cancelled
_STOP_GRACE = 0.5  # seconds server.stop() lets handlers finish before cancelling them


class GRPCCarrier(LoopDrivenCarrier):
    """netq links as gRPC bidirectional streams, ``grpc.aio`` driven by the I/O thread."""

    # A lone put (nothing in flight) is cut into packets on the caller's thread, which queues
    # them on the stream and wakes the writer with one loop callback: no stop of the loop and
    # no pass of the netq loop on the way out (see CallStream.push).
    user_threads_write = True
    # A get() that would block runs the netq loop, and so the asyncio loop, on its own thread
    # (leader/followers): the reply it waits for is read there, with no hand-over wake-up.
    any_thread_waits = True
    # While someone waits in get(), output of nothing but ACK frames waits this long for the
    # reply to carry it in the same gRPC message (one write and one read fewer each way).
    ack_hold = ACK_DELAY
    ack_defer = ACK_DEFER

    def __init__(self, options: CommunicatorOptions, purpose: Purpose) -> None:
        self._grpc_server = None
        self._refusing = False
        self._streams: set[CallStream] = set()
        self._attempt: asyncio.Task | None = None
        super().__init__(options, purpose)

    # ----------------------------------------------------------------- server

    def _listen(self) -> None:
        self._probe_port()
        # The constructor's thread runs the loop this once; the I/O thread takes over later.
        outside_running_loop(lambda: self._run_until(self._start_server(), STOP_TIMEOUT))

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
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno != errno.EADDRINUSE:
                    raise
                raise address_taken(netloc.host, netloc.port) from None

    async def _start_server(self) -> None:
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            METHOD: grpc.stream_stream_rpc_method_handler(self._serve_stream)})
        server = grpc.aio.server(handlers=[handler],
                                 options=channel_options(self._options.connection, True))
        target = grpc_target(self._options.netloc)
        security = security_of(self._options)
        failure = None
        try:
            if security is not None:
                port = server.add_secure_port(target, server_credentials(security))
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
        netloc = self._options.netloc
        if netloc.path is not None:
            owner_only(os.fspath(netloc.path))  # bound, not yet serving: see owner_only()
        await server.start()
        self._grpc_server = server
        self.address = os.fspath(netloc.path) if netloc.path is not None else (netloc.host, port)

    async def _serve_stream(self, request_iterator, context):
        """One client's stream, for as long as it lasts."""
        if self._refusing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the netq server is closing")
        # Headers at once: the client's wait_for_connection() returns when the stream is up.
        await context.send_initial_metadata(())
        stream = CallStream(self)
        self._streams.add(stream)
        stream.opened = True
        self.channel_opened(stream, context.peer())
        reader = asyncio.ensure_future(self._read_requests(stream, request_iterator))
        try:
            await stream.drain(context.write)
        except asyncio.CancelledError:
            # The client went away (cancelled, killed, connection broken) or the server stops.
            self._ended(stream, ConnectionLost(None, "the gRPC stream was cancelled"))
            raise
        except Exception as error:  # noqa: BLE001 - a failed write is a lost link
            self._ended(stream, ConnectionLost(None, f"gRPC write failed: {error!r}"))
        finally:
            reader.cancel()
            self._streams.discard(stream)
            stream.release()
        # Returning ends the RPC with status OK after every packet written.

    async def _read_requests(self, stream: CallStream, request_iterator) -> None:
        received = self.packet_received
        try:
            async for packet in request_iterator:
                received(stream, packet)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001
            self._ended(stream, ConnectionLost(None, f"gRPC read failed: {error!r}"))
        else:
            self._ended(stream, None)  # the client half-closed: a clean end

    def _stop_listening(self) -> None:
        self._refusing = True

    # ----------------------------------------------------------------- client

    def _start_connect(self) -> None:
        # The netq loop's thread may not be running the asyncio loop now (a caller leads it).
        self.call_soon(self._begin_attempt)

    def _begin_attempt(self) -> None:
        self._attempt = self._loop.create_task(self._open_stream())

    async def _open_stream(self) -> None:
        connection = self._options.connection
        options = channel_options(connection, False)
        security = security_of(self._options)
        target = grpc_target(self._options.netloc)
        if security is not None:
            if security.server_hostname is not None:
                options.append(("grpc.ssl_target_name_override", security.server_hostname))
            channel = grpc.aio.secure_channel(target, channel_credentials(security),
                                              options=options)
        else:
            channel = grpc.aio.insecure_channel(target, options=options)
        call = channel.stream_stream(PATH)()
        try:
            # A server that accepted TCP but never answers (frozen) must not hold us forever.
            await asyncio.wait_for(call.wait_for_connection(), connect_timeout(connection))
        except (TimeoutError, grpc.aio.AioRpcError) as failure:
            forget_traceback(failure)
            call.cancel()
            await channel.close(None)
            error = connect_error(failure)
            if isinstance(error, AuthenticationError):
                # Retrying cannot help: end a link with the reason, which the engine makes
                # fatal (every put and get fails with it, as on TCP).
                stream = CallStream(self)
                stream.opened = True
                self.channel_opened(stream, self._options.netloc)
                self._ended(stream, error)
                stream.release()
            else:
                self.connect_failed(error)
            return
        except asyncio.CancelledError as cancelled:
            call.cancel()
            await channel.close(None)
            forget_traceback(cancelled)  # see below
            call = channel = None
            raise
        stream = CallStream(self)
        stream.call = call
        stream.grpc_channel = channel
        # A cancelled task keeps its CancelledError, whose traceback keeps the frames it
        # passed (gRPC's own among them), and they keep the call: the cancelled coroutines
        # forget that traceback, and the gRPC objects are held by the stream only, so that
        # they go with it rather than at the next garbage collection (gRPC's process-wide
        # poller, its sockets and threads live as long as any channel does).
        del call, channel
        self._streams.add(stream)
        stream.opened = True
        self.channel_opened(stream, self._options.netloc)
        stream.writer = asyncio.ensure_future(self._client_writer(stream))
        await self._client_reader(stream)

    async def _client_writer(self, stream: CallStream) -> None:
        call = stream.call
        assert call is not None  # _open_stream set it before starting us
        try:
            if await stream.drain(call.write):
                await call.done_writing()
        except asyncio.CancelledError as cancelled:
            forget_traceback(cancelled)  # see _open_stream
            raise
        except Exception as error:  # noqa: BLE001 - the reader sees the call end as well
            self._ended(stream, ConnectionLost(None, f"gRPC write failed: {error!r}"))
            call.cancel()
        finally:
            del call  # the traceback of a cancelled writer keeps this frame

    async def _client_reader(self, stream: CallStream) -> None:
        call, channel = stream.call, stream.grpc_channel
        # _open_stream set both before calling us.
        assert call is not None and channel is not None
        received = self.packet_received
        eof = grpc.aio.EOF
        error = None
        try:
            while True:
                packet = await call.read()
                if packet is eof:
                    break
                received(stream, packet)
            code = await call.code()
            if code is not grpc.StatusCode.OK:
                error = ConnectionLost(None, f"gRPC stream ended: {code.name}: "
                                                     f"{await call.details()}")
        except asyncio.CancelledError as cancelled:
            forget_traceback(cancelled)  # see _open_stream
            error = ConnectionLost(None, "the gRPC stream was cancelled")
            raise
        except grpc.aio.AioRpcError as failure:
            forget_traceback(failure)
            error = ConnectionLost(None, f"gRPC stream broke: {failure.code().name}: "
                                                 f"{failure.details()}")
        finally:
            self._ended(stream, error)
            self._streams.discard(stream)
            if stream.writer is not None:
                stream.writer.cancel()
            # Forget the gRPC objects at once (the link may live on in the engine for a while).
            stream.call = stream.grpc_channel = stream.writer = None
            stream.release()
            try:
                await channel.close(None)
            finally:
                del call, channel  # the traceback of a cancelled reader keeps this frame

    # ----------------------------------------------------------------- both

    def _ended(self, stream: CallStream, error: BaseException | None) -> None:
        """The stream is over: report its link closed, once."""
        if stream.ended or not stream.opened:
            return
        stream.ended = True
        self.channel_closed(stream, error)

    def _packet_limit(self, channel: CallStream) -> int:
        max_size = self._options.connection.max_size
        return PACKET_LIMIT if max_size >= PACKET_SIZE else max_size

    def _can_send(self, channel: CallStream) -> bool:
        return channel.has_room()

    def _send(self, channel: CallStream, parts: list[Buffer], size: int) -> None:
        """Queue one packet on the stream as one gRPC message of ``bytes`` (gRPC takes nothing
        else; it copies each message when the write starts and lets go of it when the write
        completes): a packet of one ``bytes`` as it is, any other joined into a new one.

        A packet with a large body holds its frame header too (:func:`netq.carrier.cut`), and
        the receiver takes the body as a view of the packet it reads. Joining the header to
        the body costs this side a copy of the body; sending them as two gRPC messages would
        cost each side a write or a read more, and a pass of both loops, which is more."""
        channel.push(parts[0] if len(parts) == 1 and type(parts[0]) is bytes
                     else b"".join(parts))

    def _close_channel(self, channel: CallStream) -> None:
        stream = channel
        if stream.closing:
            return
        stream.closing = True
        stream.ended = True  # the loop dropped the link: no channel_closed for it any more
        stream.push(END)  # the writer sends what is queued, then ends the stream
        call = stream.call
        if call is not None and not call.done() and not self._loop_closed:
            # Client: the server ends the stream once it has read our end; if it does not
            # within the grace (frozen, cut off), cancel it.
            self.call_soon(lambda: self._loop.call_later(_CLOSE_GRACE, call.cancel))

    def _stop_carrier(self) -> None:
        if not self._loop_closed:
            # The I/O thread at the end, or the constructor's thread when binding failed.
            outside_running_loop(self._stop_loop)

    def _stop_loop(self) -> None:
        try:
            self._run_until(self._shutdown_grpc(), STOP_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - closing must go on
            LOGGER.warning("netq %s: gRPC shutdown: %r", self._purpose.value, error)
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
        super()._close_loop()
        # Drop every gRPC object now: the communicator and its transport reference each
        # other, so without this they would live (and keep gRPC's process-wide poller, its
        # sockets and threads) until the next cyclic garbage collection.
        self._grpc_server = None
        self._attempt = None
        for stream in self._streams:
            stream.call = stream.grpc_channel = stream.writer = None
        self._streams.clear()
