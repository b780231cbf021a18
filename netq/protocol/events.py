"""What the sans-I/O core reports: the link's state and the events its parsing produces.

:class:`netq.protocol.connection.Connection` turns received bytes into these; the engine and
the session layer act on them. Plain data, no behaviour: every module of the protocol package
may import them.

The two events of every message, :class:`MessageReceived` (it waits in the inbox as it is)
and :class:`AckReceived`, are tuples: the core makes them with ``tuple.__new__`` (no Python
call per message, where a dataclass runs its ``__init__``). They still compare equal only to
an event of their own class. The others are slotted dataclasses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._buffers import Part
from ..exceptions import NetqError
from .frames import Hello

__all__ = [
    "ConnectionState",
    "Event",
    "PeerAuthenticated",
    "SessionOpened",
    "MessageReceived",
    "CreditReceived",
    "AckReceived",
    "ByeReceived",
    "PongReceived",
    "ErrorReceived",
    "ConnectionFailed",
]


class ConnectionState(enum.Enum):
    HELLO = "hello"  # waiting for the peer's HELLO
    AUTH = "auth"  # waiting for the peer's AUTH
    SESSION = "session"  # peer authenticated, waiting for its SESSION
    OPEN = "open"  # data may flow
    CLOSED = "closed"  # failed or finished: nothing more is parsed


# ----------------------------------------------------------------------------- events


class Event:
    __slots__ = ()


@dataclass(slots=True)
class PeerAuthenticated(Event):
    """The peer's HELLO (and AUTH, when keys are used) checked out."""

    hello: Hello


@dataclass(slots=True)
class SessionOpened(Event):
    """The peer's SESSION frame: which session it wants or has, and what it has received."""

    token: bytes
    last_received: int
    resumed: bool
    held_bytes: int = 0  # of our messages, the peer still holds this much (credit starts lower)
    held_messages: int = 0


_tuple_eq: Any = tuple.__eq__


class _TupleEvent(Event):
    """Equality of a tuple event: same class and same fields (a plain tuple compares equal
    to any tuple of the same values)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and _tuple_eq(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__: Any = tuple.__hash__


class _MessageFields(NamedTuple):
    seq: int
    batch: bool
    parts: list[Part]
    size: int


class MessageReceived(_MessageFields, _TupleEvent):
    """A complete message. ``parts`` are the final objects the user gets (``bytes``,
    ``bytearray``, read-only ``memoryview``, shared-memory map: see :mod:`netq._buffers`).
    A tuple (see the module docstring)."""

    __slots__ = ()
    __eq__ = _TupleEvent.__eq__
    __ne__ = _TupleEvent.__ne__
    __hash__ = _TupleEvent.__hash__


@dataclass(slots=True)
class CreditReceived(Event):
    nbytes: int
    messages: int


class _AckFields(NamedTuple):
    seq: int


class AckReceived(_AckFields, _TupleEvent):
    """The peer has every message up to ``seq``. A tuple (see the module docstring)."""

    __slots__ = ()
    __eq__ = _TupleEvent.__eq__
    __ne__ = _TupleEvent.__ne__
    __hash__ = _TupleEvent.__hash__


@dataclass(slots=True)
class ByeReceived(Event):
    reason: str


@dataclass(slots=True)
class PongReceived(Event):
    token: int


@dataclass(slots=True)
class ErrorReceived(Event):
    code: int
    text: str


@dataclass(slots=True)
class ConnectionFailed(Event):
    """Always the last event: the connection is unusable; ``error`` says who is to blame."""

    error: NetqError

