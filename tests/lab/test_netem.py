"""netq.lab.netem: a relay reached across a veth pair into a network namespace, with and
without the kernel's netem (each test skips, saying why, where it cannot run: it needs root,
iproute2 and, for loss and delay, the sch_netem qdisc)."""

from __future__ import annotations

import subprocess
import time

import pytest

from netq.lab.netem import NetemLink, namespaces_unavailable, netem_unavailable
from netq_testing import pair_through, recv_exactly, seconds_to_move

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def upstream(loopback_listener):
    return loopback_listener


def test_netem_namespace_plumbing(upstream):
    """A relay listening in a namespace of its own, reached across a veth pair (no netem)."""
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    with NetemLink(upstream.getsockname(), loss=0, delay=0) as link:
        assert link.netloc.host == link.peer_address != "127.0.0.1"
        client, server = pair_through(link.relay.address, upstream)
        with client, server:
            client.sendall(b"across the veth")
            assert recv_exactly(server, 15) == b"across the veth"
        namespace = link.namespace
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert namespace not in names


def test_netem_loss_and_delay(upstream):
    reason = netem_unavailable()
    if reason:
        pytest.skip(reason)
    with NetemLink(upstream.getsockname(), loss=0.02, delay=0.01) as link:
        client, server = pair_through(link.relay.address, upstream)
        with client, server:
            started = time.monotonic()
            client.sendall(b"x")
            recv_exactly(server, 1)
            assert time.monotonic() - started >= 0.01
            assert seconds_to_move(client, server, 2_000_000) > 0  # TCP repairs every loss
