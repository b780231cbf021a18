"""The communicator: the queue API that user threads call.

:class:`Communicator` is the facade: ``put`` serializes once and hands the message to the
session engine (:mod:`netq.engine`, which runs the transport's I/O thread); ``get`` takes the
next message from the per-peer inboxes, fairly across peers, and deserializes it on the
caller's thread, so user code never runs on the I/O thread. ``close`` and ``statistics`` ask
the engine what is still pending. The inboxes live here; the engine fills them through the
:class:`netq.contract.Inbox` methods (``deliver``, ``wake_all``). What the loop reads of both
is plain data in one :class:`netq.contract.LoopSignals` made here and handed to both.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from . import _shm, live
from .chunk_stream import Stream
from .contract import LoopFactory, LoopSignals
from .engine import SessionEngine
from .exceptions import (
    DeserializationError,
    Empty,
    LocalProtocolError,
    MessageTooLarge,
    ResourceClosed,
    ResourceGone,
    UsedInForkedChild,
)
from .exposure import check as check_exposure
from .futures import DeliveryFuture
from .inbox import Inboxes
from .live import live_communicators
from .options import CommunicatorOptions, NetworkLocation, Protocol, Purpose
from .peers import GONE_STATES
from .protocol.events import MessageReceived
from .protocol.frames import MAX_PARTS
from .serializers import InlineForms, PickleSerializer
from .session import Outgoing, PeerSession, PeerState
from .stall import StallWarning
from .statistics import CommunicatorStatistics, RateMeter, peer_row

__all__ = ("Communicator", "Message", "live_communicators")

_GOODBYE_MARGIN = 0.25  # seconds; see close()
LOGGER = logging.getLogger("netq")
_clock = time.perf_counter
_sleep = time.sleep
_new_tuple = tuple.__new__
_CLOSED = PeerState.CLOSED
_CONNECTED = PeerState.CONNECTED


class _Batch:
    """put_many()'s items on their way through put(): one wire message, which get() opens
    into its items one by one."""

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items


class Message(NamedTuple):
    """A received message: who sent it, and the object (``peer, data = queue.get()`` works).

    A named tuple rather than a frozen dataclass: it is built once per get(), and a frozen
    dataclass's __init__ costs several times more.
    """

    peer: uuid.UUID
    data: Any


_NO_INLINE_FORMS = InlineForms(frozenset(), 0, pickle.dumps, None)  # every object: a call


def _part_codecs(serialization):
    """dump/load as part lists: the serializer's own fast forms when it has them, and its
    :class:`~netq.serializers.InlineForms` (where both ends are one PickleSerializer's)."""
    dump, load = serialization.dump, serialization.load
    owner = getattr(dump, "__self__", None)
    if owner is not None and getattr(owner, "dump", None) == dump and hasattr(owner, "dump_parts"):
        dump_parts = owner.dump_parts
    else:
        def dump_parts(obj):
            return [memoryview(chunk).cast("B") for chunk in dump(obj).readchunks()]
    # Not for a subclass: it may dump or load its own way.
    inline = owner.inline_forms() if type(owner) is PickleSerializer else _NO_INLINE_FORMS
    load_owner = getattr(load, "__self__", None)
    if load_owner is not None and getattr(load_owner, "load", None) == load \
            and hasattr(load_owner, "load_parts"):
        load_parts = load_owner.load_parts
    else:
        def load_parts(parts):
            return load(Stream(parts))
    if load_owner is not owner:  # a dump of one serializer, a load of another
        inline = _NO_INLINE_FORMS
    return dump_parts, load_parts, inline


# Clients of this process by (protocol, server, id, authkey): a server knows a client by its
# id, so two live clients of one server under one id (and one key: with another key the server
# refuses one) take each other's connection in turn and neither gets through
# (CommunicatorOptions made once and passed to several netq.new() calls).
_ClientKey = tuple[str, object, uuid.UUID, bytes | None]
_client_ids: dict[_ClientKey, weakref.ref[Communicator]] = {}
_client_ids_lock = threading.Lock()


def _client_key(client: Communicator) -> _ClientKey:
    security = client.options.security
    return (client.protocol.value, client.options.netloc, client.id,
            None if security is None else security.authkey)


def _repr(communicator: Communicator) -> str:
    """``<netq server tcp 127.0.0.1:40797 name='hub' id=... peers=1>``: where a server is
    bound (port 0: the port it got), where a client connects; ``closed`` once closed."""
    where = _where(communicator)
    name = communicator.options.name
    return (f"<netq {communicator.purpose.value} {communicator.protocol.value} {where}"
            f"{'' if name is None else f' name={name!r}'} id={communicator.id} "
            f"peers={len(communicator.peers)}{' closed' if communicator.closed else ''}>")


def _deprecated_transport(communicator: Communicator) -> Any:
    """Deprecated name of :attr:`Communicator.loop` (it is the I/O loop, not the transport):
    the same object, with a :class:`DeprecationWarning`."""
    warnings.warn("Communicator.transport is deprecated: it is the I/O loop, use "
                  "Communicator.loop", DeprecationWarning, stacklevel=2)
    return communicator.loop


def _where(communicator: Communicator) -> str:
    """Where a server is bound (port 0: the port it got), where a client connects."""
    if communicator.purpose is Purpose.SERVER:
        return _address_text(communicator.address)
    return communicator.loop.connect_target()


def _put_to_no_one(communicator: Communicator, broadcast: bool) -> DeliveryFuture:
    """A put() that addressed no peer: its future resolves at once (every peer addressed,
    none, has it). A server's put() to every client with none connected is said in one
    WARNING (the natural first cell, a server and a client made and a put at once, meets it
    while the client is still connecting), again only after a broadcast reached a client."""
    future = DeliveryFuture(1)
    future._start()
    future._delivered()
    if broadcast and not communicator._told_no_one:
        communicator._told_no_one = True
        LOGGER.warning(
            "netq server: put() to every client reached no one: no client is connected. A "
            "put() that names no peer goes to the clients connected when it is called (one "
            "still connecting is not yet); its future resolved at once. Wait until "
            "server.peers lists a client (or a get() returns its first message), or put to "
            "a client by its id. Said once until a put reaches a client")
    return future


def _address_text(address: Any) -> str:
    """A server's bound address as its messages write it: ``host:port`` (``[host]:port`` for
    IPv6), ``unix:<path>`` for a socket file, a broker's ``mqtt://`` URL as it is."""
    if isinstance(address, tuple) and len(address) >= 2:
        return str(NetworkLocation(str(address[0]), address[1]))
    text = str(address)
    return text if "://" in text or text.startswith("unix:") else f"unix:{text}"


def _check_client_id(client: Communicator) -> None:
    """LocalProtocolError if a live client of this process already uses this new client's id
    for its server (one that began closing has let it go)."""
    with _client_ids_lock:
        held = _client_ids.get(_client_key(client))
        other = held() if held is not None else None
        if other is not None and not other.closed:
            raise LocalProtocolError(
                f"another live client of this process ({other!r}) already uses id {client.id} "
                f"for the server at {client.options.netloc}: the server would take each one's "
                f"connection for the other's and neither would get through. Give each client "
                f"its own CommunicatorOptions (each gets a fresh id), or "
                f"options.replace(id=uuid.uuid4())")


def _claim_client_id(client: Communicator) -> None:
    with _client_ids_lock:
        if len(_client_ids) > 2 * live.count() + 64:  # drop the collected ones
            for stale in [k for k, ref in _client_ids.items() if ref() is None]:
                del _client_ids[stale]
        _client_ids[_client_key(client)] = weakref.ref(client)


def _mark_inherited_after_fork() -> None:
    # Every communicator of this process is in netq.live's registry (weakly). Marking at fork
    # time keeps the cost on put() and get() at one attribute check, instead of an os.getpid()
    # per call. Runs in the child, right after os.fork(), with only the forking thread alive: it
    # must not take locks (another thread of the parent may have held them at the fork) nor do
    # I/O. With one thread left, nothing can change the registry while it is read.
    child = os.getpid()
    for communicator in live.inherited_at_fork():
        if isinstance(communicator, Communicator):  # all are: only a Communicator registers
            communicator._fork_error = UsedInForkedChild(
                communicator.id, communicator._creator_pid, child)


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_mark_inherited_after_fork)


def _check_peer_limits(targets: Sequence[PeerSession], size: int) -> None:
    """put(): raise :class:`MessageTooLarge` if a connected target's ``message_size`` (from its
    HELLO) is under ``size``, naming the peer with the lowest such limit."""
    lowest: tuple[int, uuid.UUID] | None = None
    for session in targets:
        link = session.link
        hello = None if link is None else link.conn.peer
        if hello is not None and size > hello.max_message \
                and (lowest is None or hello.max_message < lowest[0]):
            lowest = (hello.max_message, session.id)
    if lowest is not None:
        raise MessageTooLarge(size, lowest[0], lowest[1])


class Communicator:
    """A server or client endpoint. Thread-safe; use as a context manager.

    Create with :func:`netq.new`. The constructor never blocks: a client connects (and
    reconnects) on the I/O thread, and ``put`` queues until the link is up.

    A communicator belongs to the process that created it: in a child forked after that
    (``os.fork()``, the ``fork`` start method of :mod:`multiprocessing`), every call raises
    :class:`UsedInForkedChild` at once and ``close()`` returns without touching the parent's
    connections. Create communicators in the child, after the fork.
    """

    def __init__(self, protocol: Protocol, purpose: Purpose, options: CommunicatorOptions,
                 loop_factory: LoopFactory) -> None:
        check_exposure(protocol, purpose, options)  # before anything binds: may refuse
        self.options = options
        self.protocol = Protocol(protocol)
        self.purpose = Purpose(purpose)
        self.id: uuid.UUID = options.id
        self._creator_pid = os.getpid()
        # Set in a forked child by _mark_inherited_after_fork: every call there raises it.
        self._fork_error: UsedInForkedChild | None = None
        if self.purpose is Purpose.CLIENT:
            _check_client_id(self)  # before anything is made: a mistake costs nothing
        self._dump_parts, self._load_parts, inline = _part_codecs(options.serialization)
        # Plain objects (bytes, str, numbers) are pickled and unpickled right in put() and
        # get(), by C functions: no Python call of the serializer's per message.
        self._plain_types = inline.types
        self._plain_dumps = inline.dumps
        self._bytes_by_reference_from = inline.bytes_by_reference_from
        self._plain_loads = inline.loads
        self._message_limit = options.serialization.message_limit
        self._stall_warning = options.connection.stall_warning
        self._told_no_one = False  # see _put_to_no_one

        # What the loop reads of the engine and the inboxes, and the notices it leaves the
        # engine: plain data, shared by the three (netq.contract.LoopSignals).
        self._signals = signals = LoopSignals(wants_connection=self.purpose is Purpose.CLIENT)
        # The inboxes (netq.inbox): the engine fills them, get() takes from them.
        self._inboxes = Inboxes(options.connection.spin, signals)
        self._close_lock = threading.Lock()
        self._meter = RateMeter()

        self._engine = SessionEngine(options, self.purpose, self._inboxes, signals, loop_factory)
        self._inboxes.attach(self._engine)
        self._loop = self._engine.loop
        # What get() hands out stays held until the next get() (netq.credit.ReceiveBudget.lend).
        self._budget = self._engine.budget
        if self.purpose is Purpose.CLIENT:
            _claim_client_id(self)
        self._engine.start()
        live.register(self)

    # ================================================================== user API

    __repr__ = _repr

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def peers(self) -> tuple[uuid.UUID, ...]:
        """Ids of the peers with a live or resumable session."""
        return self._engine.peers.live_ids()

    @property
    def closed(self) -> bool:
        """True once ``close()`` began, and always in a forked child (it cannot be used there)."""
        return self._fork_error is not None or self._signals.closing

    @property
    def loop(self) -> Any:
        """The I/O loop and its ``carrier``, for transport-specific introspection."""
        return self._loop

    transport = property(_deprecated_transport)

    @property
    def address(self) -> Any:
        """Where a server listens (the bound address, useful with port 0)."""
        return self._loop.address

    def put(self, data: Any, *peers: uuid.UUID, block: bool = True,
            timeout: float | None = None) -> DeliveryFuture:
        """Send ``data`` to ``peers`` (client: the server; server: everyone if none named).

        The object is serialized once for all peers and must not be mutated until the returned
        future resolves; the future resolves when every peer's netq has received the message
        and fails with :class:`ConnectionLost` if a peer leaves or the link breaks for good
        first, with :class:`ResourceClosed` if this communicator is closed first
        (``close(timeout=)``). Blocks while a peer's unsent bytes exceed ``send_budget``
        (``block=False``: raise :class:`Full`; ``timeout``: raise :class:`Full` after that many
        seconds), logging a WARNING that says why after ``stall_warning`` seconds.

        A mistake in the caller's code is raised here, where it is made, not put in a future
        nobody may look at; nothing is queued and the communicator stays usable:
        :class:`ResourceClosed` on a closed communicator; :class:`MessageTooLarge` for a
        message over our ``message_size``, or over the ``message_size`` of a peer it goes to
        that is connected (its handshake said its limit), and then to none of the peers, even
        those that would take it; :class:`LocalProtocolError` when a custom ``dump()`` made more
        than 1024 parts (what a message carries). A limit learnt only after the put (a peer not
        connected yet, or one that reconnects with a lower limit) fails the future with
        :class:`MessageTooLarge` instead, for that peer only (a put to several peers then fails
        with :class:`BroadcastIncomplete`, the others received it).
        """
        # One function from here to the engine's submit(): a Python call fewer per message.
        kind = type(data)
        if kind in self._plain_types and (kind is not bytes
                                          or len(data) < self._bytes_by_reference_from):
            parts = (self._plain_dumps(data),)  # dump_parts(data), inline (InlineForms)
            batch = False
        elif kind is _Batch:  # put_many()
            parts = self._dump_parts(data.items)
            batch = True
        else:
            parts = self._dump_parts(data)
            batch = False
        if self._fork_error is not None:
            raise self._fork_error
        engine = self._engine
        if self._signals.closing:
            raise ResourceClosed(None, "put after close()")
        if engine.failure is not None or engine.fatal is not None:
            engine.raise_if_broken()
        table = engine.peers
        server = table.server_session
        if server is not None and not peers and server.state is not _CLOSED:
            targets: Sequence[PeerSession] = table.server_only  # resolve()'s answer, inline
        elif len(peers) == 1 and server is None and (
                (session := table.sessions.get(peers[0])) is not None
                and session.state is _CONNECTED):
            targets = (session,)  # a server's reply to a connected peer: resolve(), inline
        elif not peers and server is None:
            targets = []  # a server's put() to every live peer: resolve()'s answer, inline
            for candidate in list(table.sessions.values()):  # a copy: the I/O thread adds
                if candidate.state not in GONE_STATES:
                    targets.append(candidate)
            if targets and self._told_no_one:
                self._told_no_one = False
        else:
            targets = table.resolve(peers, sending=True)
        if len(parts) == 1:
            size = len(parts[0])
        else:
            size = 0
            for part in parts:
                size += len(part)
        # Too large: raised here, on the caller's thread, before anything is queued.
        if size > self._message_limit:
            raise MessageTooLarge(size, self._message_limit)
        if size > engine.handshake.smallest_peer_limit:  # some peer takes less than we do
            _check_peer_limits(targets, size)
        if len(parts) > MAX_PARTS:
            # A custom dump() made more parts than a message can carry: the caller's mistake,
            # raised where it is made (in the pump it would end the link or the I/O thread).
            raise LocalProtocolError(
                f"dump() made {len(parts)} parts; a message carries at most {MAX_PARTS}")
        if not targets:
            return _put_to_no_one(self, server is None and not peers)
        future = DeliveryFuture(len(targets), targets)  # cancel() withdraws it from targets
        message = _new_tuple(Outgoing, (parts, size, batch, future))  # Outgoing(...), in C
        engine.submit(targets, message, block, timeout)
        return future

    def shared_buffer(self, nbytes: int) -> memoryview:
        """A writable buffer of ``nbytes`` bytes in shared memory (a memfd segment). A
        ``put()`` of it (over ``Protocol.UNIX`` with ``shared_memory`` on, to a peer that has
        it on too) sends the segment's descriptor: no copy at all. Do not write it after
        ``put()``: the receiver maps the same pages (see docs/guarantees.md). Elsewhere it
        travels like any buffer. Where memfds are missing (not Linux), a plain bytearray's view.
        """
        if _shm.unavailable_cached() is not None:
            return memoryview(bytearray(nbytes))
        return _shm.shared_buffer(nbytes)

    def shared_array(self, shape: Any, dtype: Any = "float64", order: str = "C") -> Any:
        """A numpy array of ``shape`` and ``dtype`` over :meth:`shared_buffer` memory: a
        ``put()`` of the whole array sends it without copying (numpy must be imported by
        the caller: netq does not depend on it)."""
        if _shm.unavailable_cached() is not None:
            return _shm.callers_numpy().empty(shape, dtype, order=order)
        return _shm.shared_array(shape, dtype, order)

    def put_many(self, items: Iterable[Any], *peers: uuid.UUID, block: bool = True,
                 timeout: float | None = None) -> DeliveryFuture:
        """Send many (small) objects as one wire message; ``get`` returns them one by one."""
        items = list(items)
        if not items:
            raise ValueError("put_many() needs at least one item")
        return self.put(_Batch(items), *peers, block=block, timeout=timeout)

    # ------------------------------------------------------------------ receive

    def get(self, *peers: uuid.UUID, timeout: float | None = None,
            block: bool = True) -> Message:
        """The next message (from ``peers`` only, if named), fairly across peers.

        Blocks until one arrives (``timeout``: raise :class:`Empty` after that many seconds).
        A client that cannot reach its server logs a WARNING saying so after
        ``stall_warning`` seconds. After ``close()`` it keeps returning what was received,
        then raises :class:`ResourceClosed`.
        """
        if self._fork_error is not None:
            # Before any lock: one the parent's I/O thread held at the fork is never released.
            raise self._fork_error
        session, item = self._inboxes.take(peers, block, timeout)  # _take, inline
        try:
            if type(item) is MessageReceived and not item.batch:  # _open's common case, inline
                parts = item.parts
                loads = self._plain_loads
                try:
                    if loads is not None and len(parts) == 1 and parts[0][:1] != b"\x00":
                        data = loads(parts[0])  # load_parts(parts), inline (InlineForms)
                    else:
                        data = self._load_parts(parts)
                except Exception as error:
                    raise DeserializationError(session.id, error) from error
                # Message(peer, data) without the named tuple's Python-level __new__.
                return tuple.__new__(Message, (session.id, data))
            return self._open(session, item)
        except Exception:
            raise  # this message's own error (DeserializationError): it is dropped
        except BaseException:
            # Ctrl-C (a kernel interrupt) while the message was being unpickled: it is not
            # the message's fault, so it goes back to the front of its queue for the next get().
            self._inboxes.give_back([(session, item)])
            raise

    def get_nowait(self, *peers: uuid.UUID) -> Message:
        return self.get(*peers, block=False)

    def get_many(self, *peers: uuid.UUID, max_messages: int = 1024,
                 timeout: float | None = None, block: bool = True) -> list[Message]:
        """At least one message (blocking like ``get``) and at most ``max_messages``."""
        current: tuple[PeerSession, Any] | None = self._take(peers, block, timeout)
        messages: list[Message] = []
        sources: list[PeerSession] = []  # where each of messages came from
        try:
            while current is not None:
                session, item = current
                if type(item) is MessageReceived and item.batch:
                    # Open a put_many() batch once, taking what fits, instead of taking its
                    # first element and queueing the rest to pop again one by one.
                    opened = self._open_batch(session, item, max_messages - len(messages))
                else:
                    opened = [self._open(session, item)]
                current = None
                messages += opened
                sources += [session] * len(opened)
                if len(messages) < max_messages:
                    try:
                        current = self._take(peers, False, None)
                    except (Empty, ResourceGone):
                        pass
        except BaseException as error:
            # What was opened goes back in order, for the next get. So does the message being
            # opened, unless the error is its own (DeserializationError: it is dropped).
            taken = [*zip(sources, [message.data for message in messages], strict=True)]
            if current is not None and not isinstance(error, Exception):
                taken.append(current)
            self._inboxes.give_back(taken)
            raise
        return messages

    def add_arrival_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (on the I/O thread: it must only hand off) when messages arrive."""
        self._inboxes.add_listener(listener)

    def remove_arrival_listener(self, listener: Callable[[], None]) -> None:
        self._inboxes.remove_listener(listener)

    def mark_waiting_get(self, waiting: bool) -> None:
        """For adapters that wait for messages outside ``get()`` (netq.aio): a wait begins
        (``True``) or ends; while it lasts it counts as a waiting ``get()`` in
        ``statistics().get_waiting`` and the server's warning. Calls must pair up."""
        self._inboxes.adapter_waits(waiting)

    def _take(self, peers: tuple[uuid.UUID, ...], block: bool,
              timeout: float | None) -> tuple[PeerSession, Any]:
        """The next raw item, fairly across peers (netq.inbox.Inboxes.take)."""
        if self._fork_error is not None:
            # Before any lock: one the parent's I/O thread held at the fork is never released.
            raise self._fork_error
        return self._inboxes.take(peers, block, timeout)

    def _open(self, session: PeerSession, item: Any) -> Message:
        if type(item) is not MessageReceived:
            return tuple.__new__(Message, (session.id, item))  # an element of an opened batch
        if item.batch:
            return self._open_batch(session, item, 1)[0]
        try:
            return tuple.__new__(Message, (session.id, self._load_parts(item.parts)))
        except Exception as error:
            raise DeserializationError(session.id, error) from error

    def _open_batch(self, session: PeerSession, item: MessageReceived, take: int) -> list[Message]:
        try:
            values = self._load_parts(item.parts)
        except Exception as error:
            raise DeserializationError(session.id, error) from error
        peer = session.id
        taken = [Message(peer, value) for value in values[:take]]
        rest = values[take:]
        if rest:
            self._inboxes.push_front(session, rest)
        return taken

    # ------------------------------------------------------------------ close

    def close(self, timeout: float | None = None) -> None:
        """Flush, say goodbye and stop. Idempotent.

        A client waits until the server's netq has acknowledged everything it put (received
        into its receive budget, whether or not the server's code has read it yet), then says
        goodbye. A server waits for its clients to leave (a killed client's session expires
        after ``session_timeout``). A wait longer than ``stall_warning`` logs a WARNING that
        says what it waits for. With ``timeout`` (seconds), whatever is still pending then
        fails with :class:`ResourceClosed` and the links are closed. A client whose link
        breaks before its goodbye is done reconnects to finish it, so the server learns what
        it received: within ``timeout`` (at least 1 s), or without one for as long as the
        server may still hold its session (``session_timeout`` from the break, plus 3
        heartbeats), warning while it tries.

        In a forked child it returns at once and does nothing: the connections are the
        parent's, which must not see a goodbye from the child.
        """
        if self._fork_error is not None:
            return
        engine = self._engine
        with self._close_lock:
            if engine.closed.is_set():
                return
            engine.begin_close()
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        stall = StallWarning(self._stall_warning, start)
        # One close path: wait on the engine (it says when something changed), warning while
        # it lasts; then the engine stops and the transport says goodbye (engine.goodbyes).
        self._wait_saying_why(stall, start, deadline, engine.wait_flushed)
        # Even when the timeout has run out, give the I/O thread a moment to tell peers that
        # we are leaving (ERROR SHUTDOWN / BYE) before the links are cut; a client whose
        # goodbye a broken link interrupted reconnects to finish it within the same time
        # (without a timeout: for as long as the server may hold its session).
        grace = 1.0
        now = time.monotonic()
        remaining = None if deadline is None else max(grace, deadline - now)
        # The goodbye ends a moment before close() stops waiting: the loop then ends by itself
        # and says what it could not finish, instead of being cut short.
        engine.stop(None if remaining is None else now + remaining - _GOODBYE_MARGIN)
        if not self._wait_saying_why(stall, start, None if remaining is None else now + remaining,
                                     engine.closed.wait):
            self._loop.abort()
            engine.closed.wait()
        self._loop.join()
        error = ResourceClosed(None, "the communicator closed")
        for session in engine.all_sessions():
            with session.send_lock:
                session.fail_outbound(error)
        self._inboxes.wake_all()

    def _wait_saying_why(self, stall: StallWarning, start: float, deadline: float | None,
                         wait: Callable[[float], bool]) -> bool:
        """close(): ``wait(seconds)`` until it returns True (then True) or ``deadline`` passes
        (then False), with a WARNING whenever ``stall`` says one is due."""
        engine = self._engine
        while True:
            now = time.monotonic()
            if stall.due(now):
                LOGGER.warning("netq %s: close() has waited %.0f s: %s", self.purpose.value,
                               now - start, engine.explain_close_wait())
            seconds = stall.next_due(now)
            if deadline is not None:
                seconds = min(seconds, deadline - now)
            if wait(max(seconds, 0.0)):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    # ------------------------------------------------------------------ statistics

    def statistics(self) -> CommunicatorStatistics:
        """A frozen snapshot: totals and one row per peer (see :mod:`netq.statistics`)."""
        if self._fork_error is not None:
            raise self._fork_error
        engine = self._engine
        now = time.monotonic()
        budget = self._budget
        rows = [peer_row(session, now=now, lent=budget.lent_bytes(session),
                         blocked=engine.diagnostics.peer_blocked(session, now))
                for session in engine.all_sessions()]
        connection = self.options.connection
        shm = self._loop.shm
        return self._meter.snapshot(
            now=now,
            id=self.id,
            purpose=self.purpose.value,
            protocol=self.protocol.value,
            address=_where(self),
            state="closed" if engine.closed.is_set() else "closing" if self._signals.closing
            else "open",
            uptime=now - engine.created,
            peers=rows,
            closed_totals=tuple(engine.handshake.totals_closed),
            recv_budget=connection.recv_budget,
            recv_held=budget.held_bytes - budget.taken_bytes(),
            recv_outstanding=self._budget.outstanding_bytes,
            send_budget=connection.send_budget,
            connect_error=engine.reach.connect_error if engine.reach else "",
            get_waiting=engine.diagnostics.get_wait(now),
            shm_bytes_in=shm.bytes_in, shm_bytes_out=shm.bytes_out,
            shm_messages_in=shm.messages_in, shm_messages_out=shm.messages_out,
            shm_segments=shm.pooled, shm_held=shm.held, shm_one_shot=shm.one_shot,
        )

    # ------------------------------------------------------------------ display

    def monitor(self, interval: float = 0.5, **options: Any) -> Any:
        """A live Jupyter view of :meth:`statistics` (per-peer table and plots at 1/interval Hz).

        Needs the ``netq[widgets]`` extra (the ``netq.widgets`` package, imported only here);
        without it, a static text/HTML summary (and a warning). Options: see
        ``netq.widgets.Monitor``.
        """
        from .display.notebook import monitor

        return monitor(self, interval=interval, **options)

    def _repr_mimebundle_(self, include: Any = None,
                          exclude: Any = None) -> dict[str, Any] | tuple[dict, dict]:
        """Jupyter display: a live monitor in a kernel with ``netq[widgets]``, else static."""
        from .display.notebook import communicator_bundle

        return communicator_bundle(self, include, exclude)

    def _ipython_display_(self) -> None:
        """Jupyter display with a display id, so the live view can be replaced by its final
        static form when it stops (see :mod:`netq.display`)."""
        from .display.notebook import communicator_display

        communicator_display(self)

    def _display_(self) -> Any:
        """marimo display (asked before any ``_repr_*``): a live monitor, or a static summary
        without ``netq[widgets]``."""
        from .display.notebook import communicator_marimo

        return communicator_marimo(self)
