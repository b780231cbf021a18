"""netq/statistics.py: RateMeter turns cumulative counters into rates between snapshots."""

from __future__ import annotations

import uuid

from netq.statistics import RATE_INTERVAL, PeerStatistics, RateMeter


def row(peer: uuid.UUID, messages_in: int, connected_for: float) -> PeerStatistics:
    return PeerStatistics(peer=peer, state="connected", queue_in=0, queue_in_bytes=0,
                          queue_out=0, queue_out_bytes=0, inflight=0, inflight_bytes=0,
                          messages_in=messages_in, bytes_in=100 * messages_in, messages_out=0,
                          bytes_out=0, credit_out=0, credit_in=0, memory=0, reconnects=0,
                          connected_for=connected_for, messages_in_per_s=0,
                          bytes_in_per_s=0, messages_out_per_s=0, bytes_out_per_s=0)


def snapshot(meter: RateMeter, now: float, *rows: PeerStatistics):
    return meter.snapshot(now=now, peers=list(rows), closed_totals=(0, 0, 0, 0),
                          id=uuid.uuid4(), purpose="server", protocol="tcp",
                          address="127.0.0.1:1", state="open", uptime=now)


def test_a_peer_that_joined_since_the_last_snapshot_has_the_rate_the_totals_count():
    """One snapshot: the totals' rate and the rows' rates add up, also for a peer that
    connected between two snapshots (it used to read 0 while the totals counted it)."""
    old, new = uuid.uuid4(), uuid.uuid4()
    meter = RateMeter()
    snapshot(meter, 10.0, row(old, 100, connected_for=5.0))
    later = 10.0 + 2 * RATE_INTERVAL
    stats = snapshot(meter, later, row(old, 100, connected_for=5.0 + 2 * RATE_INTERVAL),
                     row(new, 10, connected_for=RATE_INTERVAL))
    rates = {r.peer: r.messages_in_per_s for r in stats.peers}
    assert rates[old] == 0.0
    assert rates[new] == 10 / (2 * RATE_INTERVAL)
    assert stats.messages_in_per_s == sum(rates.values())


def test_a_peer_seen_first_in_the_first_snapshot_starts_at_zero():
    """The first snapshot has nothing to measure from: its rates are 0, totals included."""
    peer = uuid.uuid4()
    stats = snapshot(RateMeter(), 3.0, row(peer, 50, connected_for=1.0))
    assert stats.peers[0].messages_in_per_s == 0.0 and stats.messages_in_per_s == 0.0


def test_a_peer_that_joins_within_the_rate_interval_reads_zero_until_the_next_rate():
    """Snapshots closer than RATE_INTERVAL keep the last rates; a peer new in such a snapshot
    has none yet, and reads 0 like the totals' rate that does not count it yet."""
    old, new = uuid.uuid4(), uuid.uuid4()
    meter = RateMeter()
    snapshot(meter, 10.0, row(old, 100, connected_for=5.0))
    soon = 10.0 + RATE_INTERVAL / 2
    stats = snapshot(meter, soon, row(old, 100, connected_for=5.1),
                     row(new, 10, connected_for=RATE_INTERVAL / 4))
    assert {r.peer: r.messages_in_per_s for r in stats.peers} == {old: 0.0, new: 0.0}
    later = 10.0 + 2 * RATE_INTERVAL
    stats = snapshot(meter, later, row(old, 100, connected_for=5.2),
                     row(new, 30, connected_for=RATE_INTERVAL))
    assert stats.peers[1].messages_in_per_s == 30 / (2 * RATE_INTERVAL)
    assert stats.messages_in_per_s == 30 / (2 * RATE_INTERVAL)
