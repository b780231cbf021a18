"""The peer directory (netq.peers) on its own: resolve()'s rules, departed peers, the client's one
session. No engine, no transport."""

from __future__ import annotations

import uuid

import pytest

from netq.exceptions import ConnectionLost, ResourceClosed, UnknownPeer
from netq.peers import DEPARTED_MEMORY, PeerDirectory
from netq.session import PeerState

WINDOW = 64 * 1024


def server_with(*states: PeerState) -> tuple[PeerDirectory, list[uuid.UUID]]:
    table = PeerDirectory(server=True, window=WINDOW)
    ids = []
    for state in states:
        session, resumed = table.open(uuid.uuid4())
        assert not resumed
        session.state = state
        ids.append(session.id)
    return table, ids


def test_a_server_table_resolves_live_peers_and_everyone():
    table, (a, b, gone) = server_with(PeerState.CONNECTED, PeerState.DISCONNECTED,
                                      PeerState.CLOSED)
    assert [s.id for s in table.resolve((b, a), sending=True)] == [b, a]
    assert {s.id for s in table.resolve((), sending=True)} == {a, b}  # put() to everyone
    assert table.resolve((), sending=False) == []  # get() serves everyone by itself
    assert set(table.live_ids()) == {a, b}
    assert len(table) == 3 and {s.id for s in table} == {a, b, gone}


@pytest.mark.parametrize("state", [PeerState.CLOSING, PeerState.CLOSED])
def test_a_closing_peer_refuses_put_and_still_hands_out_what_it_sent(state):
    table, (peer,) = server_with(state)
    with pytest.raises(ConnectionLost, match="the peer left") as caught:
        table.resolve((peer,), sending=True)
    assert not isinstance(caught.value, ResourceClosed)  # the peer's doing, not ours
    assert [s.id for s in table.resolve((peer,), sending=False)] == [peer]


def test_unknown_and_departed_peers_raise_different_errors():
    table, (peer,) = server_with(PeerState.CLOSED)
    stranger = uuid.uuid4()
    for sending in (True, False):
        with pytest.raises(UnknownPeer):
            table.resolve((stranger,), sending=sending)
    assert table.forget(table.get(peer))
    assert table.get(peer) is None and table.departed(peer)
    with pytest.raises(ConnectionLost, match="the peer left$"):
        table.resolve((peer,), sending=True)
    with pytest.raises(ConnectionLost, match="everything it sent was taken"):
        table.resolve((peer,), sending=False)


def test_forget_leaves_a_newer_session_of_the_same_id_alone():
    table, (peer,) = server_with(PeerState.CLOSED)
    old = table.get(peer)
    new, resumed = table.open(peer)  # the old one closed: a fresh session
    assert not resumed and new is not old
    assert not table.forget(old)
    assert table.get(peer) is new and not table.departed(peer)
    again, resumed = table.open(peer)  # a live one resumes
    assert resumed and again is new


def test_departed_ids_are_bounded_oldest_first():
    table = PeerDirectory(server=True, window=WINDOW)
    first = None
    for _ in range(DEPARTED_MEMORY + 1):
        session, _ = table.open(uuid.uuid4())
        first = first or session.id
        table.forget(session)
    assert not table.departed(first)  # the oldest was dropped to make room
    assert table.departed(session.id)


def test_a_client_table_has_the_server_as_its_one_ordinary_entry():
    table = PeerDirectory(server=False, window=WINDOW)
    server = table.server_session
    assert server is not None and table.all() == [server] and len(table) == 1
    assert table.live_ids() == ()  # not connected yet
    assert list(table.resolve((), sending=True)) == [server]  # put() queues before connecting
    # ...and every put() gets the same sequence: nothing allocated per put for the GC to track
    assert table.resolve((), sending=True) is table.resolve((), sending=True)
    server.id = uuid.uuid4()  # learnt in the handshake
    server.state = PeerState.CONNECTED
    assert table.live_ids() == (server.id,)
    assert list(table.resolve((server.id,), sending=False)) == [server]
    with pytest.raises(UnknownPeer):
        table.resolve((uuid.uuid4(),), sending=True)
    server.state = PeerState.CLOSED
    with pytest.raises(ConnectionLost, match="the server closed the session"):
        table.resolve((), sending=True)
    assert list(table.resolve((server.id,), sending=False)) == [server]


def test_a_server_remembers_how_far_an_ended_session_got():
    table = PeerDirectory(server=True, window=64 * 1024)
    peer = uuid.uuid4()
    assert table.ended(peer) is None
    session, resumed = table.open(peer)
    assert not resumed and table.ended(peer) is None  # live: nothing ended
    session.last_received = 7
    session.state = PeerState.CLOSED
    assert table.ended(peer) == (session.token, 7)  # closed, still in the table
    assert table.forget(session)
    assert table.ended(peer) == (session.token, 7)  # and once forgotten
    fresh, resumed = table.open(peer)
    assert not resumed and fresh.token != session.token and table.ended(peer) is None
