"""Resume numbering (netq.protocol.resume), case by case, and the two places that use it."""

from __future__ import annotations

import uuid

import pytest

from netq.futures import DeliveryFuture
from netq.protocol.resume import Resume, resume_numbering
from netq.session import Outgoing, PeerSession


@pytest.mark.parametrize(("same", "peer_received", "we_received", "expected"), [
    # First contact / a new session: everything from 1, both ways.
    (False, 0, 0, Resume(False, 0, 1, 0)),
    # The peer lost our session (restart, new process): it reports 0, everything goes again.
    (False, 0, 12, Resume(False, 0, 1, 0)),
    # The peer ended our session itself (a server's session_timeout) and reports how far it
    # got in it: those resolve; the rest goes again from 1, our count of its messages too.
    (False, 7, 12, Resume(False, 7, 1, 0)),
    # Resumed with nothing lost: continue after what the peer has.
    (True, 5, 9, Resume(True, 5, 6, 9)),
    # Resumed before anything arrived either way.
    (True, 0, 0, Resume(True, 0, 1, 0)),
])
def test_resume_numbering(same, peer_received, we_received, expected):
    numbering = resume_numbering(same_session=same, peer_received=peer_received,
                                 we_received=we_received)
    assert numbering == expected
    assert numbering.expected == expected.last_received + 1


def test_negative_numbers_are_refused():
    with pytest.raises(ValueError, match="never negative"):
        resume_numbering(same_session=True, peer_received=-1, we_received=0)


def outgoing(size: int) -> Outgoing:
    future = DeliveryFuture(1)
    return Outgoing([memoryview(bytes(size))], size, False, future)


def session_with_inflight(count: int) -> tuple[PeerSession, list[Outgoing]]:
    session = PeerSession(uuid.uuid4())
    messages = [outgoing(10 * (n + 1)) for n in range(count)]
    for message in messages:
        message.future._start()
        session.queued_bytes += message.size
        session.dequeued_bytes += message.size
        session.inflight.append(message)
        session.next_seq += 1
    session.last_received = 4
    return session, messages


def test_a_resumed_session_resolves_what_the_peer_has_and_resends_the_rest_in_order():
    session, messages = session_with_inflight(3)
    extra = outgoing(5)
    session.outbox.append(extra)
    session.queued_bytes += extra.size
    with session.send_lock:
        session.resume(resume_numbering(same_session=True, peer_received=1, we_received=4))
    assert messages[0].future.done() and not messages[1].future.done()
    assert list(session.outbox) == [messages[1], messages[2], extra]
    assert not session.inflight and session.next_seq == 2 and session.last_received == 4
    assert session.unsent_bytes == messages[1].size + messages[2].size + extra.size


def test_a_new_session_resends_everything_from_one():
    session, messages = session_with_inflight(2)
    with session.send_lock:
        session.resume(resume_numbering(same_session=False, peer_received=0, we_received=4))
    assert not any(message.future.done() for message in messages)
    assert list(session.outbox) == messages
    assert session.next_seq == 1 and session.last_received == 0


def test_a_new_session_from_a_peer_that_ended_ours_resolves_what_it_had():
    session, messages = session_with_inflight(3)
    with session.send_lock:
        session.resume(resume_numbering(same_session=False, peer_received=2, we_received=4))
    assert [message.future.done() for message in messages] == [True, True, False]
    assert list(session.outbox) == [messages[2]]
    assert session.next_seq == 1 and session.last_received == 0
