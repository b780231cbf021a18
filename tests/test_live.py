"""netq/live.py: the registry of the communicators still referenced, which the dashboard reads.

Oldest first; a closed one stays listed while referenced and goes once collected; nothing in
the registry keeps one alive.
"""

from __future__ import annotations

import gc

import netq as nq
from netq import live
from netq.communicator import live_communicators


def new_server() -> nq.Communicator:
    return nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(host="127.0.0.1", port=0)))


def test_listed_oldest_first_closed_while_referenced_and_gone_once_collected():
    first, second, third = new_server(), new_server(), new_server()
    try:
        ours = [c for c in live.live_communicators() if c in (first, second, third)]
        assert ours == [first, second, third]
        assert live_communicators is live.live_communicators  # the name netq.communicator had
        second.close(timeout=5)
        assert second in live.live_communicators()  # closed, still referenced: still listed
        gc.collect()
        count = live.count()
        ident = second.id
        del second, ours
        gc.collect()
        assert ident not in {c.id for c in live.live_communicators()}  # nothing kept it alive
        assert live.count() <= count - 1
        assert {first, third} <= set(live.inherited_at_fork())
    finally:
        first.close(timeout=5)
        third.close(timeout=5)
