"""netq._buffers: receive buffers allocated once, and reused only when nobody else holds them."""

from __future__ import annotations

import gc
import sys

import pytest

from netq import _buffers
from netq._buffers import POOL_BUFFERS, POOL_BYTES, POOL_MIN, ReceivePool

SIZE = 2 * POOL_MIN


def fill(pool: ReceivePool, size: int, readonly: bool, data: bytes):
    obj, view = pool.allocate(size, readonly)
    view[: len(data)] = data
    view.release()
    return obj


@pytest.mark.parametrize("readonly", [True, False])
def test_a_buffer_nobody_holds_is_received_into_again(readonly):
    pool = ReceivePool()
    first = fill(pool, SIZE, readonly, b"first")
    address = id(first)
    del first
    second = fill(pool, SIZE, readonly, b"again")
    if readonly and not _buffers._BYTES_REUSABLE:
        pytest.skip("bytes are not reused on this interpreter")
    assert id(second) == address and second[:5] == b"again"
    assert type(second) is (bytes if readonly and _buffers.ZERO_COPY_ALLOCATION else bytearray)


@pytest.mark.parametrize("reused", [False, True], ids=["fresh", "reused"])
def test_a_view_keeps_its_bytes_alive_until_it_and_its_slices_are_gone(reused):
    """What is written through a view (or a slice of it, as ``recv_into`` gets) always lands
    in a live object, even one every other holder has dropped meanwhile."""
    if not _buffers.ZERO_COPY_ALLOCATION or (reused and not _buffers._BYTES_REUSABLE):
        pytest.skip("bytes are not filled through views on this interpreter")
    pool = ReceivePool()
    if reused:
        fill(pool, SIZE, True, b"first")  # dropped at once: pooled and free
        obj, view = pool.allocate(SIZE, True)
    else:
        obj, view = _buffers.allocate_readonly(SIZE)
    part = view[100:200]
    held = sys.getrefcount(obj)
    view.release()
    assert sys.getrefcount(obj) == held, "a slice still writes into it"
    part[:] = b"s" * 100
    del part
    assert sys.getrefcount(obj) == held - 1
    assert obj[100:200] == b"s" * 100


def test_a_reused_bytes_object_hashes_its_new_content():
    pool = ReceivePool()
    first = fill(pool, SIZE, True, b"first")
    stale = hash(first)  # cached in the object
    del first
    second = fill(pool, SIZE, True, b"again")
    assert hash(second) == hash(bytes(second)) != stale
    assert {second: 1}[bytes(second)] == 1


@pytest.mark.parametrize("holder", ["variable", "memoryview", "container"])
def test_a_buffer_someone_holds_is_never_touched(holder):
    pool = ReceivePool()
    first = fill(pool, SIZE, False, b"keep me")
    kept = {"variable": first, "memoryview": memoryview(first), "container": [first]}[holder]
    del first
    second = fill(pool, SIZE, False, b"other")
    original = kept if holder == "variable" else (kept.obj if holder == "memoryview" else kept[0])
    assert second is not original and bytes(original[:7]) == b"keep me"


def test_small_parts_and_other_sizes_are_not_pooled():
    pool = ReceivePool()
    small = fill(pool, POOL_MIN - 1, False, b"x")
    assert len(pool) == 0
    del small
    large = fill(pool, SIZE, False, b"y")
    address = id(large)
    del large
    other = fill(pool, SIZE + 1, False, b"z")
    assert id(other) != address  # a different size is a fresh allocation


@pytest.mark.parametrize("size", [SIZE, POOL_BYTES])
def test_the_pool_remembers_a_bounded_amount_and_clear_drops_them(size):
    """At most POOL_BYTES of buffers, or POOL_BUFFERS of them when they are larger."""
    pool = ReceivePool()
    remembered = max(POOL_BUFFERS, POOL_BYTES // size)
    held = [fill(pool, size, False, b"%d" % i) for i in range(remembered + 3)]
    assert len(pool) == remembered and pool.capacity == remembered * size
    pool.clear()
    assert len(pool) == 0 and pool.capacity == 0
    del held
    gc.collect()


def test_the_oldest_buffer_is_reused_while_the_newer_ones_are_still_queued():
    """A reader ahead of get(): the messages after the one just taken still hold theirs."""
    pool = ReceivePool()
    remembered = POOL_BYTES // SIZE
    assert remembered > POOL_BUFFERS
    queued = [fill(pool, SIZE, False, b"%d" % i) for i in range(remembered)]
    taken = queued.pop(0)
    address = id(taken)
    del taken
    again = fill(pool, SIZE, False, b"next")
    assert id(again) == address
    assert [bytes(part[:1]) for part in queued] == [b"%d" % i for i in range(1, remembered)]


@pytest.mark.parametrize("readonly", [True, False])
def test_a_connection_reuses_a_dropped_part_and_never_a_held_one(readonly):
    """Through the protocol core, whole: message 2 arrives while message 1 is held (a fresh
    buffer), message 3 after message 1 was dropped (message 1's buffer, with new content)."""
    from netq.protocol.connection import MessageReceived

    from .helpers import open_pair, send, shuttle

    pair = open_pair(client={"recv_window": 64 * SIZE}, server={"recv_window": 64 * SIZE})
    client, server = pair.client, pair.server

    def deliver(seq: int):
        expected = send(client, seq, [(SIZE, readonly)], seed=seq)
        _, events = shuttle(client, server)
        (message,) = [event for event in events if isinstance(event, MessageReceived)]
        (part,) = message.parts
        assert bytes(part) == bytes(expected[0])
        return part

    first = deliver(1)
    second = deliver(2)
    assert second is not first and bytes(first) != bytes(second)
    address = id(first)
    del first
    third = deliver(3)
    if readonly and not _buffers._BYTES_REUSABLE:
        return
    assert id(third) == address  # message 1's buffer, filled with message 3
    assert bytes(second) != bytes(third)
