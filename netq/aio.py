"""The asyncio face of a communicator: ``await queue.get()`` / ``await queue.put(x)``.

Same core, same I/O thread: nothing here owns sockets. ``get`` waits on an arrival signal that
the I/O thread posts to the event loop with ``call_soon_threadsafe`` (no thread per waiting
get); ``put`` queues without blocking the loop and awaits the delivery future.

    async with netq.aio.new(purpose=netq.Purpose.CLIENT) as queue:
        await queue.put("Hello, Server!")     # returns once the server has it
        message = await queue.get()
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from typing import Any

from . import new as _new
from .communicator import Communicator, Message
from .diagnostics import explain_empty
from .exceptions import Empty, Full
from .options import CommunicatorOptions, Protocol, Purpose
from .statistics import CommunicatorStatistics

__all__ = ("AsyncCommunicator", "new")


class AsyncCommunicator:
    """Wraps a :class:`~netq.communicator.Communicator` for one asyncio event loop."""

    def __init__(self, communicator: Communicator) -> None:
        self.communicator = communicator

    def __repr__(self) -> str:
        return f"<async {repr(self.communicator)[1:]}"

    @property
    def id(self) -> uuid.UUID:
        return self.communicator.id

    @property
    def peers(self) -> tuple[uuid.UUID, ...]:
        return self.communicator.peers

    @property
    def purpose(self) -> Purpose:
        return self.communicator.purpose

    @property
    def protocol(self) -> Protocol:
        return self.communicator.protocol

    @property
    def options(self) -> CommunicatorOptions:
        return self.communicator.options

    @property
    def address(self) -> Any:
        """Where a server listens (the bound address, useful with port 0)."""
        return self.communicator.address

    @property
    def closed(self) -> bool:
        return self.communicator.closed

    def statistics(self) -> CommunicatorStatistics:
        return self.communicator.statistics()

    # The notebook views of the communicator (netq.display): a live monitor with the
    # netq[widgets] extra, a static summary without it.

    def monitor(self, interval: float = 0.5, **options: Any) -> Any:
        return self.communicator.monitor(interval, **options)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        return self.communicator._repr_mimebundle_(include, exclude)

    def _ipython_display_(self) -> None:
        self.communicator._ipython_display_()

    def _display_(self) -> Any:
        return self.communicator._display_()

    async def put(self, data: Any, *peers: uuid.UUID, timeout: float | None = None) -> None:
        """Send and wait for delivery (``timeout`` bounds both the window wait and delivery)."""
        future = await self._queue(self.communicator.put, data, peers, timeout)
        await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    async def put_many(self, items: Iterable[Any], *peers: uuid.UUID,
                       timeout: float | None = None) -> None:
        future = await self._queue(self.communicator.put_many, list(items), peers, timeout)
        await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    def put_nowait(self, data: Any, *peers: uuid.UUID) -> asyncio.Future:
        """Queue now (raises :class:`~netq.Full` past the window); await the result for delivery."""
        return asyncio.wrap_future(self.communicator.put(data, *peers, block=False))

    async def _queue(self, method, data, peers, timeout):
        try:
            return method(data, *peers, block=False)
        except Full:
            # Past the window: wait in a worker thread so the event loop keeps running.
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                None, lambda: method(data, *peers, timeout=timeout))

    async def get(self, *peers: uuid.UUID, timeout: float | None = None) -> Message:
        """The next message; raises :class:`~netq.Empty` after ``timeout`` seconds."""
        communicator = self.communicator
        try:
            return communicator.get_nowait(*peers)
        except Empty:
            pass
        loop = asyncio.get_running_loop()
        arrived = asyncio.Event()

        def signal() -> None:
            loop.call_soon_threadsafe(arrived.set)

        communicator.add_arrival_listener(signal)
        communicator.mark_waiting_get(True)  # statistics().get_waiting says what it waits for
        try:
            deadline = None if timeout is None else loop.time() + timeout
            while True:
                arrived.clear()
                try:
                    return communicator.get_nowait(*peers)
                except Empty:
                    pass
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    raise _empty_after(communicator, timeout, peers)
                try:
                    await asyncio.wait_for(arrived.wait(), remaining)
                except TimeoutError:
                    raise _empty_after(communicator, timeout, peers) from None
        finally:
            communicator.mark_waiting_get(False)
            communicator.remove_arrival_listener(signal)

    def get_nowait(self, *peers: uuid.UUID) -> Message:
        return self.communicator.get_nowait(*peers)

    async def get_many(self, *peers: uuid.UUID, max_messages: int = 1024,
                       timeout: float | None = None) -> list[Message]:
        """At least one message (awaited like :meth:`get`) and at most ``max_messages``."""
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        try:
            return self.communicator.get_many(*peers, max_messages=max_messages, block=False)
        except Empty:
            pass
        first = await self.get(*peers, timeout=timeout)
        if max_messages == 1:
            return [first]
        try:
            rest = self.communicator.get_many(*peers, max_messages=max_messages - 1,
                                              block=False)
        except Empty:
            rest = []
        return [first, *rest]

    async def close(self, timeout: float | None = None) -> None:
        """Flush and close without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.communicator.close, timeout)

    async def __aenter__(self) -> AsyncCommunicator:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


def new(protocol: Protocol | str = Protocol.TCP, purpose: Purpose | str = Purpose.CLIENT,
        options: CommunicatorOptions | None = None) -> AsyncCommunicator:
    """Like :func:`netq.new`, returning the asyncio face.

    The same rules hold, as it is the same core: a server that other machines can reach and
    that has no authkey, no client certificates and an unrestricted pickle ``load`` raises
    :class:`~netq.UnprotectedServer` here, before it binds (see :mod:`netq.exposure`). Like
    :func:`netq.new` it does not wait for the network, so it may be called in a coroutine.
    """
    return AsyncCommunicator(_new(protocol, purpose, options))


def _empty_after(communicator: Communicator, timeout: Any, peers: tuple[uuid.UUID, ...]) -> Empty:
    """The ``Empty`` of an awaited get(timeout=) that ran out: what the blocking get() says."""
    snapshot = communicator.statistics()
    connected = sum(1 for row in snapshot.peers if row.state == "connected")
    return Empty(explain_empty(timeout, server=communicator.purpose is Purpose.SERVER,
                               connected=connected, named=len(peers),
                               unreachable=snapshot.connect_error and
                               f"the last attempt failed with: {snapshot.connect_error}"))
