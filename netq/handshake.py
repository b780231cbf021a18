"""Sessions on links: the handshake's verdict, the SESSION exchange, BYE and ERROR frames.

The protocol core (:mod:`netq.protocol`) checks HELLOs and frames; this module decides what
they mean for the sessions (:mod:`netq.peers`): whether a peer may use a link, which session
a link opens or resumes and where its numbering continues (:mod:`netq.protocol.resume`), how
much of the HELLO's credit the SESSION frame takes back (:mod:`netq.credit`), and what a
goodbye or an error frame ends. The engine (:mod:`netq.engine`) dispatches the events here.

Threads: the I/O thread only, with the link's lock held.
"""

from __future__ import annotations

import collections
import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import cast

from . import protocol as proto
from ._buffers import ReceivePool
from .contract import Link, LoopAPI
from .credit import ReceiveBudget
from .diagnostics import Reachability
from .exceptions import (
    AuthenticationError,
    ConnectionLost,
    RemoteProtocolError,
    ResourceClosed,
    ResourceGone,
)
from .options import CommunicatorOptions
from .peers import PeerDirectory
from .protocol.frames import ErrorCode, Role
from .protocol.resume import resume_numbering
from .session import NO_TOKEN, PeerSession, PeerState

__all__ = ("Handshake", "new_connection")

LOGGER = logging.getLogger("netq")


def new_connection(options: CommunicatorOptions, *, server: bool, recv_messages: int,
                   grant: int, passes_fds: bool = False,
                   pool: ReceivePool | None = None) -> proto.Connection:
    """The protocol state for a new link, its HELLO (granting ``grant`` bytes) queued; its
    large parts received into ``pool`` (the communicator's; None: one of the link's own).

    It depends on the options alone: a carrier's thread may ask for it while the engine
    that will own the link is still being built (a broker delivers a waiting client's
    packet as soon as the server subscribes, inside the transport's constructor)."""
    connection = options.connection
    authkey = options.security.authkey if options.security is not None else None
    assert connection.merge_size is not None and connection.efficient_size is not None
    hello = proto.make_hello(
        Role.SERVER if server else Role.CLIENT, options.id, auth=authkey is not None,
        max_message=options.serialization.message_limit, max_frame=connection.max_size,
        recv_window=grant, recv_messages=recv_messages,
        shm=passes_fds and connection.shared_memory)
    conn = proto.Connection(hello, authkey, max_size=connection.max_size,
                            merge_size=connection.merge_size,
                            efficient_size=connection.efficient_size, pool=pool)
    conn.shm_threshold = connection.shm_threshold
    return conn


class Handshake:
    """Opens, resumes and ends the sessions of one communicator's links (I/O thread)."""

    def __init__(self, *, server: bool, peers: PeerDirectory, budget: ReceiveBudget,
                 loop: LoopAPI, reachability: Reachability | None,
                 schedule: Callable[[PeerSession], None], changed: Callable[[], None],
                 options: CommunicatorOptions, recv_messages: int) -> None:
        """``schedule``: ask the I/O thread to service a session. ``changed``: a session came
        or went (the engine looks at its timers again). ``recv_messages``: the message count
        a peer may have unread (what our HELLO says)."""
        self._server = server
        self._peers = peers
        self._budget = budget
        self._loop = loop
        self._reach = reachability
        self._schedule = schedule
        self._changed = changed
        self._options = options
        self._recv_messages = recv_messages
        self._said_no_shm = False
        self._replaced_said_at: float | None = None  # client: when it last said it was replaced
        self._session_timeout = options.connection.session_timeout  # seconds
        self.totals_closed = [0, 0, 0, 0]  # messages/bytes in/out of sessions now gone
        self._goodbye_by: float | None = None  # see stopping()
        self._goodbye_warned = False
        # Server: links whose peer said who it is (HELLO) and whose SESSION frame has not come
        # yet, and how many of them each peer has. A peer with one is back: its session does
        # not expire while that handshake lasts (a storm may hold it up; a stuck one ends
        # after 3 silent heartbeats).
        self._handshaking: dict[Link, uuid.UUID] = {}
        self._handshaking_peers: collections.Counter[uuid.UUID] = collections.Counter()
        # The lowest message_size of any peer that ever attached (only ever lowered): a put()
        # under it needs to look at no peer's (Communicator.put checks it before queueing).
        self.smallest_peer_limit = options.serialization.message_limit

    def authenticated(self, link: Link, hello: proto.frames.Hello) -> bool:
        """The peer proved who it is (or needs no proof). False if the transport refuses it."""
        loop = self._loop
        if not loop.authorize(link, hello.id):
            link.error = AuthenticationError(f"{hello.id} may not use this link")
            link.conn.send_error(ErrorCode.AUTHENTICATION, "peer id not allowed on this link")
            loop.close_link(link, flush=True)
            return False
        link.peer_id = hello.id
        if link.conn.local.shm and not hello.shm and not self._said_no_shm:
            self._said_no_shm = True  # once per communicator
            LOGGER.info("netq %s: peer %s does not take shared memory (its shared_memory "
                        "option is off, or its platform lacks memfds): large parts go "
                        "through the socket", "server" if self._server else "client", hello.id)
        if self._server:
            self._handshaking[link] = hello.id
            self._handshaking_peers[hello.id] += 1
        else:
            session = self._peers.server_session
            assert session is not None
            token = session.token
            last = session.last_received if token != NO_TOKEN else 0
            self._send_session(session, link, token, last, False)
        return True

    def session_opened(self, link: Link, event: proto.SessionOpened) -> bool:
        """The peer's SESSION frame (a server) or its answer to ours (a client). False when
        the link is refused (nothing after the frame is looked at)."""
        self._changed()
        now = time.monotonic()
        if self._server:
            assert link.peer_id is not None
            self._handshake_ended(link)
            ended_here = self._peers.ended(link.peer_id)
            session, resumed = self._peers.open(link.peer_id)
            old = cast("Link | None", session.link)  # netq.session.AttachedLink: a Link
            if old is not None and old is not link and old.serial > link.serial:
                # A stale attempt: the peer connected again after this link (a client that
                # gave up on a handshake a storm delayed), and the newer link's handshake
                # ended first. This link loses: its client has closed it, and taking the
                # session to it would leave the session on a dead link while its client is
                # connected (it expires, and the live link, told it was replaced, would not
                # reconnect).
                link.error = ConnectionLost(link.peer_id, "a newer connection of this peer "
                                                          "holds the session")
                link.conn.send_error(ErrorCode.REPLACED, "a newer connection took over")
                self._loop.close_link(link, flush=True)
                return False
            if old is not None and old is not link:
                old.conn.send_error(ErrorCode.REPLACED, "a newer connection took over")
                self._loop.close_link(old, flush=True)
            with session.send_lock:
                # A new client process reusing the id (another token) keeps its queues;
                # numbering restarts on both sides.
                numbering = resume_numbering(
                    same_session=resumed and event.token == session.token,
                    peer_received=event.last_received, we_received=session.last_received)
                session.resume(numbering)
                if session.state is not PeerState.CONNECTING:
                    session.reconnects += 1
                link.conn.expected_seq = numbering.expected
                reported = session.last_received
                if not resumed and ended_here is not None and ended_here[0] == event.token:
                    # The client resumes the session that ended here (session_timeout): say
                    # how far it got, so what arrived then resolves instead of coming again.
                    reported = ended_here[1]
                self._send_session(session, link, session.token, reported, resumed)
                self._attach(session, link, now)
        else:
            server = self._peers.server_session
            assert server is not None
            session = server
            with session.send_lock:
                # Another token: our first session, or the server lost ours (restart or
                # expiry) and everything unacknowledged goes again, numbered from 1 both ways.
                session.resume(resume_numbering(
                    same_session=event.token == session.token,
                    peer_received=event.last_received, we_received=session.last_received))
                session.token = event.token
                if session.id.int == 0 or session.id != link.peer_id:
                    assert link.peer_id is not None
                    session.id = link.peer_id
                if session.connected_at is not None:
                    session.reconnects += 1
                # No expected_seq here: the protocol core set it when it read the SESSION
                # frame, and the server's messages that followed it in the same read have
                # advanced it since.
                self._attach(session, link, now)
            assert self._reach is not None
            ended = self._reach.connected()
            if ended is not None and ended.warned and not ended.summarized:
                LOGGER.info("netq client: connected to %s after %.0f s",
                            self._loop.connect_target(), now - ended.since)
        return True

    def _handshake_ended(self, link: Link) -> None:
        peer = self._handshaking.pop(link, None)
        if peer is not None:
            count = self._handshaking_peers[peer] - 1
            if count:
                self._handshaking_peers[peer] = count
            else:
                del self._handshaking_peers[peer]

    def _send_session(self, session: PeerSession, link: Link, token: bytes, last_received: int,
                      resumed: bool) -> None:
        """Our SESSION frame: what we hold of the peer's messages, and the credit we take back.

        The link's HELLO granted credit before the peer was known; the SESSION takes back what
        the flow policy does not allow this peer now (its unread messages from earlier links
        count), so a peer reconnecting to a stalled receiver cannot add a grant per link.
        """
        takeback = self._budget.session_takeback(session, link)
        link.conn.send_session(token, last_received, resumed, takeback, session.held_messages)
        self._budget.session_opened(session, link)

    def _attach(self, session: PeerSession, link: Link, now: float) -> None:
        hello = link.conn.peer
        if hello is not None and hello.max_message < self.smallest_peer_limit:
            self.smallest_peer_limit = hello.max_message
        session.link = link
        link.session = session
        session.state = PeerState.CONNECTED
        session.connected_at = now
        session.disconnected_at = None
        self._schedule(session)

    def bye(self, link: Link) -> None:
        session = link.session
        if session is None:
            return
        session.goodbye_received = True
        if self._server:
            # The client leaves: nothing more goes to it. Messages already on the wire still
            # get acknowledged (it reads until our BYE); queued ones fail now.
            with session.send_lock:
                session.fail_queued(ConnectionLost(session.id, "the peer closed"))
                session.state = PeerState.CLOSING
                link.conn.send_bye("goodbye")
                session.goodbye_sent = True
            self._loop.close_link(link, flush=True)
        else:
            session.state = PeerState.CLOSED
            error = self._ended_by(session)  # before goodbye_sent says we answered
            if not session.goodbye_sent:  # the server shut us out
                link.conn.send_bye("goodbye")
                session.goodbye_sent = True
            with session.send_lock:
                session.fail_outbound(error)
            self._loop.close_link(link, flush=True)

    def _ended_by(self, session: PeerSession) -> ResourceGone:
        """What a session's pending messages fail with when its goodbye is over: a client that
        said goodbye first closed it itself (close() ran out of time); otherwise the peer
        ended it (it said goodbye, or shut down)."""
        if session.goodbye_sent and not self._server:
            return ResourceClosed(None, "the communicator closed")
        return ConnectionLost(session.id, "the server closed" if not self._server
                              else "the peer closed")

    def error_frame(self, link: Link, event: proto.ErrorReceived) -> None:
        code = event.code
        if code == ErrorCode.REPLACED:
            link.error = ConnectionLost(link.peer_id, "replaced by a newer connection")
            link.replaced = True
            if not self._server:
                self._say_replaced()
        elif code == ErrorCode.SHUTDOWN:
            link.error = ConnectionLost(link.peer_id, "the peer shut down")
            session = link.session
            if session is not None:
                session.state = PeerState.CLOSED
        elif code == ErrorCode.AUTHENTICATION:
            link.error = AuthenticationError(f"peer rejected us: {event.text}")
        else:
            link.error = RemoteProtocolError(f"peer reported error {code}: {event.text}")

    def _say_replaced(self) -> None:
        """Client: the server took a newer connection under this client's id instead of ours.
        Our own newer attempt never replaces a link we still hold, so another live client uses
        this id: said once a minute at most, as two such clients take turns."""
        now = time.monotonic()
        if self._replaced_said_at is not None and now - self._replaced_said_at < 60:
            return
        self._replaced_said_at = now
        LOGGER.warning(
            "netq client %s: the server at %s replaced this client's connection with a newer "
            "one under the same id: another live client uses id %s (another process, or a "
            "worker that inherited these CommunicatorOptions through a fork), and the two take "
            "each other's connection in turn. Give each client its own CommunicatorOptions "
            "(each gets a fresh id)", self._options.id, self._loop.connect_target(),
            self._options.id)

    def link_closed(self, link: Link, now: float) -> str | None:
        """The link is gone: its session waits for a reconnect, or ends. Returns, for a client
        whose attempt reached the server and ended before the handshake did, why (the
        engine reports it as a failed attempt); None otherwise."""
        if self._handshaking:
            self._handshake_ended(link)
        session = link.session
        if session is None or session.link is not link:
            error = link.error
            if session is None and not self._server and error is not None \
                    and not isinstance(error, AuthenticationError):
                reason = error.reason if isinstance(error, ResourceGone) and error.reason \
                    else str(error)
                if not reason.startswith("connected"):
                    reason = f"connected, then before the netq handshake ended: {reason}"
                return reason
            return None
        if session.goodbye_received or session.state is PeerState.CLOSED:
            session.link = None
            self.end_session(session, self._ended_by(session))
            return None
        # A goodbye the link took with it is said again on the next link (see goodbyes()).
        session.goodbye_sent = False
        # The session waits for a reconnect (also one whose goodbye was under way: a closing
        # client says it again on the next link).
        session.link = None
        if session.state in (PeerState.CONNECTED, PeerState.CONNECTING, PeerState.CLOSING):
            session.state = PeerState.DISCONNECTED
            session.disconnected_at = now
        if self._reach is not None:
            self._reach.disconnected(now)
        return None

    def end_session(self, session: PeerSession, error: Exception) -> None:
        """The session is over: what it still had to send fails with ``error``."""
        session.state = PeerState.CLOSED
        with session.send_lock:
            session.fail_outbound(error)
        if self._server and not session.inbox:
            self.forget(session)

    def forget(self, session: PeerSession) -> None:
        """Server: a closed session whose messages were all taken leaves the table."""
        if self._peers.forget(session):
            self._budget.forget(session)
            totals = self.totals_closed
            totals[0] += session.received_messages
            totals[1] += session.received_bytes
            totals[2] += session.acked_messages
            totals[3] += session.acked_bytes

    def flushed(self, now: float) -> bool:
        """Closing: everything put was acknowledged (or failed), and for a server: the
        clients left."""
        for session in self._peers.all():
            if session.state is PeerState.CLOSED:
                continue
            if session.outbox or session.inflight:
                reach = self._reach
                if reach is not None and session.state is not PeerState.CONNECTED \
                        and session.token == NO_TOKEN and session.reconnects == 0 \
                        and reach.absent_for(now) > self._session_timeout:
                    continue  # never connected within session_timeout: give up
                return False
            if self._server:
                return False  # still there: the server waits for its clients to leave
        return True

    def goodbyes(self, in_grace: bool) -> bool:
        """Stopping: say goodbye on every link; True when nothing is left to wait for.
        ``in_grace``: a client may still let a handshake under way finish first."""
        done = True
        loop = self._loop
        for link in loop.links():
            session = link.session
            if session is None:
                if not self._server and not link.closing and in_grace:
                    # Mid-handshake: the server may have opened our session already (it
                    # does on our SESSION frame). Let the handshake finish so that we can
                    # say goodbye; cut now, the server would keep that session for
                    # session_timeout, and its close() would wait for it.
                    done = False
                    continue
                loop.close_link(link, flush=False)
                continue
            with link.lock:
                if not self._server:
                    if not session.goodbye_sent:
                        session.goodbye_sent = True
                        session.state = PeerState.CLOSING
                        link.conn.send_bye("goodbye")
                        loop.write_now(link)
                    done = False  # wait for the server's BYE (or EOF)
                else:
                    # Server stopping with clients still attached (close timeout ran out).
                    link.conn.send_error(ErrorCode.SHUTDOWN, "server closing")
                    loop.close_link(link, flush=True)
        return done

    def stopping(self, now: float, goodbye_by: float | None) -> None:
        """The communicator stops. ``goodbye_by``: the monotonic time until which a client
        whose goodbye a broken link interrupted reconnects to finish it; None (close()
        without a timeout): until the server must have ended the session anyway (see
        :meth:`goodbye_deadline`)."""
        self._goodbye_by = goodbye_by

    def goodbye_deadline(self) -> float | None:
        """Stopping client whose goodbye is unfinished: the monotonic time until which it
        tries to finish it; None when there is no unfinished goodbye.

        Without a deadline from close(), it tries for as long as the server may still hold
        the session: ``session_timeout`` from when the link broke, plus the 3 heartbeats a
        server may take to notice a silent link (the server's clock starts then; this client
        assumes the server runs with its own ``session_timeout``). Past that, the server has
        ended the session and sends nothing of it again, so the goodbye no longer matters.
        While the link is up, the goodbye under way has no deadline of its own: a silent link
        ends after 3 heartbeats."""
        if not self.goodbye_unfinished():
            return None
        if self._goodbye_by is not None:
            return self._goodbye_by
        session = self._peers.server_session
        assert session is not None
        broke = session.disconnected_at
        if broke is None:
            return math.inf
        return broke + self._session_timeout + 3 * self._options.connection.heartbeat

    def goodbye_retry(self, now: float) -> bool:
        """Stopping client: reconnect to finish an interrupted goodbye (see
        :meth:`goodbye_unfinished`)? Once the time for it is over, a WARNING says so, once."""
        deadline = self.goodbye_deadline()
        if deadline is None:
            return False
        if now < deadline:
            return True
        if not self._goodbye_warned:
            self._goodbye_warned = True
            target = self._loop.connect_target()
            if self._goodbye_by is None:
                # close() without a timeout tried until the server's session ran out.
                LOGGER.warning(
                    "netq client: close() ends without its goodbye: no reconnect to %s got "
                    "through in the session_timeout (%.0f s) since the link broke; the server "
                    "has ended this client's session by then and sends none of it again.",
                    target, self._session_timeout)
            else:
                LOGGER.warning(
                    "netq client: close() could not finish its goodbye: the link to %s broke "
                    "and no reconnect completed in time. The server keeps this client's "
                    "session for up to session_timeout (%.0f s); a new client with id %s that "
                    "connects before then receives again what the server holds as "
                    "unacknowledged.", target, self._session_timeout, self._options.id)
        return False

    def goodbye_unfinished(self) -> bool:
        """Client: the server has our session and has not yet heard us leave.

        A closing client whose link broke before the server's BYE came back cannot tell
        whether the server received its BYE, nor the ACKs before it. The server then keeps
        the session for ``session_timeout`` and would send the messages it holds as
        unacknowledged again to the next process with this id. Reconnecting settles both:
        the handshake reports what we received, and the BYE follows."""
        if self._server:
            return False
        session = self._peers.server_session
        return (session is not None and session.connected_at is not None
                and not session.goodbye_received and session.state is not PeerState.CLOSED)

    def _admitting(self, now: float) -> bool:
        """Server: is a connection taken in the last 3 heartbeats still to say who it is?
        While newcomers keep coming and their handshakes are under way (a connection storm
        after a restart), a disconnected peer may be among them, or queued behind them. Only
        recent connections count: one that keeps a handshake going for longer holds nothing.
        """
        recent = now - 3 * self._options.connection.heartbeat
        return any(link.peer_id is None and link.opened_at > recent
                   for link in self._loop.links())

    def expire_sessions(self, now: float) -> float:
        """Sessions whose peer did not come back within ``session_timeout`` end (a server's)
        or fail what they queued (a client's, which keeps trying); closed sessions whose
        messages were all taken leave the table. Returns seconds until the next may expire."""
        timeout = self._session_timeout
        wait = timeout
        reach = self._reach
        admitting: bool | None = None  # looked at once, when a session is due
        for session in self._peers.all():
            state = session.state
            if state is PeerState.DISCONNECTED:
                assert session.disconnected_at is not None
                waited = now - session.disconnected_at if reach is None \
                    else reach.absent_for(now)
                if waited >= timeout and reach is None:
                    if session.id in self._handshaking_peers:
                        continue  # back, its handshake under way: it resumes the session
                    if admitting is None:
                        admitting = self._admitting(now)
                    if admitting:
                        # A storm: the peer may be one of the newcomers not identified yet
                        # (or still in the listen queue). Looked at again within a heartbeat.
                        wait = min(wait, self._options.connection.heartbeat)
                        continue
                if waited >= timeout:
                    if reach is None:
                        self.end_session(session, ConnectionLost(
                            session.id, "no reconnect within session_timeout"))
                    else:
                        reach.restart_absence(now)  # a fresh period for later puts
                        with session.send_lock:
                            session.fail_outbound(ConnectionLost(
                                session.id, f"the server could not be reached: no connection "
                                            f"attempt under way for session_timeout="
                                            f"{timeout:g} s in all (last: "
                                            f"{reach.connect_error or 'no reason given'})"))
                elif reach is None or reach.absence_counting:  # the clock runs
                    wait = min(wait, timeout - waited)
            elif state is PeerState.CLOSED and self._server and not session.inbox \
                    and session.link is None:
                self.forget(session)
        return wait
