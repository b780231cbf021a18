"""The peer directory: which peers a communicator has, and what a peer id in a call means.

One directory per communicator (:class:`PeerDirectory`), used by the queue API
(:class:`netq.Communicator`: ``put``, ``get``, ``peers``) and by the engine (handshakes,
session expiry) alike. It holds

* the sessions by peer id (a server's clients; a client's one session, the server, is an
  ordinary entry too, created up front so that ``put()`` can queue before the first
  connection: its id is learnt in the handshake);
* the ids of peers that left (up to :data:`DEPARTED_MEMORY` of them), so that naming one
  raises :class:`ConnectionLost` ("it was here and left") rather than :class:`UnknownPeer`
  ("never heard of it").

Rules of :meth:`PeerDirectory.resolve` (what ``put(data, *peers)`` and ``get(*peers)`` accept):

=====================================  =====================  ===========================
peer named                             put()                  get()
=====================================  =====================  ===========================
never seen (client: not the server)    UnknownPeer            UnknownPeer
left, session forgotten                ConnectionLost         ConnectionLost
session closing or closed              ConnectionLost         its unread messages
=====================================  =====================  ===========================

Threads: the I/O thread adds and forgets sessions; user threads look up (a dict read is
atomic; lists are copied before iterating).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

from .exceptions import ConnectionLost, UnknownPeer
from .session import NO_TOKEN, PeerSession, PeerState

__all__ = ("DEPARTED_MEMORY", "GONE_STATES", "PeerDirectory")

DEPARTED_MEMORY = 65536  # ids of departed peers remembered (ConnectionLost, not UnknownPeer)
# States of a session that takes no new messages: a put() to every peer skips them.
GONE_STATES = (PeerState.CLOSED, PeerState.CLOSING)


class PeerDirectory:
    """The sessions of one communicator, by peer id, and the peers that left."""

    def __init__(self, *, server: bool, window: int) -> None:
        """``server``: a server's directory starts empty; a client's holds its one session (the
        server, id unknown until the handshake). ``window``: new sessions' receive window."""
        self.server = server
        self._window = window
        # A server's sessions by peer id (written here only; put() reads it for a reply).
        self.sessions: dict[uuid.UUID, PeerSession] = {}
        # Departed peers, with the token and count of the session they had (ended()).
        self._departed: dict[uuid.UUID, tuple[bytes, int]] = {}
        self.server_session: PeerSession | None = None
        self.server_only: tuple[PeerSession, ...] = ()
        if not server:
            self.server_session = PeerSession(uuid.UUID(int=0), token=NO_TOKEN, window=window)
            # What a client's every put() addresses, made once: one object fewer per put
            # for the garbage collector to track (a client's session is never replaced).
            self.server_only = (self.server_session,)

    # ------------------------------------------------------------------ lookups

    def __len__(self) -> int:
        """Sessions in the directory (a server's clients, including those closing)."""
        return len(self.sessions) if self.server else 1

    def __iter__(self) -> Iterator[PeerSession]:
        return iter(self.all())

    def all(self) -> list[PeerSession]:
        """Every session, in any state (a copy: safe from any thread)."""
        sessions = list(self.sessions.values())
        if self.server_session is not None:
            sessions.append(self.server_session)
        return sessions

    def get(self, peer: uuid.UUID) -> PeerSession | None:
        """A server's session with ``peer``, if it has one (any state)."""
        return self.sessions.get(peer)

    def departed(self, peer: uuid.UUID) -> bool:
        """``peer`` had a session that is gone now."""
        return peer in self._departed

    def live_ids(self) -> tuple[uuid.UUID, ...]:
        """Ids of the peers with a live or resumable session (``Communicator.peers``)."""
        server = self.server_session
        if server is not None:
            return (server.id,) if server.state is PeerState.CONNECTED else ()
        return tuple(peer for peer, session in list(self.sessions.items())
                     if session.state not in GONE_STATES)

    def resolve(self, peers: tuple[uuid.UUID, ...], *,
                sending: bool) -> Sequence[PeerSession]:
        """The sessions ``peers`` name, by the rules in the module docstring.

        ``sending``: for ``put()`` (a closing or closed session refuses; no peers named means
        every live peer); else for ``get()`` (a closed session still hands out what it
        received; no peers named means none: get() then serves every peer by itself).
        """
        server = self.server_session
        if server is not None:
            for peer in peers:
                if peer != server.id:
                    raise UnknownPeer(peer, "not this client's server; a client puts to and "
                                            "gets from its server only: name no peer")
            if sending and server.state is PeerState.CLOSED:
                raise ConnectionLost(server.id, "the server closed the session")
            return self.server_only if sending or peers else ()
        sessions = self.sessions
        if not peers:
            if not sending:
                return []
            live: list[PeerSession] = []  # a loop: a comprehension is a Python call per put()
            for candidate in list(sessions.values()):
                if candidate.state not in GONE_STATES:
                    live.append(candidate)
            return live
        found: list[PeerSession] = []
        for peer in peers:
            session = sessions.get(peer)
            if session is None:
                if peer in self._departed:
                    raise ConnectionLost(peer, "the peer left" if sending else
                                         "the peer left and everything it sent was taken")
                connected = sum(1 for other in sessions.values()
                                if other.state not in GONE_STATES)
                raise UnknownPeer(peer, f"no client with this id has connected to this server "
                                        f"(server.peers lists the {connected} it has now)")
            if sending and session.state in GONE_STATES:
                raise ConnectionLost(peer, "the peer left")
            found.append(session)
        return found

    # ------------------------------------------------------------------ changes (I/O thread)

    def ended(self, peer: uuid.UUID) -> tuple[bytes, int] | None:
        """Server: the token of ``peer``'s session that ended here (closed, or forgotten since)
        and the highest of its messages received in it; None if it had none."""
        session = self.sessions.get(peer)
        if session is not None:
            return (session.token, session.last_received) \
                if session.state is PeerState.CLOSED else None
        return self._departed.get(peer)

    def open(self, peer: uuid.UUID) -> tuple[PeerSession, bool]:
        """Server: the session for ``peer``'s handshake, and whether it resumes one (a live
        session of that id) or is new (first contact, or the old one closed)."""
        session = self.sessions.get(peer)
        if session is not None and session.state is not PeerState.CLOSED:
            return session, True
        session = PeerSession(peer, window=self._window)
        self.sessions[peer] = session
        return session, False

    def forget(self, session: PeerSession) -> bool:
        """Server: drop a finished session and remember its peer as departed; False when the
        directory holds another session for that id now (nothing changed)."""
        if self.sessions.get(session.id) is not session:
            return False
        del self.sessions[session.id]
        departed = self._departed
        departed[session.id] = (session.token, session.last_received)
        while len(departed) > DEPARTED_MEMORY:
            del departed[next(iter(departed))]
        return True
