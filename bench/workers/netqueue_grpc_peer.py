"""Upstream net-queue 2.6.4's gRPC backend (Python 3.13 venv, see netqueue_env.py).

net-queue-grpc  netqueue_peer.py's roles with ``Protocol.GRPC``. net-queue 2.6.x cannot run
                its gRPC backend as shipped; this worker applies the two workarounds of
                shared/bench/netqueue_baseline.sh's launcher before anything else:

  * the package is misspelled ``net_queue/gprc`` (``nq.new`` imports ``net_queue.grpc``), and
    its ``__init__`` pops the last ``sys.path`` entry (the venv's site-packages here) before
    ``import grpc``: import grpc first, then alias ``net_queue.grpc*`` to ``net_queue.gprc*``;
  * its client's receive-poll loop is dead since upstream commit b857413 (a ``SimpleQueue`` is
    always truthy, so the client never polls and waits forever): restore the earlier
    condition with a queue that is falsy when empty.

Nothing else is changed: the client still polls the server for downlink data (with up to
0.5 s backoff), which is what its round trip pays for.
"""

from __future__ import annotations

import importlib
import os
import queue
import sys

import grpc  # noqa: F401  (before net_queue.gprc pops sys.path[-1])

for _sub in ("", ".client", ".server"):
    sys.modules["net_queue.grpc" + _sub] = importlib.import_module("net_queue.gprc" + _sub)


class _FalsyWhenEmpty(queue.SimpleQueue):
    def __bool__(self) -> bool:
        return not self.empty()


_client_class = sys.modules["net_queue.gprc.client"].Communicator
_client_init = _client_class.__init__


def _init(self, *args, **kwargs):
    _client_init(self, *args, **kwargs)
    self._get_grpc = _FalsyWhenEmpty()


_client_class.__init__ = _init

import net_queue as nq  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import netqueue_peer  # noqa: E402


def _server() -> tuple[object, str]:
    port = common.free_port()
    server = nq.new(protocol=nq.Protocol.GRPC, purpose=nq.Purpose.SERVER,
                    options=netqueue_peer._options("127.0.0.1", port))
    return server, f"127.0.0.1:{port}"


def _client(addr: str):
    host, port = addr.rsplit(":", 1)
    return nq.new(protocol=nq.Protocol.GRPC, purpose=nq.Purpose.CLIENT,
                  options=netqueue_peer._options(host, int(port)))


netqueue_peer._server = _server
netqueue_peer._client = _client

if __name__ == "__main__":
    common.main({"recv": netqueue_peer.recv, "send": netqueue_peer.send,
                 "echo": netqueue_peer.echo, "ping": netqueue_peer.ping})
