"""netq._buffers: receive buffers allocated once, and reused only when nobody else holds them.

What a part is: a writable one a ``bytearray``; a read-only one ``bytes`` below LARGE (a copy)
and a read-only memoryview of a buffer netq owns from LARGE (an anonymous map from MMAP_MIN).
"""

from __future__ import annotations

import gc
import mmap
import sys

import pytest

from netq import _buffers
from netq._buffers import LARGE, MMAP_MIN, POOL_BUFFERS, POOL_BYTES, POOL_MIN, ReceivePool

SIZE = 2 * POOL_MIN


def fill(pool: ReceivePool, size: int, readonly: bool, data: bytes):
    obj, view = pool.allocate(size, readonly)
    view[: len(data)] = data
    view.release()
    return obj


def backing(part):
    """The buffer a part's bytes live in (what the pool reuses)."""
    return part.obj if type(part) is memoryview else part


@pytest.mark.parametrize("size", [SIZE, MMAP_MIN], ids=["heap", "mapped"])
@pytest.mark.parametrize("readonly", [True, False])
def test_a_buffer_nobody_holds_is_received_into_again(readonly, size):
    pool = ReceivePool()
    first = fill(pool, size, readonly, b"first")
    address = id(backing(first))
    del first
    second = fill(pool, size, readonly, b"again")
    assert id(backing(second)) == address and second[:5] == b"again"
    if readonly:
        assert type(second) is memoryview and second.readonly and second.format == "B"
        assert type(second.obj) is (mmap.mmap if size >= MMAP_MIN else bytearray)
    else:
        assert type(second) is bytearray


def test_a_read_only_part_cannot_be_written_and_compares_by_content():
    pool = ReceivePool()
    part = fill(pool, SIZE, True, b"content")
    with pytest.raises(TypeError):
        part[:1] = b"x"
    assert part == bytes(part) and part[:7] == b"content"
    with pytest.raises(TypeError):  # unlike bytes: its buffer is not hashable
        hash(part)
    np = pytest.importorskip("numpy")
    assert not np.frombuffer(part, np.uint8).flags.writeable
    assert np.frombuffer(fill(pool, SIZE, False, b"w"), np.uint8).flags.writeable


def test_a_small_read_only_part_is_filled_in_a_bytearray_and_sealed_as_bytes():
    obj, view = _buffers.allocate_readonly(LARGE - 1)
    view[:3] = b"abc"
    view.release()
    assert type(obj) is bytearray
    sealed = _buffers.seal(obj, True)
    assert type(sealed) is bytes and sealed[:3] == b"abc" and len(sealed) == LARGE - 1
    assert _buffers.seal(obj, False) is obj


@pytest.mark.parametrize("reused", [False, True], ids=["fresh", "reused"])
@pytest.mark.parametrize("size", [SIZE, MMAP_MIN], ids=["heap", "mapped"])
def test_a_view_keeps_its_buffer_alive_until_it_and_its_slices_are_gone(reused, size):
    """What is written through a view (or a slice of it, as ``recv_into`` gets) always lands
    in a live buffer, even one every other holder has dropped meanwhile."""
    pool = ReceivePool()
    if reused:
        fill(pool, size, True, b"first")  # dropped at once: pooled and free
    part, view = pool.allocate(size, True)
    obj = view.obj
    piece = view[100:200]
    held = sys.getrefcount(obj)
    view.release()
    assert sys.getrefcount(obj) == held, "a slice still writes into it"
    pool.clear()
    del part
    piece[:] = b"s" * 100
    held = sys.getrefcount(obj)
    del piece
    assert sys.getrefcount(obj) == held - 1
    assert obj[100:200] == b"s" * 100


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
    from netq.protocol.events import MessageReceived

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
    assert type(first) is (memoryview if readonly else bytearray)
    assert backing(second) is not backing(first) and bytes(first) != bytes(second)
    address = id(backing(first))
    del first
    third = deliver(3)
    assert id(backing(third)) == address  # message 1's buffer, filled with message 3
    assert bytes(second) != bytes(third)
