"""An in-memory transport for engine tests: no thread, no socket, no clock of its own.

:class:`MemoryNetwork` connects client communicators to a server communicator through links
whose bytes move only when the test calls :meth:`MemoryNetwork.run`: every engine's
``service`` runs, then every link's queued output is fed to the other end's Connection, until
nothing moves. So a test decides exactly when bytes travel, and every step is deterministic.

It stands in for the engine's loop (:class:`netq.loop.IOLoop`): only the contract the engine
calls (:class:`netq.contract.LoopAPI`) is implemented; the engine is the real one, behind
the real :class:`netq.Communicator` facade, which is given this class as its loop factory.
"""

from __future__ import annotations

import time
from typing import Any

import netq as nq
from netq._shm import ShmCounters
from netq.communicator import Communicator
from netq.contract import LINK_CLOSED, LINK_SERVED, EngineAPI, Link
from netq.protocol import ConnectionState


class MemoryTransport:
    """The engine's view of a transport; the network moves the bytes."""

    direct_writes = False
    caller_leads = False  # no loop to lead: the test drives every turn itself
    watches_peer_host = False  # a silent handshake is given up after 3 heartbeats

    @property
    def looked_at(self) -> float:
        return time.monotonic()  # the test delivers every byte before it looks at the timers
    shm = ShmCounters()  # no shared memory in memory: always zero
    # The network the communicator being built joins (MemoryNetwork.communicator sets it).
    joining: MemoryNetwork | None = None

    def __init__(self, engine: EngineAPI, options: nq.CommunicatorOptions,
                 purpose: nq.Purpose) -> None:
        network = MemoryTransport.joining
        assert network is not None, "build memory communicators with MemoryNetwork"
        self.network = network
        self.engine = engine
        self.options = options
        # What the engine must hear (a link served, a link closed) goes here, as data.
        self.notices = engine.signals.notices
        self.address = "memory"
        self.wakes = 0
        self._links: list[Link] = []
        network.register(self)

    # -- what the engine calls
    def start(self) -> None:
        pass

    def lead(self, timeout, ready) -> bool:
        return False

    def unpark(self) -> None:
        pass

    def wake(self) -> None:
        self.wakes += 1

    def write_now(self, link: Link) -> None:
        pass  # the network moves output in run()

    def close_link(self, link: Link, flush: bool) -> None:
        if flush and link.conn.has_output:
            self.network.move(link)
        self.drop(link)

    def links(self) -> list[Link]:
        return [link for link in self._links if not link.dropped]

    def abort(self) -> None:
        pass

    def connect_target(self) -> str:
        return str(self.options.netloc)

    def connect_state(self) -> str | None:
        return None

    def join(self) -> None:
        pass

    def authorize(self, link: Link, peer_id: Any) -> bool:
        return True

    # -- what the network calls
    def open_link(self) -> Link:
        link = Link(self.engine.new_connection(), "memory")
        self._links.append(link)
        return link

    def drop(self, link: Link) -> None:
        if link.dropped:
            return
        link.dropped = True
        self.notices.append((LINK_CLOSED, link, ""))
        peer = self.network.peer_of(link)
        if peer is not None and not peer.dropped:
            owner = self.network.owner_of(peer)
            events = peer.conn.receive_eof()
            if events:
                with peer.lock:
                    owner.engine.handle_events(peer, events)
            owner.drop(peer)


class MemoryNetwork:
    """One server and its clients, connected by links that move bytes on :meth:`run`."""

    def __init__(self) -> None:
        self.transports: list[MemoryTransport] = []
        self._pairs: dict[int, Link] = {}
        self._owners: dict[int, MemoryTransport] = {}
        self.server: Communicator | None = None
        self.clients: list[Communicator] = []

    def register(self, transport: MemoryTransport) -> None:
        self.transports.append(transport)

    def communicator(self, purpose: nq.Purpose, **connection: Any) -> Communicator:
        options = nq.CommunicatorOptions(connection=nq.ConnectionOptions(**connection))
        MemoryTransport.joining = self
        try:
            # TCP's options and limits: the in-memory links stand in for TCP connections.
            communicator = Communicator(nq.Protocol.TCP, purpose, options, MemoryTransport)
        finally:
            MemoryTransport.joining = None
        if purpose is nq.Purpose.SERVER:
            self.server = communicator
        else:
            self.clients.append(communicator)
        return communicator

    def connect(self, client: Communicator) -> tuple[Link, Link]:
        """A new link between ``client`` and the server (bytes move on the next run)."""
        assert self.server is not None
        client_link = client._loop.open_link()
        server_link = self.server._loop.open_link()
        for a, b, owner in ((client_link, server_link, client._loop),
                            (server_link, client_link, self.server._loop)):
            self._pairs[id(a)] = b
            self._owners[id(a)] = owner
        return client_link, server_link

    def cut(self, link: Link) -> None:
        """The network fails under both ends of ``link``; each end's next turn (its engine's
        service) hears of it, as a loop's would."""
        self.owner_of(link).drop(link)
        for transport in self.transports:
            if transport.notices:
                transport.engine.service(time.monotonic())

    def peer_of(self, link: Link) -> Link | None:
        return self._pairs.get(id(link))

    def owner_of(self, link: Link) -> MemoryTransport:
        return self._owners[id(link)]

    def move(self, link: Link) -> bool:
        """Feed ``link``'s queued output to the other end; True if any bytes moved."""
        if not link.conn.has_output:
            return False
        data = link.conn.data_to_send()
        peer = self.peer_of(link)
        if peer is None or peer.dropped or link.dropped:
            return bool(data)
        owner = self.owner_of(peer)
        peer.last_received_at = time.monotonic()
        with peer.lock:
            events = peer.conn.receive_data(data)
            if events:
                owner.engine.handle_events(peer, events)
        if peer.conn.state is ConnectionState.CLOSED and not peer.dropped:
            owner.drop(peer)
        else:
            owner.notices.append((LINK_SERVED, peer, ""))
        return True

    def run(self, rounds: int = 10_000) -> int:
        """Service every engine and move bytes until nothing moves; returns rounds taken."""
        for count in range(rounds):
            moved = False
            for transport in self.transports:
                transport.engine.service(time.monotonic())
                for link in transport.links():
                    moved |= self.move(link)
            if not moved and not any(t.engine.signals.attention or t.notices
                                     for t in self.transports):
                return count
        raise AssertionError(f"still moving after {rounds} rounds")
