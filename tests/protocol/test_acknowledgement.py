"""Deferred acknowledgements (netq.protocol.acknowledgement): a large message that says another
follows (DATA's FOLLOWS flag) may leave its ACK owed until the next message's ACK covers it.

The sender sets the flag only where it queues the next message right behind; the receiver
defers only when told to (``defers_acks``, the packet carriers), within ACK_DEFER_BYTES, and
whatever way the bytes arrive (whole, byte by byte, split, read by read) the ACKs are the same.
"""

from __future__ import annotations

import random

import pytest

from netq.protocol.acknowledgement import ACK_DEFER_BYTES
from netq.protocol.events import ConnectionState, MessageReceived
from netq.protocol.frames import HEADER, DataFlags, FrameType
from netq.protocol.sending import FOLLOWS_MIN

from .helpers import (
    feed_bytewise,
    feed_manual,
    feed_split,
    feed_whole,
    make_parts,
    open_pair,
    random_cuts,
    split_frames,
)

FOLLOWS = DataFlags.FOLLOWS.value
LARGE_MESSAGE = 256 * 1024


def frames_of(data: bytes) -> list[tuple[int, int, int]]:
    """(type, flags, value) of every frame in ``data``."""
    return [HEADER.unpack_from(raw)[:2] + HEADER.unpack_from(raw)[4:] for raw in split_frames(data)]


def acks_in(data: bytes) -> list[int]:
    return [value for kind, _, value in frames_of(data) if kind == FrameType.ACK]


def stream(sizes_and_follows, *, max_size: int | None = None) -> tuple[bytes, list[bytes]]:
    """A client's DATA frames for messages 1, 2, ... of the given sizes, each queued with a
    message behind it where its flag says so; and the bodies, in order."""
    pair = open_pair(client_conn={"max_size": max_size} if max_size else None)
    bodies = []
    for seq, (size, follows) in enumerate(sizes_and_follows, start=1):
        views, objects = make_parts([(size, True)], seed=seq)
        pair.client.queue_message(seq, views, size, False, [None] if follows else ())
        bodies.append(bytes(objects[0]))
    return pair.client.data_to_send(), bodies


def receiver(defers: bool = True):
    conn = open_pair().server
    conn.defers_acks = defers
    return conn


# ----------------------------------------------------------------------------- the sender


def test_a_large_message_with_another_queued_behind_it_says_follows_on_its_first_frame():
    data, _ = stream([(LARGE_MESSAGE, True), (LARGE_MESSAGE, False)], max_size=100_000)
    data_frames = [(flags, value) for kind, flags, value in frames_of(data)
                   if kind == FrameType.DATA]
    firsts = [(flags, value) for flags, value in data_frames if flags & DataFlags.FIRST]
    assert [(bool(flags & FOLLOWS), value) for flags, value in firsts] == [(True, 1), (False, 2)]
    # Chunked: the flag marks the first chunk only, as BATCH does.
    assert len(data_frames) > 2
    assert not any(flags & FOLLOWS for flags, _ in data_frames if not flags & DataFlags.FIRST)


@pytest.mark.parametrize("size", [100, FOLLOWS_MIN - 1])
def test_a_small_message_never_says_follows(size):
    data, _ = stream([(size, True), (size, False)])
    assert not any(flags & FOLLOWS for _, flags, _ in frames_of(data))


def test_no_follows_when_the_next_message_would_wait_for_credit():
    pair = open_pair(server={"recv_window": LARGE_MESSAGE})  # credit for one message only
    views, _ = make_parts([(LARGE_MESSAGE, True)])
    pair.client.queue_message(1, views, LARGE_MESSAGE, False, [None])
    (flags,) = [flags for kind, flags, _ in frames_of(pair.client.data_to_send())
                if kind == FrameType.DATA]
    assert not flags & FOLLOWS


# ----------------------------------------------------------------------------- the receiver


FEEDS = {
    "whole": feed_whole,
    "bytewise": feed_bytewise,
    "split": lambda conn, data: feed_split(conn, data, random_cuts(len(data), random.Random(5))),
    "reads of 4093": lambda conn, data: feed_manual(conn, data, (4093,)),
    "reads of 100000": lambda conn, data: feed_manual(conn, data, (100_000,)),
}


@pytest.mark.parametrize("feed", list(FEEDS))
def test_one_ack_covers_the_messages_that_said_follows(feed):
    data, bodies = stream([(LARGE_MESSAGE, True), (LARGE_MESSAGE, True), (LARGE_MESSAGE, False)])
    conn = receiver()
    events = FEEDS[feed](conn, data)
    assert [bytes(event.parts[0]) for event in events if type(event) is MessageReceived] == bodies
    assert acks_in(conn.data_to_send()) == [3]
    assert not conn.ack_owed


@pytest.mark.parametrize("feed", list(FEEDS))
def test_a_receiver_that_does_not_defer_acknowledges_as_before(feed):
    data, _ = stream([(LARGE_MESSAGE, True), (LARGE_MESSAGE, True), (LARGE_MESSAGE, False)])
    conn = receiver(defers=False)
    FEEDS[feed](conn, data)
    acks = acks_in(conn.data_to_send())
    assert acks[-1] == 3 and acks == sorted(acks)
    if feed == "bytewise":
        assert acks == [1, 2, 3]  # each message completed in a call of its own


def test_an_owed_ack_waits_for_the_next_message_and_is_flushed_on_request():
    data, _ = stream([(LARGE_MESSAGE, True), (LARGE_MESSAGE, True)])
    first = split_frames(data)[0]
    conn = receiver()
    conn.receive_data(first)
    assert conn.ack_owed and not conn.has_output
    conn.flush_owed_ack()
    assert acks_in(conn.data_to_send()) == [1]
    assert not conn.ack_owed
    conn.flush_owed_ack()  # nothing owed: nothing queued
    assert not conn.has_output


def test_an_ack_queued_since_covers_what_was_owed():
    data, _ = stream([(LARGE_MESSAGE, True), (100, False)])
    conn = receiver()
    conn.receive_data(split_frames(data)[0])
    assert conn.ack_owed
    conn.receive_data(b"".join(split_frames(data)[1:]))  # a small message: its ACK covers both
    assert not conn.ack_owed
    conn.flush_owed_ack()
    assert acks_in(conn.data_to_send()) == [2]


def test_an_owed_ack_covers_at_most_ack_defer_bytes():
    size = ACK_DEFER_BYTES // 3 + 1  # the third message takes the owed bytes past the bound
    data, _ = stream([(size, True)] * 7, max_size=1 << 20)
    conn = open_pair(server={"max_message": 8 << 20}).server
    conn.defers_acks = True
    acks = []
    for raw in split_frames(data):
        conn.receive_data(raw)
        acks += acks_in(conn.data_to_send())
    assert acks == [3, 6]
    assert conn.ack_owed  # the seventh, until the next message or the I/O layer's bound


def test_our_bye_comes_after_the_ack_we_owe():
    data, _ = stream([(LARGE_MESSAGE, True), (LARGE_MESSAGE, False)])
    conn = receiver()
    conn.receive_data(split_frames(data)[0])
    conn.send_bye("done")
    assert [kind for kind, _, _ in frames_of(conn.data_to_send())] == [FrameType.ACK,
                                                                      FrameType.BYE]
    conn.send_bye("again")  # once only, and nothing owed any more
    assert not conn.has_output


def test_a_closed_connection_owes_nothing():
    data, _ = stream([(LARGE_MESSAGE, True), (LARGE_MESSAGE, False)])
    conn = receiver()
    conn.receive_data(split_frames(data)[0])
    conn.receive_data(HEADER.pack(99, 0, 0, 0, 0))  # an unknown frame type: the link fails
    assert conn.state is ConnectionState.CLOSED
    assert not conn.ack_owed
