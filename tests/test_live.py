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


def test_a_named_communicator_is_named_in_this_process_messages_until_collected():
    """CommunicatorOptions.name: messages call a communicator of this process by the name it
    was given, and by its id once it is gone (tests/engine/test_diagnostics.py: the
    sentences that use it)."""
    server = new_server()
    options = nq.CommunicatorOptions(
        netloc=nq.NetworkLocation("127.0.0.1", server.address[1]), name="client-07",
        connection=nq.ConnectionOptions(send_budget=64 * 1024))
    client = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, options)
    ident = client.id
    try:
        assert live.name_of(ident) == "client-07"
        assert live.name_of(server.id) == str(server.id)  # no name given: its id
        client.put(b"x").result(timeout=30)
    finally:
        client.close(timeout=5)
        server.close(timeout=5)
    del client
    gc.collect()
    assert live.name_of(ident) == str(ident)


def test_a_name_must_be_a_non_empty_string():
    for bad in ("", "  ", 7):
        try:
            nq.CommunicatorOptions(name=bad)  # type: ignore[arg-type]
        except ValueError as error:
            assert "name must be a non-empty string" in str(error)
        else:
            raise AssertionError(f"{bad!r} was accepted as a name")
