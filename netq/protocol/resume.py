"""Where message numbering continues when a link (re)opens a session: decided here, once.

Each side numbers the messages it sends 1, 2, 3, ... per session, and acknowledges by number.
A SESSION frame says which session a link carries (its token) and the highest number its
sender has received in it. From those two facts, each side works out the same answer:

* **the session resumes** (the token is the one we hold): the peer has our messages up to the
  number it reported, so those resolve, the rest are sent again under the numbers that follow
  it, and we expect the peer's message after the last one we have;
* **a new session** (first contact, or the peer lost ours: a restart, an expiry, a new
  process under the same id): everything unacknowledged is sent again numbered from 1, and we
  expect the peer's message 1. Except what the peer says it has: a server that ended our
  session itself (``session_timeout``) still knows how far it got in it and reports that
  number in the new session's SESSION frame, so those messages resolve instead of arriving a
  second time in the same server process. A peer that never knew our session (a restarted
  server, another process) reports 0: nothing resolves, all goes again.

Used by the protocol core (:class:`netq.protocol.Connection`: a client must know where the
server's numbering continues as soon as it reads the SESSION frame, before the engine has
seen the event, because the server's DATA may follow in the same bytes) and by the session
(:meth:`netq.session.PeerSession.resume`). Pure: no I/O, no clock, no state.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("Resume", "resume_numbering")


@dataclass(frozen=True, slots=True)
class Resume:
    """Where numbering continues on a (re)opened session."""

    resumed: bool  # the same session goes on (else: a new one)
    acknowledged: int  # our messages the peer has: numbers up to this one resolve
    next_send: int  # the number of the first message we send (again) from now on
    last_received: int  # the peer's messages we have: what we report, and keep counting from

    @property
    def expected(self) -> int:
        """The number of the next message we expect from the peer."""
        return self.last_received + 1


def resume_numbering(*, same_session: bool, peer_received: int, we_received: int) -> Resume:
    """Numbering after a SESSION exchange.

    ``same_session``  the SESSION carries the token of the session we hold.
    ``peer_received`` the highest of our numbers the peer reports having (its SESSION frame;
                      in a new session, of the session we held, which the peer ended).
    ``we_received``   the highest of the peer's numbers we have in the session we hold.
    """
    if peer_received < 0 or we_received < 0:
        raise ValueError("sequence numbers are never negative")
    if same_session:
        return Resume(True, peer_received, peer_received + 1, we_received)
    return Resume(False, peer_received, 1, 0)
