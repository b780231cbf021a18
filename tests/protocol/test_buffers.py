"""netq._buffers: receive buffers allocated once, and reused only when nobody else holds them.

What a part is: a writable one a ``bytearray`` (an array's, from MMAP_MIN, an anonymous map);
a read-only one ``bytes`` below LARGE (a copy) and a read-only memoryview of a buffer netq owns
from LARGE (an anonymous map from MMAP_MIN).
"""

from __future__ import annotations

import gc
import mmap
import sys
import threading

import pytest

from netq import _buffers
from netq._buffers import (
    IDLE_AGE,
    LARGE,
    MMAP_MIN,
    POOL_LIMIT,
    POOL_MIN,
    POOL_SCAN,
    ReceivePool,
)

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


def array_part(pool: ReceivePool, size: int):
    obj, view = pool.allocate(size, False, True)
    view.release()
    return obj


@pytest.mark.parametrize("size", [SIZE, MMAP_MIN], ids=["heap", "mapped"])
def test_an_arrays_part_is_a_map_from_mmap_min_and_a_plain_part_never_gets_one(size):
    """A writable array's part (ARRAY_BIT) from MMAP_MIN lives in a writable map, reused as
    such; a plain writable part of the same size is a bytearray, never the array's map."""
    pool = ReceivePool()
    kind = mmap.mmap if size >= MMAP_MIN else bytearray
    first = array_part(pool, size)
    assert type(first) is kind and not memoryview(first).readonly
    address = id(first)
    del first
    again = array_part(pool, size)
    assert type(again) is kind and id(again) == address
    del again
    plain = fill(pool, size, False, b"plain")
    assert type(plain) is bytearray


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


def test_the_pool_counts_holders_the_way_this_interpreter_does():
    """The count a free buffer shows is measured when the module loads, with the expression
    the pool uses; a held buffer counts one more, or the pool never reuses (-1)."""
    assert _buffers._REFS_WHEN_FREE > 0, "this interpreter's counts left the pool unused"
    buffers = [bytearray(1)]
    free = sys.getrefcount(buffers[0])  # outside the assert: pytest's rewrite holds its operands
    held = buffers[0]
    counted = sys.getrefcount(buffers[0])
    del held
    assert (free, counted) == (_buffers._REFS_WHEN_FREE, _buffers._REFS_WHEN_FREE + 1)


def test_small_parts_and_other_sizes_are_not_pooled():
    pool = ReceivePool()
    small = fill(pool, POOL_MIN - 1, False, b"x")
    assert len(pool) == 0
    del small
    large = fill(pool, SIZE, False, b"y")
    kept = memoryview(large)  # it stays alive, and held: not a candidate for reuse
    del large
    other = fill(pool, SIZE + 1, False, b"z")
    assert other is not kept.obj and len(other) == SIZE + 1  # a fresh allocation
    kept.release()
    del kept
    again = fill(pool, SIZE + 2, False, b"w")  # the free SIZE one does not fit: dropped
    assert len(pool) == 2 and pool.capacity == 2 * SIZE + 3
    del other, again


def test_the_pool_remembers_at_most_its_limit_and_clear_drops_them():
    """Free or held, the buffers total at most ``limit`` bytes: the least recently used go."""
    pool = ReceivePool(limit=5 * SIZE)
    held = [fill(pool, SIZE, False, b"%d" % i) for i in range(8)]
    assert len(pool) == 5 and pool.capacity == 5 * SIZE
    assert ReceivePool().limit == POOL_LIMIT
    # Over the limit alone: two such at most (the caller holds one while the next arrives).
    too_large = fill(pool, 6 * SIZE, False, b"x")
    assert len(pool) == 6 and pool.capacity == 11 * SIZE
    next_one = fill(pool, 6 * SIZE, False, b"y")
    assert len(pool) == 2 and pool.capacity == 12 * SIZE
    address = id(too_large)
    del too_large
    again = fill(pool, 6 * SIZE, False, b"z")
    assert id(again) == address and len(pool) == 2
    del next_one, again
    pool.clear()
    assert len(pool) == 0 and pool.capacity == 0
    del held
    gc.collect()
    with pytest.raises(ValueError):
        ReceivePool(limit=-1)


@pytest.mark.parametrize("depth", [4, 40, 400])
def test_the_oldest_buffer_is_reused_while_the_newer_ones_are_still_queued(depth):
    """A reader ahead of get() by ``depth`` messages, however many: the messages after the one
    just taken still hold theirs, and each new message gets the buffer of the one taken (a
    queue deeper than a fixed count of buffers made every message a fresh allocation)."""
    pool = ReceivePool()
    queued = [fill(pool, SIZE, False, b"%08d" % i) for i in range(depth)]
    addresses = {id(part) for part in queued}
    for i in range(depth, 3 * depth):
        taken = queued.pop(0)
        del taken
        queued.append(fill(pool, SIZE, False, b"%08d" % i))
        assert id(queued[-1]) in addresses  # a buffer of the pool, not a fresh one
    assert len(pool) == depth and pool.capacity == depth * SIZE
    assert [bytes(part[:8]) for part in queued] == [b"%08d" % i
                                                    for i in range(2 * depth, 3 * depth)]


def test_free_buffers_of_other_sizes_met_first_are_dropped():
    """Varying sizes: a free buffer that does not fit, among the oldest, is not kept."""
    pool = ReceivePool()
    for size in range(SIZE, SIZE + 2 * POOL_SCAN):
        fill(pool, size, False, b"x")  # dropped at once: free
    assert len(pool) == 1, "each miss dropped the free misfits it looked at"
    kept = fill(pool, 3 * SIZE, False, b"y")
    assert len(pool) == 1 and pool.capacity == 3 * SIZE
    assert fill(pool, 3 * SIZE, True, b"z").obj is not kept  # another kind: not reused
    del kept


def test_buffers_someone_holds_are_kept_whatever_their_size():
    pool = ReceivePool()
    held = [fill(pool, SIZE + i, False, b"h") for i in range(3)]
    fill(pool, 5 * SIZE, False, b"x")
    assert len(pool) == 4
    del held


def test_release_idle_keeps_only_what_was_used_since_the_call_before():
    """One link of a communicator idles while another receives: the busy link's buffers stay,
    the rest go; a pool no link used since the last call is emptied. Many idle links asking
    in one look count once."""
    pool = ReceivePool()
    now = 1000.0
    fill(pool, 2 * SIZE, False, b"idle link")
    pool.release_idle(now)  # used since the (absent) call before: kept
    assert len(pool) == 1
    for _ in range(3):
        fill(pool, SIZE, False, b"busy link")
    now += IDLE_AGE
    pool.release_idle(now)
    assert len(pool) == 1 and pool.capacity == SIZE  # the busy link's one buffer
    for _ in range(5):
        pool.release_idle(now + IDLE_AGE / 2)  # the other idle links, in the same look
    assert len(pool) == 1 and pool.capacity == SIZE
    pool.release_idle(now + IDLE_AGE)
    assert len(pool) == 0 and pool.capacity == 0


def test_links_share_a_pool_across_threads_and_never_share_a_buffer():
    """A communicator's links, read by different threads, allocate from one pool: a buffer is
    handed to one part at a time, and a dropped one is reused by any of them."""
    pool = ReceivePool()
    rounds, errors = 2000, []
    start = threading.Barrier(3)

    def receiver(tag: bytes) -> None:
        try:
            start.wait(timeout=10)
            kept = []
            for _ in range(rounds):
                part = fill(pool, SIZE, False, tag * 8)
                kept.append(part)
                if len(kept) > 3:
                    oldest = kept.pop(0)
                    if bytes(oldest[:8]) != tag * 8:
                        errors.append("a held part was written by another thread")
                    del oldest
        except Exception as error:  # noqa: BLE001  (reported by the main thread)
            errors.append(repr(error))

    threads = [threading.Thread(target=receiver, args=(tag,)) for tag in (b"a", b"b")]
    for thread in threads:
        thread.start()
    start.wait(timeout=10)
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert len(pool) <= 2 * 5 + 2, "the two links reused their dropped buffers"


def test_two_links_reuse_each_others_dropped_buffers():
    pool = ReceivePool()
    from_link_a = fill(pool, SIZE, False, b"a")
    address = id(from_link_a)
    del from_link_a
    from_link_b = fill(pool, SIZE, False, b"b")
    assert id(from_link_b) == address and len(pool) == 1


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
        # Fed from a buffer the reader fills again (as a socket's reads do): the parts are
        # copied out of it (bytes would be kept instead: see test_connection.py).
        events = server.receive_data(bytearray(client.data_to_send()))
        shuttle(client, server)
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
