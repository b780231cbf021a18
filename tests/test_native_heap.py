"""netq._native_heap: when a transport asks glibc to hand freed native memory back, and that it
does come back.

The mechanism tests run in a child process (its allocator state is its own): a 16 MiB block
freed raises glibc's mmap threshold, after which 1 MiB blocks freed on a thread of their own stay
resident until ``malloc_trim``; ``expect_blocks`` raises it the same way, after which blocks
below it are reused instead of mapped afresh; the gRPC transport's counter is checked on a real
gRPC pair.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import netq as nq
from netq._native_heap import TRIM_AFTER, TRIM_AVAILABLE, TRIM_INTERVAL, NativeHeap
from netq.transports.grpc.loop import NATIVE_BLOCKS
from netq_testing import wait_for

glibc = pytest.mark.skipif(not TRIM_AVAILABLE, reason="no malloc_trim in this C library")


@glibc
def test_a_trim_waits_for_its_volume_and_its_interval():
    heap = NativeHeap()
    heap.moved(TRIM_AFTER - 1)
    assert not heap.trim_if_due(100.0)  # not enough bytes yet
    heap.moved(1)
    assert heap.trim_if_due(100.0)
    heap.moved(TRIM_AFTER)
    assert not heap.trim_if_due(100.0 + TRIM_INTERVAL / 2)  # too soon after the last
    assert heap.trim_if_due(100.0 + TRIM_INTERVAL)
    assert heap.trims == 2
    assert not heap.trim_if_due(200.0)  # the count starts again after each trim


# What both child processes start with: the C library's malloc and free, callable.
_LIBC = textwrap.dedent("""
    import ctypes
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    MiB = 1 << 20
""")

_CHURN = _LIBC + textwrap.dedent("""
    import os, threading
    from netq._native_heap import NativeHeap, TRIM_AFTER

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def churn(raise_threshold, pins):
        if raise_threshold:  # as a 16 MiB message does once it is freed
            big = libc.malloc(16 * MiB)
            ctypes.memset(big, 1, 16 * MiB)
            libc.free(big)
        blocks = [libc.malloc(MiB) for _ in range(128)]
        for block in blocks:
            ctypes.memset(block, 1, MiB)
        pins.append(libc.malloc(64))  # a live block above them: no trim of the heap's top
        for block in blocks:
            libc.free(block)

    for raise_threshold in (False, True):
        start, pins = rss(), []
        worker = threading.Thread(target=churn, args=(raise_threshold, pins))
        worker.start()
        worker.join()
        kept = rss() - start
        heap = NativeHeap()
        heap.moved(TRIM_AFTER)
        assert heap.trim_if_due(0.0)
        print(raise_threshold, kept // MiB, (rss() - start) // MiB)
""")


@glibc
def test_freed_buffers_kept_by_glibc_go_back_to_the_os_when_trimmed():
    """128 MiB freed on a thread: returned at once while glibc's threshold is low; after a
    16 MiB block was freed, most of it kept (up to a 64 MiB arena heap) until the trim."""
    result = subprocess.run([sys.executable, "-c", _CHURN], capture_output=True, text=True,
                            timeout=60, check=True)
    rows = {line.split()[0]: [int(n) for n in line.split()[1:]]
            for line in result.stdout.splitlines()}
    low_kept, low_after = rows["False"]
    raised_kept, raised_after = rows["True"]
    assert low_kept < 32, result.stdout  # mmapped blocks: unmapped when freed
    assert raised_kept >= 48, result.stdout  # the memory this module exists for
    assert raised_after <= raised_kept - 48, result.stdout  # ... handed back by the trim
    assert low_after < 32


_REUSE = _LIBC + textwrap.dedent("""
    import resource, sys
    from netq._native_heap import expect_blocks

    def faults(size, rounds=8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(rounds):  # what a stream of packets does: allocate, fill, free
            block = libc.malloc(size)
            ctypes.memset(block, 1, size)
            libc.free(block)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    mapped = faults(4 * MiB)
    first, again = expect_blocks(int(sys.argv[1])), expect_blocks(int(sys.argv[1]))
    faults(4 * MiB)  # the arena grows once
    print(mapped, faults(4 * MiB), first, again)
""")


def _huge_pages_always() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


@glibc
@pytest.mark.skipif(_huge_pages_always(), reason="transparent huge pages are on for every "
                    "mapping here: a fresh map faults a few huge pages, not one per 4 KiB")
def test_expected_blocks_are_reused_instead_of_mapped_afresh():
    """4 MiB blocks allocated, filled and freed in turn: each is a fresh map, faulted in all
    over again, until a larger block was freed; after expect_blocks the arena's pages serve
    them all. expect_blocks acts once per size."""
    result = subprocess.run([sys.executable, "-c", _REUSE, str(NATIVE_BLOCKS)],
                            capture_output=True, text=True, timeout=60, check=True)
    mapped, reused, first, again = result.stdout.split()
    assert int(mapped) >= 8 * 4 * 1024 // 64, result.stdout  # one fault per 256 KiB at least
    assert int(reused) * 10 < int(mapped), result.stdout
    assert (first, again) == ("True", "False")


@glibc
@pytest.mark.parametrize("transport", ["grpc"], indirect=True)
def test_a_grpc_transport_trims_after_moving_its_volume(transport):
    server = transport.make_server(max_size=16 * nq.MiB)
    client = transport.connect(server, max_size=16 * nq.MiB)
    payload = bytes(4 * nq.MiB)
    rounds = TRIM_AFTER // len(payload) + 2
    for _ in range(rounds):
        client.put(payload).result(30)
        assert len(server.get(timeout=30).data) == len(payload)
    # Both ends moved more than TRIM_AFTER; each trims between turns of its loop, and the
    # next turn comes within a heartbeat at the latest.
    wait_for(lambda: server._loop.carrier.native_heap.trims >= 1
             and client._loop.carrier.native_heap.trims >= 1, 30)
