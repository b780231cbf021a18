"""How the transport suites drive ``Protocol.GRPC`` (a TransportSpec for conftest.TRANSPORTS).

A real grpcio server per test (port 0 on 127.0.0.1), plain or TLS with the session's throwaway
CA. gRPC is not a byte stream, so the raw-socket fault tests skip it; ``cut()`` closes the
client's gRPC channel under netq (its TCP connection goes, every stream on it is cancelled, no
goodbye is sent): both ends lose the link at once, packets in flight are lost, and the session
must resume on the client's next stream.
"""

from __future__ import annotations

import netq as nq
from harness import Env, TransportSpec


class GRPCSpec(TransportSpec):
    protocol = nq.Protocol.GRPC
    byte_stream = False
    supports_cut = True

    def __init__(self, name: str, tls: bool = False) -> None:
        self.name = name
        self.tls = tls

    def __repr__(self) -> str:
        return f"<transport {self.name}>"

    def unavailable(self) -> str | None:
        try:
            import grpc  # noqa: F401
        except ImportError as error:
            return f"grpcio is not installed (pip install 'netq[grpc]'): {error}"
        return None

    def server_netloc(self, env: Env) -> nq.NetworkLocation:
        return nq.NetworkLocation(host="127.0.0.1", port=0)

    def client_netloc(self, netloc: nq.NetworkLocation, address) -> nq.NetworkLocation:
        return nq.NetworkLocation(host="127.0.0.1", port=address[1])

    def security(self, env: Env, purpose: nq.Purpose) -> nq.SecurityOptions | None:
        return self.tls_security(env, purpose) if self.tls else None

    def cut(self, client: nq.Communicator) -> bool:
        session = client._engine.server_session
        link = session.link if session is not None else None
        if link is None or link.dropped:
            return False
        stream = link.channel
        if stream.closing or stream.ended or stream.grpc_channel is None:
            return False
        transport = client._loop.carrier
        channel = stream.grpc_channel
        try:
            # On the client's I/O thread, which drives its gRPC loop: close the channel
            # without grace (the connection closes, the stream is cancelled).
            transport._loop.call_soon_threadsafe(
                lambda: transport._loop.create_task(channel.close(None)))
        except RuntimeError:
            return False  # the loop is closed: the client is gone
        transport.wake()
        return True
