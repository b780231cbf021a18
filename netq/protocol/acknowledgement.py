"""When a link acknowledges what it received: at once, or after the next message.

:class:`DeferredAcks` is a base class of :class:`netq.protocol.connection.Connection`. A
message's receiver acknowledges it on receipt (docs/protocol.md, section 9): one ACK frame
per read that completed messages. Where each ACK is a carrier write of its own (a gRPC
message back, with its read on the other side), a stream of large messages pays one per
message. So a sender that queues another message right behind a large one says so (the DATA
flag ``FOLLOWS``, :meth:`netq.protocol.sending.SendSide.queue_message`), and a receiver that
defers (:attr:`DeferredAcks.defers_acks`, turned on by the I/O layer for such carriers) may
leave that message's ACK owed: the next message's ACK covers both (ACKs are cumulative).

An ACK is owed for at most :data:`ACK_DEFER_BYTES` of messages that said ``FOLLOWS`` (the
sender keeps each message until it is acknowledged), and the I/O layer writes an owed ACK
(:meth:`DeferredAcks.flush_owed_ack`) once its carrier's ``ack_defer`` has passed without the
next message: a sender whose next message was cancelled, or that stalled, hears within that
bound. Our BYE always comes after the ACK of everything received.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .events import ConnectionState

if TYPE_CHECKING:
    from .sending import SendSide as _Base
else:
    _Base = object

__all__ = ("DeferredAcks", "ACK_DEFER_BYTES")

# An owed ACK covers at most this many bytes of messages that said FOLLOWS: what the sender
# keeps beyond what it would without deferral.
ACK_DEFER_BYTES = 4 * 1024 * 1024
_CLOSED = ConnectionState.CLOSED


class DeferredAcks(_Base):
    """Connection's deferred acknowledgements (plain attributes: read where ACKs are queued)."""

    # Whether this side may defer the ACK of a message that said FOLLOWS: set by whoever
    # makes the connection (the link driver, from its carrier's ack_defer).
    defers_acks = False
    _follows_seq = 0  # the last complete message whose FIRST frame said FOLLOWS, its size
    _follows_size = 0
    _incoming_follows = 0  # the message under way said FOLLOWS (the DATA flag's bit)
    _owed_seq = 0  # the last message whose ACK is owed (0: none)
    _owed_bytes = 0  # bytes of the messages that said FOLLOWS which that ACK covers
    _owed_at = -1  # acks_end when it became owed: an ACK queued since covers it
    if TYPE_CHECKING:
        expected_seq: int
        state: ConnectionState

    def follows(self, seq: int, total: int) -> None:
        """Message ``seq`` of ``total`` bytes, complete now, said another follows."""
        self._follows_seq, self._follows_size = seq, total

    def _defer_ack(self) -> bool:
        """Whether the ACK of the messages just completed may wait: the last of them said
        another message follows, and the messages that said so which the ACK would cover stay
        under :data:`ACK_DEFER_BYTES`. True: the ACK is owed."""
        seq = self.expected_seq - 1
        if seq != self._follows_seq:
            return False
        owed = self._follows_size
        if self._owed_seq and self.acks_end == self._owed_at:  # still owed: one ACK for both
            owed += self._owed_bytes
        if owed >= ACK_DEFER_BYTES:
            return False
        self._owed_seq, self._owed_bytes, self._owed_at = seq, owed, self.acks_end
        return True

    @property
    def ack_owed(self) -> bool:
        """An ACK was deferred and none queued since covers it (the I/O layer writes it with
        :meth:`flush_owed_ack` within its carrier's bound)."""
        return bool(self._owed_seq) and self.acks_end == self._owed_at \
            and self.state is not _CLOSED

    def flush_owed_ack(self) -> None:
        """Queue the owed ACK now, unless an ACK queued since covers it."""
        if self.ack_owed:
            self.send_ack(self._owed_seq)
        self._owed_seq = 0

    def send_bye(self, reason: str = "") -> None:
        # Our goodbye comes after the ACK of everything we received: the peer resolves those
        # futures before it hears that we leave.
        if not self.sent_bye:
            self.flush_owed_ack()
        super().send_bye(reason)
