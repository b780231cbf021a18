"""gRPC endpoints: raw grpcio (the floor for gRPC rows) and netq over gRPC.

raw-grpc   one grpcio bidirectional stream of raw bytes (generic handler, no protobuf), the
           same shape netq uses: a message of S bytes travels as ceil(S / 1 MiB) stream
           messages of at most 1 MiB (message-size limits raised to 1 MiB + 64 KiB on both
           ends); the receiver joins them back into one ``bytes`` per message. ``grpc.aio`` on
           both ends (the fastest combination measured here: aio/aio 64 B round trip p50
           ~510 us vs 530-590 us with a sync end). The receiver answers one message at the end,
           which is when the sender stops its clock. No acknowledgements, no flow control
           beyond HTTP/2's, no reconnects: what grpcio alone costs.
netq-grpc  the netq roles of netq_peer.py (put/get per message, round trip, stall, many
           clients) with ``Protocol.GRPC`` instead of TCP.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc
import grpc.aio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

CHUNK = 1 << 20
OPTIONS = [("grpc.max_send_message_length", CHUNK + 65536),
           ("grpc.max_receive_message_length", CHUNK + 65536),
           ("grpc.so_reuseport", 0)]
PATH = "/bench.Raw/Stream"


def _chunks(payload: bytes) -> list:
    if len(payload) <= CHUNK:
        return [payload]
    view = memoryview(payload)
    return [bytes(view[i:i + CHUNK]) for i in range(0, len(payload), CHUNK)]


async def _read_message(next_chunk, size: int):
    """One message of ``size`` bytes from 1 MiB stream messages; None at the end."""
    first = await next_chunk()
    if first is None or len(first) >= size:
        return first
    parts, got = [first], len(first)
    while got < size:
        part = await next_chunk()
        parts.append(part)
        got += len(part)
    return b"".join(parts)


async def _serve(handler) -> tuple[grpc.aio.Server, str]:
    generic = grpc.method_handlers_generic_handler(
        "bench.Raw", {"Stream": grpc.stream_stream_rpc_method_handler(handler)})
    server = grpc.aio.server(handlers=[generic], options=OPTIONS)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _reader(request_iterator):
    iterator = request_iterator.__aiter__()

    async def next_chunk():
        try:
            return await iterator.__anext__()
        except StopAsyncIteration:
            return None
    return next_chunk


# ----------------------------------------------------------------------------- raw: one way
async def raw_recv(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    done = asyncio.Event()

    async def handler(request_iterator, context):
        try:
            next_chunk = _reader(request_iterator)
            rec = common.Recorder(count, size)
            last = await _read_message(next_chunk, size)          # warm-up
            rec.start()
            nbytes, n = len(last), 1
            for _ in range(count):
                last = await _read_message(next_chunk, size)
                nbytes += len(last)
                n += 1
            rec.stop()
            rec.report(n, nbytes, last)
            await context.write(b"done")
        except BaseException:
            traceback.print_exc()                              # grpc would swallow it
            raise
        finally:
            done.set()

    server, addr = await _serve(handler)
    common.ready(addr)
    await done.wait()
    await server.stop(1)


async def raw_send(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    chunks = _chunks(common.payload_of(size))
    async with grpc.aio.insecure_channel(spec["addr"], options=OPTIONS) as channel:
        call = channel.stream_stream(PATH)()
        clock = common.SendClock()
        clock.start()
        write = call.write
        for _ in range(count + 1):
            for chunk in chunks:
                await write(chunk)
        clock.sent()
        await call.done_writing()
        await call.read()                                     # "done": everything arrived
        clock.stop()
        await call.code()                 # the server ended the call: closing cannot cancel it
    clock.report(count, size)
    common.wait_released()


# ----------------------------------------------------------------------------- raw: round trip
async def raw_echo(spec: dict) -> None:
    total = common.WARMUP_PINGS + spec["count"]
    done = asyncio.Event()

    async def handler(request_iterator, context):
        n = 0
        async for message in request_iterator:
            await context.write(message)
            n += 1
            common.PROGRESS["echoed"] = n
        done.set()

    server, addr = await _serve(handler)
    common.ready(addr)
    await done.wait()
    common.result(role="echo", echoed=total, peak_rss_kb=common.maxrss_kb())
    await server.stop(1)


async def raw_ping(spec: dict) -> None:
    size = spec["size"]
    payload = common.payload_of(size)
    async with grpc.aio.insecure_channel(spec["addr"], options=OPTIONS) as channel:
        call = channel.stream_stream(PATH)()
        base = common.rss_kb()
        samples = []
        now = common.now
        for i in range(common.WARMUP_PINGS + spec["count"]):
            if i == common.WARMUP_PINGS:
                common.PING_CPU.start()
            t0 = now()
            await call.write(payload)
            await call.read()
            t1 = now()
            if i >= common.WARMUP_PINGS:
                samples.append(t1 - t0)
        common.PING_CPU.stop()
        await call.done_writing()
        await call.code()
    common.latency_report(samples, size, base)


# ----------------------------------------------------------------------------- netq over gRPC
def _netq_roles() -> dict:
    import netq as nq
    import netq_peer

    # Every netq role of netq_peer.py, with gRPC instead of TCP (the module looks the protocol
    # up through this function at each call).
    netq_peer._protocol = lambda spec: nq.Protocol.GRPC
    return {"recv": netq_peer.recv, "send": netq_peer.send, "echo": netq_peer.echo,
            "ping": netq_peer.ping, "stall-recv": netq_peer.stall_recv,
            "stall-send": netq_peer.stall_send, "many-recv": netq_peer.many_recv,
            "many-send": netq_peer.many_send}


def main() -> None:
    import json

    spec = json.loads(sys.argv[1])
    if spec["transport"] == "raw-grpc":
        roles = {"recv": raw_recv, "send": raw_send, "echo": raw_echo, "ping": raw_ping}
        common.PING_CPU.echo_pid = spec.get("echo_pid")
        asyncio.run(roles[spec["role"]](spec))
    else:
        common.main(_netq_roles())


if __name__ == "__main__":
    main()
