"""Every error netq raises, in one place.

The tree, read as "who is to blame"::

    NetqError
    ├── ResourceGone                it cannot be used any more; ``.peer`` says what
    │   │                           (``None``: this communicator itself); catch it when who
    │   │                           ended it does not matter
    │   ├── ResourceClosed          you closed it: close() was called (``put()`` after it,
    │   │   │                       ``get()`` once everything received was taken, what was
    │   │   │                       pending when close(timeout=) ran out)
    │   │   └── UsedInForkedChild   a communicator created before ``os.fork()`` was used in
    │   │                           the child: its connections belong to the parent
    │   └── ConnectionLost          it broke: the peer left or shut down, was killed or cut
    │                               off, its session expired, the server is gone, or this
    │                               communicator's own link or I/O thread failed
    ├── BroadcastIncomplete (+ ExceptionGroup)
    │                               a put() to several peers reached some of them only:
    │                               how many it reached, and each other peer's error
    ├── Empty  (+ queue.Empty)      get_nowait() / get(timeout=) found nothing
    ├── Full   (+ queue.Full)       put would exceed the peer's send window
    ├── UnknownPeer  (+ KeyError)   a peer id this communicator has never seen
    ├── MessageTooLarge (+ ValueError)
    │                               a message over our ``SerializationOptions.message_size``
    │                               or a connected peer's: raised by ``put()`` itself (a
    │                               peer's limit learnt after the put: by its future)
    ├── DeserializationError        ``load`` failed on a received message (that message only)
    ├── UnsupportedProtocol (+ ValueError)
    │                               no transport is registered under that name
    ├── AuthenticationError         the peer failed (or refused) the authkey challenge
    ├── UnprotectedServer (+ ValueError)
    │                               a server others can reach would unpickle anything from
    │                               unauthenticated peers; the message names the three fixes
    ├── BrokerUnavailable (+ OSError)
    │                               MQTT: no broker to use (mosquitto missing, or it did not
    │                               start or answer); the message says how to fix it
    └── ProtocolError               the wire protocol was violated
        ├── LocalProtocolError      by this side: netq was used in a way the protocol forbids
        └── RemoteProtocolError     by the peer: malformed, truncated or oversized frames,
                                    wrong version, frames out of order

The split follows trio ("you closed it" vs "it broke": :class:`ResourceClosed` vs
:class:`ConnectionLost`, siblings as trio's ``ClosedResourceError`` and
``BrokenResourceError`` are, with :class:`ResourceGone` to catch both) and h11
(:class:`LocalProtocolError` vs :class:`RemoteProtocolError`). A remote protocol error closes
that one connection; every other peer is unaffected.
"""

from __future__ import annotations

import queue
import re
import uuid

__all__ = (
    "NetqError",
    "ResourceGone",
    "ResourceClosed",
    "ConnectionLost",
    "UsedInForkedChild",
    "BroadcastIncomplete",
    "Empty",
    "Full",
    "UnknownPeer",
    "MessageTooLarge",
    "DeserializationError",
    "UnsupportedProtocol",
    "AuthenticationError",
    "UnprotectedServer",
    "BrokerUnavailable",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
)


class NetqError(Exception):
    """Base class of every netq error."""


class ResourceGone(NetqError):
    """The peer or the communicator can no longer be used: the common base of
    :class:`ResourceClosed` (you closed it) and :class:`ConnectionLost` (it broke), for code
    that does not care which.

    ``peer`` is the peer's id, or ``None`` when this communicator itself is meant; ``reason``
    says why, in words.
    """

    def __init__(self, peer: uuid.UUID | None = None, reason: str = "") -> None:
        self.peer = peer
        self.reason = reason
        what = self._what()
        super().__init__(f"{what}: {reason}" if reason else what)

    def _what(self) -> str:
        return "gone" if self.peer is None else f"peer {self.peer} is gone"

    def __reduce__(self):  # pickled with what it was made from (a future crosses processes)
        return type(self), (self.peer, self.reason)


class ResourceClosed(ResourceGone):
    """This communicator was closed (``close()`` was called) before, or while, the operation
    ran: a ``put()`` after ``close()``, a ``get()`` once everything received was taken, what
    was still pending when ``close(timeout=)`` ran out. The caller's doing, never the peer's
    or the network's (that is :class:`ConnectionLost`).

    ``peer`` is ``None`` (this communicator) unless a subclass says otherwise.
    """

    def _what(self) -> str:
        return "communicator is closed" if self.peer is None else f"peer {self.peer} is closed"


class ConnectionLost(ResourceGone):
    """The peer or the network ended it, not this side: the peer left (said goodbye) or shut
    down, was killed, the network cut it off and no reconnect came within
    ``session_timeout``, or the server is gone; the message says which.

    ``peer`` ``None``: this communicator's own link failed (a client that cannot reach its
    server, its I/O thread failed); the communicator itself is not closed, and the message
    says "connection lost", not "communicator is closed".
    """

    def _what(self) -> str:
        return "connection lost" if self.peer is None else f"peer {self.peer} is gone"


class UsedInForkedChild(ResourceClosed):
    """A communicator was used in a child forked after it was created.

    Its I/O thread and connections belong to the process that created it (``parent_pid``);
    the child (``child_pid``) has copies of its sockets but no I/O thread, and anything it sent
    or closed would corrupt the parent's links. So every call in the child fails at once with
    this error (``close()`` returns without touching the links), and the parent's communicator
    keeps working. Create communicators after the fork, or use the ``spawn`` (or
    ``forkserver``) start method of :mod:`multiprocessing`.
    """

    def __init__(self, communicator_id: uuid.UUID, parent_pid: int, child_pid: int) -> None:
        self.communicator_id = communicator_id
        self.parent_pid = parent_pid
        self.child_pid = child_pid
        super().__init__(None, (
            f"netq communicator {communicator_id} was created in process {parent_pid} and used "
            f"in forked child {child_pid}: create communicators after fork, or use the spawn "
            f"start method (multiprocessing.get_context('spawn'))"))

    def __str__(self) -> str:
        return self.reason

    def __reduce__(self):
        return type(self), (self.communicator_id, self.parent_pid, self.child_pid)


class BroadcastIncomplete(ExceptionGroup, NetqError):
    """A message put to several peers (``put()`` to all, or to a list) was acknowledged by
    some of them only; raised by its future once every addressed peer has answered either way.

    ``delivered``: how many of the ``addressed`` peers acknowledged it. ``failed``: each other
    peer's id and why it did not (a :class:`ConnectionLost` for a peer that left, a
    :class:`MessageTooLarge` for one whose lower limit was learnt only after the ``put()``:
    a limit known then makes ``put()`` raise, sending to no one). Those errors are this
    group's exceptions, so ``except* ConnectionLost:`` handles the peers that left.
    """

    delivered: int
    addressed: int
    failed: dict[uuid.UUID | None, Exception]

    def __new__(cls, delivered: int, addressed: int,
                failed: list[tuple[uuid.UUID | None, Exception]]) -> BroadcastIncomplete:
        shown = "; ".join(str(error) if getattr(error, "peer", None) == peer
                          else f"peer {peer}: {error}" for peer, error in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        self = super().__new__(cls, f"delivered to {delivered} of {addressed} peers; "
                                    f"{len(failed)} failed ({shown}{more})",
                               [error for _, error in failed])
        self.delivered = delivered
        self.addressed = addressed
        self.failed = dict(failed)
        return self

    def __init__(self, delivered: int, addressed: int,
                 failed: list[tuple[uuid.UUID | None, Exception]]) -> None:
        super().__init__(self.message, [error for _, error in failed])

    def __repr__(self) -> str:  # the group's default repr lists every peer's error
        return f"BroadcastIncomplete({self.message!r})"

    def __reduce__(self):
        return BroadcastIncomplete, (self.delivered, self.addressed, list(self.failed.items()))

    def derive(self, excs):
        """``except*`` splits the group: a part keeps the counts and its own peers."""
        errors = {id(error) for error in excs}
        part = [(peer, error) for peer, error in self.failed.items() if id(error) in errors]
        return BroadcastIncomplete(self.delivered, self.addressed, part)


class Empty(NetqError, queue.Empty):
    """No message was available (``get_nowait()``, or ``get(timeout=)`` ran out)."""


class Full(NetqError, queue.Full):
    """The peer's send window is full (``put(block=False)``, or ``put(timeout=)`` ran out)."""


class UnknownPeer(NetqError, KeyError):
    """A peer id that this communicator has never been connected to."""

    def __init__(self, peer: object, why: str = "") -> None:
        self.peer = peer
        self.why = why  # what the caller may have meant, in words ("" if nothing to add)
        super().__init__(peer)

    def __str__(self) -> str:
        return f"unknown peer {self.peer}: {self.why}" if self.why else f"unknown peer {self.peer}"

    def __reduce__(self):
        return type(self), (self.peer, self.why)


class MessageTooLarge(NetqError, ValueError):
    """A message larger than a ``SerializationOptions.message_size``: ours, or the peer's
    (``peer``: which one; ``None``: ours). It is never split, and never sent.

    ``put()`` raises it itself, before queueing anything, when the message is over our limit
    or over a connected peer's (known from its handshake); only a limit learnt after the
    ``put()`` (a peer not connected yet) fails the future instead.
    """

    def __init__(self, size: int, limit: int, peer: uuid.UUID | None = None) -> None:
        self.size = size
        self.limit = limit
        self.peer = peer
        whose = "" if peer is None else f"peer {peer}'s "
        super().__init__(f"message of {size} bytes exceeds {whose}message_size={limit} bytes")

    def __reduce__(self):
        return type(self), (self.size, self.limit, self.peer)


class DeserializationError(NetqError):
    """``load`` raised on a received message; that message is dropped, nothing else is."""

    def __init__(self, peer: uuid.UUID, cause: BaseException) -> None:
        self.peer = peer
        self.cause = cause
        super().__init__(f"cannot deserialize a message from {peer}: {cause!r}"
                         f"{_concurrent_import_hint(cause)}")

    def __reduce__(self):
        return type(self), (self.peer, self.cause)


def _concurrent_import_hint(cause: BaseException) -> str:
    # Unpickling imports the modules a message names. Before Python 3.15 (CPython
    # gh-83065), a thread that imports a submodule while another thread is still importing
    # its package can meet that package half made, and so can the other thread.
    found = re.search(r"partially initialized module '([\w.]+)'", str(cause))
    if found is None or not isinstance(cause, (ImportError, AttributeError)):
        return ""
    package = found.group(1).partition(".")[0]
    return (f"; another thread was importing {package} at the same time: import {package} "
            f"before starting the threads that call get()")


class UnsupportedProtocol(NetqError, ValueError):
    """No transport is registered for the requested protocol."""


class AuthenticationError(NetqError):
    """The peer failed the authkey challenge, or one side has a key and the other none."""


class UnprotectedServer(NetqError, ValueError):
    """A server that other machines (or users) can reach, with no authkey, no client
    certificates and an unrestricted pickle ``load``, refused to start (see
    :mod:`netq.exposure`). Raised by ``netq.new()`` before anything is bound."""


class BrokerUnavailable(NetqError, OSError):
    """MQTT: the broker is missing, did not start, or refused us (the text says which)."""


class ProtocolError(NetqError):
    """The netq wire protocol was violated."""


class LocalProtocolError(ProtocolError):
    """This side tried something the protocol forbids (a bug in the caller or in netq)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that are not valid netq frames; its connection is closed."""
