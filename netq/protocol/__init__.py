"""The sans-I/O netq protocol: frames (:mod:`.frames`) and link state (:mod:`.connection`).

Nothing in this package touches a socket, a thread or a clock; transports feed it bytes and
write what it queues. See ``docs/protocol.md`` for the wire format.
"""

from .connection import Connection, make_hello
from .events import (
    AckReceived,
    ByeReceived,
    ConnectionFailed,
    ConnectionState,
    CreditReceived,
    ErrorReceived,
    Event,
    MessageReceived,
    PeerAuthenticated,
    PongReceived,
    SessionOpened,
)
from .frames import VERSION, DataFlags, ErrorCode, FrameType, Hello, Role

__all__ = [
    "AckReceived", "ByeReceived", "Connection", "ConnectionFailed", "ConnectionState",
    "CreditReceived", "ErrorReceived", "Event", "MessageReceived", "PeerAuthenticated",
    "PongReceived", "SessionOpened", "make_hello", "VERSION", "DataFlags", "ErrorCode",
    "FrameType", "Hello", "Role",
]
