"""The diagnostics (netq.diagnostics) on their own: when a stall warning is due, what the
sentences say, and the one format_bytes. No engine, no transport, no clock of their own."""

from __future__ import annotations

import gc
import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest

import netq as nq
from netq import live
from netq.diagnostics import (
    WAITING_CLIENTS,
    Diagnostics,
    Reachability,
    WaitingClients,
    format_bytes,
)
from netq.peers import PeerDirectory
from netq.session import PeerState
from netq.stall import REPEAT_WARNING, StallWarning


@pytest.mark.parametrize(("value", "text"), [
    (0, "0 B"), (512, "512 B"), (1536, "1.50 KiB"), (64 * 1024, "64.0 KiB"),
    (4 * 1024 ** 2, "4.00 MiB"), (3 * 1024 ** 3, "3.00 GiB"), (-2048, "-2.00 KiB"),
    (float("nan"), "-"),
])
def test_format_bytes(value, text):
    assert format_bytes(value) == text


def test_display_and_diagnostics_share_format_bytes():
    from netq.display import formatting

    assert formatting.format_bytes is format_bytes


def test_a_stall_warning_is_due_after_stall_warning_then_every_repeat():
    stall = StallWarning(5.0, since=100.0)
    assert not stall.due(104.9) and stall.until_due(104.0) == pytest.approx(1.0)
    assert stall.due(105.0) and stall.warned
    assert not stall.due(106.0)  # just warned
    assert stall.until_due(106.0) == 0.0
    assert stall.due(105.0 + REPEAT_WARNING)


def test_progress_restarts_the_stall_clock():
    stall = StallWarning(5.0, since=0.0)
    stall.progress(4.0)
    assert not stall.due(8.0)
    assert stall.due(9.0)


def test_reachability_counts_attempts_until_a_connection():
    reach = Reachability(5.0, now=0.0)
    assert reach.unreachable_since == 0.0
    reach.started(1.0)
    reach.reached_server()
    assert reach.attempts == 1 and reach.attempt_reached_server
    reach.failed(2.0, "connection refused")
    assert (reach.failures, reach.attempt_started_at, reach.connect_error) == \
        (1, None, "connection refused")
    reach.failed(3.0, "again")  # a transport that does not report starts: counted here
    assert reach.attempts == 2 and reach.unreachable_since == 0.0
    ended = reach.connected()
    assert ended is not None and ended.since == 0.0
    assert (reach.attempts, reach.failures, reach.connect_error) == (0, 0, "")
    assert reach.unreachable is None and reach.connected() is None
    reach.lost(9.0)
    assert reach.unreachable_since == 9.0


@dataclass
class Budget:
    held_bytes: int = 0
    budget_bytes: int = 8 * 1024 ** 2
    waiting_peers: int = 0
    full_since: float | None = None
    outstanding_bytes: int = 0
    peers: int = 1
    starved: list = field(default_factory=list)

    taken: int = 0

    def share(self) -> int:
        return self.budget_bytes // self.peers

    def taken_bytes(self) -> int:
        return self.taken

    def starved_sessions(self) -> list:
        return self.starved

    def watch(self, now: float) -> tuple[StallWarning | None, float]:
        return None, float("inf")  # never full


class NamedPeer:
    """What netq.live reads of a communicator: its id, options (their name), statistics."""

    def __init__(self, id: uuid.UUID, name: str) -> None:
        self.id = id
        self.options = nq.CommunicatorOptions(id=id, name=name)

    def statistics(self):
        raise AssertionError("not read by the sentences")


@dataclass
class Getters:
    getters: int = 0
    waiting_since: float | None = None


class Target:
    watches_peer_host = False

    def __init__(self, state: str | None = None) -> None:
        self.state = state

    def connect_target(self) -> str:
        return "tcp://127.0.0.1:9"

    def connect_state(self) -> str | None:
        return self.state


def diagnostics(server: bool, getters: Getters | None = None,
                **budget) -> tuple[Diagnostics, PeerDirectory, Reachability | None]:
    options = nq.CommunicatorOptions()
    peers = PeerDirectory(server=server, window=64 * 1024)
    reach = None if server else Reachability(options.connection.stall_warning,
                                             time.monotonic() - 12)
    return (Diagnostics(server=server, options=options, peers=peers, budget=Budget(**budget),
                        loop=Target(), reachability=reach,
                        getters=getters if getters is not None else Getters()), peers, reach)


def test_a_client_without_its_server_says_where_and_what_failed():
    diag, peers, reach = diagnostics(server=False)
    reach.failed(time.monotonic(), "connection refused")
    text = diag.explain_unreachable(time.monotonic())
    assert text.startswith("not connected to the server at tcp://127.0.0.1:9 for 12 s")
    assert "1 attempt; last failed with: connection refused" in text
    session = peers.server_session
    said = diag.explain_send_wait(session)
    assert "unsent (send_budget=32.0 MiB, which counts 512 B more per queued message; " in said
    assert said.count("send_budget") == 1, said  # each budget named once
    why, waited = diag.peer_blocked(session, time.monotonic())
    assert why.startswith("not connected") and waited >= 12


def test_an_attempt_under_way_says_how_far_it_got():
    diag, _, reach = diagnostics(server=False)
    reach.started(time.monotonic())
    assert "attempt 1 in progress" in diag.explain_unreachable(time.monotonic())
    reach.reached_server()
    text = diag.explain_unreachable(time.monotonic())
    assert "the netq handshake is not finished" in text and "host answers" not in text
    # A carrier that watches the server's host: the client keeps waiting, and says why.
    diag._loop.watches_peer_host = True
    text = diag.explain_unreachable(time.monotonic())
    assert "the server's host answers, its netq has not yet" in text
    assert "keeps its place in the server's queue" in text


def test_a_client_finishing_its_goodbye_says_what_for_and_until_when():
    diag, peers, reach = diagnostics(server=False)
    now = time.monotonic()
    session = peers.server_session
    session.state = PeerState.CONNECTED
    assert diag.explain_close_wait(now, goodbye_deadline=float("inf")) == \
        "saying goodbye: waiting for the server's BYE"
    session.state = PeerState.DISCONNECTED
    session.disconnected_at = now - 2
    reach.failed(now, "connection refused")
    text = diag.explain_close_wait(now, goodbye_deadline=now + 12.2)
    assert text.startswith("finishing its goodbye: the link broke before the server's BYE")
    assert "send that again to the next client with this id" in text
    assert "not connected to the server at tcp://127.0.0.1:9" in text
    assert "last failed with: connection refused" in text
    assert "it stops trying in 12 s" in text and text.endswith("that many seconds")
    assert "stops trying" not in diag.explain_close_wait(now, goodbye_deadline=float("inf"))


def test_a_server_close_waits_for_its_clients_and_says_so():
    diag, peers, _ = diagnostics(server=True)
    assert diag.explain_close_wait(time.monotonic()) == "saying goodbye"
    session, _ = peers.open(uuid.uuid4())
    session.state = PeerState.DISCONNECTED
    session.disconnected_at = time.monotonic() - 3
    assert diag.explain_close_wait(time.monotonic()).startswith("waiting for 1 client(s) to close")
    assert "whose link broke 3 s ago" in diag.explain_send_wait(session)
    assert diag.peer_blocked(session, time.monotonic()) == ("", 0.0)
    session.state = PeerState.CLOSED
    assert diag.explain_send_wait(session) == f"peer {session.id} is gone"


def test_a_budget_without_room_says_what_fills_it_and_whose_share_is_full():
    """The 8 MiB budget of 32 peers: one peer holds its whole 256 KiB share (and a message
    more), the other 31 hold 7.75 MiB of unused credit. The sentence names both figures, and
    for the waiting peer its share, not the budget, as what is full."""
    share = 256 * 1024
    starved: list = []
    diag, peers, _ = diagnostics(server=True, held_bytes=share + 288, peers=32,
                                 outstanding_bytes=31 * share, waiting_peers=1,
                                 full_since=time.monotonic() - 9, starved=starved)
    session, _ = peers.open(uuid.uuid4())
    session.received_bytes = share + 288
    session.credit_waiting = True
    starved.append(session)
    text = diag.explain_budget(9.0)
    assert text.startswith("the receive budget has had no room for 9 s: of recv_budget=8.00 "
                           "MiB, 256.3 KiB is received and not taken by get() and 7.75 MiB "
                           "is credit granted to peers that have not used it yet. 1 peer "
                           "has no credit left")
    assert text.endswith("what it sends next waits until get() is called again, or with a "
                         "larger ConnectionOptions.recv_budget")
    assert f"{session.id}: its share is full, 256.3 KiB held of 256.0 KiB" in text
    why, waited = diag.peer_blocked(session, time.monotonic())
    assert why.startswith("waits for credit from recv_budget: its share is full, 256.3 KiB "
                          "held of 256.0 KiB") and waited >= 9
    named = NamedPeer(session.id, "client-00")  # a communicator of this process, named
    live.register(named)
    assert "1 peer has no credit left (client-00: its share is full" in diag.explain_budget(9.0)
    del named
    session.received_bytes = 1024  # under its share: the budget is promised to the others
    assert "1.00 KiB held of its 256.0 KiB share; the rest of the budget is promised to " \
           "other peers" in diag.explain_budget(9.0)


def test_a_budget_held_by_what_get_handed_out_says_so():
    """The last get() handed out a message as large as the budget and the caller has not
    called get() again: the sentence counts it apart from what is not taken, and says that the
    next get() call frees it."""
    budget = 8 * 1024 ** 2
    starved: list = []
    diag, peers, _ = diagnostics(server=True, held_bytes=budget, taken=budget,
                                 full_since=time.monotonic() - 6, starved=starved)
    session, _ = peers.open(uuid.uuid4())
    starved.append(session)
    text = diag.explain_budget(6.0)
    assert text.startswith("the receive budget has had no room for 6 s: of recv_budget=8.00 "
                           "MiB, 0 B is received and not taken by get(), 8.00 MiB was handed "
                           "out by the last get() (it counts until the next get() call, as its "
                           "caller may still hold it) and 0 B is credit granted"), text
    assert "1 peer has no credit left" in text and "until get() is called again" in text


def test_a_blocked_put_names_the_unsent_bytes_as_statistics_shows_them():
    diag, peers, _ = diagnostics(server=True)
    session, _ = peers.open(uuid.uuid4())
    session.state = PeerState.DISCONNECTED
    session.disconnected_at = time.monotonic()
    for _ in range(16):
        session.outbox.append(object())  # type: ignore[arg-type]
    session.queued_bytes = 262_432
    text = diag.explain_send_wait(session)
    assert "16 messages of 256.3 KiB unsent" in text
    assert "send_budget=32.0 MiB, which counts 512 B more per queued message" in text
    assert "counted as" not in text


def test_a_get_that_has_waited_says_for_whom():
    stall = nq.CommunicatorOptions().connection.stall_warning
    now = time.monotonic()
    getters = Getters(getters=1, waiting_since=now - stall + 1)
    diag, peers, _ = diagnostics(server=True, getters=getters)
    assert diag.get_wait(now) == ""  # not waited stall_warning yet
    later = now + 2
    text = diag.get_wait(later)
    assert text.startswith(f"get() waits and has returned no message for {stall + 1:.0f} s; "
                           f"no client is connected")
    session, _ = peers.open(uuid.uuid4())
    session.state = PeerState.CONNECTED
    assert diag.get_wait(later).endswith("; 1 client is connected: it returns when one of "
                                         "them puts one")
    other, _ = peers.open(uuid.uuid4())
    other.state = PeerState.CONNECTED
    assert "; 2 clients are connected: " in diag.get_wait(later)
    getters.getters = 0  # the get() gave up (timeout): nothing waits now
    assert diag.get_wait(later) == ""


def test_a_client_get_names_the_server():
    now = time.monotonic()
    diag, peers, _ = diagnostics(server=False, getters=Getters(getters=1, waiting_since=now - 60))
    assert "; the server is not connected" in diag.get_wait(now)
    peers.server_session.state = PeerState.CONNECTED
    assert "the server is connected: it returns when the server puts" in diag.get_wait(now)


def test_a_server_get_with_no_client_warns_once_per_wait(caplog):
    now = time.monotonic()
    stall = nq.CommunicatorOptions().connection.stall_warning
    getters = Getters(getters=1, waiting_since=now)
    diag, peers, _ = diagnostics(server=True, getters=getters)
    with caplog.at_level("WARNING", logger="netq"):
        assert diag.watch(now + 1, stopping=False) == pytest.approx(stall - 1)  # looks when due
        assert not caplog.records
        diag.watch(now + stall, stopping=False)
        diag.watch(now + stall + 2 * REPEAT_WARNING, stopping=False)  # the same wait: once
        assert [r.getMessage() for r in caplog.records] == [
            f"netq server: get() waits and has returned no message for {stall:.0f} s; no client "
            f"is connected: it returns when a client connects and puts one (get(timeout=) gives "
            f"up after that many seconds)"]
        getters.waiting_since = now + 100  # a message was taken; a new wait began
        session, _ = peers.open(uuid.uuid4())
        session.state = PeerState.CONNECTED
        diag.watch(now + 100 + stall, stopping=False)  # a client is there: statistics only
        assert len(caplog.records) == 1
        session.state = PeerState.DISCONNECTED
        diag.watch(now + 100 + stall, stopping=False)
        assert len(caplog.records) == 2


def _waiting_client(clients: WaitingClients, stall: float, now: float):
    reach = Reachability(stall, now)
    clients.add(reach)
    assert reach.unreachable is not None
    return reach, reach.unreachable


def test_a_client_alone_gets_its_own_warning(caplog):
    clients = WaitingClients(every=5.0)
    reach, warning = _waiting_client(clients, 5.0, 0.0)
    with caplog.at_level("WARNING", logger="netq"):
        assert warning.due(5.0)
        clients.warn(reach, warning, 5.0, "not connected to the server at X for 5 s (why)")
        assert warning.due(5.0 + REPEAT_WARNING)  # it repeats on its own schedule
        clients.warn(reach, warning, 5.0 + REPEAT_WARNING, "not connected ... for 35 s")
    assert [r.getMessage() for r in caplog.records] == [
        "netq client: not connected to the server at X for 5 s (why); put(), get() and the "
        "futures of puts wait for it",
        "netq client: not connected ... for 35 s; put(), get() and the futures of puts wait "
        "for it"]
    assert not warning.summarized
    clients.connected(reach)
    assert clients.waiting() == 0


def test_a_storm_of_waiting_clients_logs_one_line_per_interval(caplog):
    """1000 clients of one process whose warnings come due together, each on its own thread
    (as each client's I/O thread would): one line per interval in all, a summary that counts
    them and gives one client's sentence; every client's warning comes due again for the next
    summary; the clients are held weakly."""
    clients = WaitingClients(every=5.0)
    count, threads_count = 1000, 8
    waiting = [_waiting_client(clients, 5.0, 0.0) for _ in range(count)]
    for reach, _ in waiting[: count // 2]:
        reach.started(0.0)
        reach.reached_server()
    start = threading.Barrier(threads_count)

    def run(share) -> None:
        start.wait(timeout=30)
        for now in (5.0, 6.0, 9.0, 10.5):  # looks at the timers of every client, in turn
            for reach, warning in share:
                if warning.due(now):
                    clients.warn(reach, warning, now, f"not connected for {now:.0f} s (why)")

    with caplog.at_level("WARNING", logger="netq"):
        threads = [threading.Thread(target=run, args=(waiting[i::threads_count],))
                   for i in range(threads_count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
    lines = [r.getMessage() for r in caplog.records]
    # The looks at 5, 6 and 9 s fall in one interval, 10.5 s in the next: one line each.
    assert len(lines) == 2, lines
    assert lines[-1].startswith(f"netq clients: {count} of {count} clients in this process "
                                f"are not connected to their server, the oldest for "), lines
    assert f"({count // 2} connected and waiting for the netq handshake, {count // 2} not " \
           f"connected yet)" in lines[-1]
    assert "for example: not connected for " in lines[-1]
    assert all(warning.summarized for _, warning in waiting if warning.warned)
    # Each one's warning is due again for the next summary, but those who logged a line: they
    # repeat after REPEAT_WARNING (and then report here again).
    assert sum(warning.next_due(10.5) > 5.0 for _, warning in waiting) == len(lines)
    for reach, _ in waiting[:10]:
        clients.connected(reach)
    assert clients.waiting() == count - 10
    del waiting, reach, run
    gc.collect()
    assert clients.waiting() == 0 and not clients._clients  # held weakly: no leak


def test_clients_of_different_servers_each_say_why_in_the_same_interval(caplog):
    """Three clients of one process waiting for three servers, each for a reason of its own:
    no summary hides a reason, each logs its own line."""
    clients = WaitingClients(every=5.0)
    waiting = []
    for server in ("a:1", "b:2", "c:3"):
        reach = Reachability(5.0, 0.0, server)
        clients.add(reach)
        assert reach.unreachable is not None
        waiting.append((reach, reach.unreachable))
    with caplog.at_level("WARNING", logger="netq"):
        for reach, warning in waiting:
            assert warning.due(5.0)
            clients.warn(reach, warning, 5.0, f"not connected to {reach.server} (why)")
    assert [r.getMessage() for r in caplog.records] == [
        f"netq client: not connected to {server} (why); put(), get() and the futures of puts "
        "wait for it"
        for server in ("a:1", "b:2", "c:3")]
    assert not any(warning.summarized for _, warning in waiting)


def test_the_process_wide_summary_follows_its_clients():
    reach = Reachability(5.0, time.monotonic())  # a client: waiting until it connects
    assert reach in WAITING_CLIENTS._clients
    assert reach in WAITING_CLIENTS._waiting_for(reach.server)
    reach.connected()
    assert reach not in WAITING_CLIENTS._waiting_for(reach.server)
    reach.disconnected(time.monotonic())
    assert reach in WAITING_CLIENTS._waiting_for(reach.server)
    WAITING_CLIENTS.remove(reach)  # closed (SessionEngine.finished)
    assert reach not in WAITING_CLIENTS._clients \
        and reach not in WAITING_CLIENTS._waiting_for(reach.server)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="POSIX fork only")
@pytest.mark.timeout(30)
def test_a_forked_child_starts_with_no_waiting_clients():
    """The parent's clients do not run in a forked child, and a lock another thread held at
    the fork would never be released there: the child's summary starts empty, lock free."""
    import os

    reach = Reachability(5.0, time.monotonic())
    WAITING_CLIENTS._lock.acquire()  # as if another thread held it at the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child: report through the exit code, never return into pytest
            import signal

            ok = False
            try:
                # A child stuck on the inherited lock ends (SIGALRM, its default action): the
                # test fails instead of hanging.
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.alarm(10)
                ok = WAITING_CLIENTS.waiting() == 0 and not WAITING_CLIENTS._clients
            finally:
                os._exit(0 if ok else 1)
    finally:
        WAITING_CLIENTS._lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert reach in WAITING_CLIENTS._clients  # the parent's is untouched


def test_an_empty_get_says_whom_it_could_have_come_from():
    from netq.diagnostics import explain_empty

    assert explain_empty(0.5, server=True, connected=0) == (
        "get(timeout=0.5) found no message in 0.5 s; no client is connected")
    assert explain_empty(2, server=True, connected=1, named=1) == (
        "get(timeout=2) found no message in 2 s from the peer it named; 1 client is "
        "connected, and nothing came from it in that time")
    assert explain_empty(2, server=True, connected=3, named=2).endswith(
        "from the 2 peers it named; 3 clients are connected, and nothing came from them in "
        "that time")
    assert explain_empty(1, server=False, connected=1).endswith(
        "; the server is connected, and nothing came from it in that time")
    assert explain_empty(1, server=False, connected=0).endswith(
        "; the server is not connected yet (netq keeps trying to reach it)")
    assert explain_empty(1, server=False, connected=0, unreachable="no broker").endswith(
        "; the server is not connected (no broker; netq keeps trying)")
