"""netq endpoints (default options, default pickle serializer).

netq-tcp        put() per message -> get() per message, TCP on 127.0.0.1
netq-tcp-batch  put_many() of up to 1000 messages (<= 256 KiB per call) -> get_many(1000)
netq-unix       as netq-tcp over a Unix stream socket in the run's temp dir
netq-unix-numpy        netq-tcp-numpy over Unix, default options (shared memory)
netq-unix-noshm-numpy  the same with ConnectionOptions(shared_memory=False)
netq-unix-handout      numpy arrays from comm.shared_array (no copy on put())
netq-tls        as netq-tcp with TLS (self-signed certificate made by run.py)

Every kind of large part over Unix (issue 54; default options unless ``-noshm``):
netq-unix-ro        a read-only uint8 array, np.frombuffer over bytes
netq-unix-memmap    a read-only np.memmap (mode "r") of a file in the run's temp dir
netq-unix-writable  a writable uint8 array
netq-unix-bytes     bytes
netq-unix-noshm-ro  netq-unix-ro with ConnectionOptions(shared_memory=False)
... and each of these with ``-wait``: put(), wait for its future, put() the same object again
(the rows above put a stream). Their receivers drop each message before the next get(), as a
consumer done with it does, so the peak RSS is netq's, not two messages of the caller's.

The sender waits for the warm-up message's future before it sends the rest, so the
receiver's clock starts on an otherwise idle connection (and get_many's first batch is the
warm-up alone). Scenario roles: ``stall-recv``/``stall-send`` (a receiver that never calls
get) and ``many-recv``/``many-send`` (one server, many client communicators per process).
"""

from __future__ import annotations

import concurrent.futures
import os
import struct
import sys
import time

import netq as nq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

BATCH_MESSAGES = 1000
BATCH_BYTES = 256 * 1024
FUTURE_TIMEOUT = 120.0


# ----------------------------------------------------------------------------- set-up
def _protocol(spec: dict):
    return nq.Protocol.UNIX if spec["transport"].startswith("netq-unix") else nq.Protocol.TCP


def _connection(spec: dict) -> nq.ConnectionOptions:
    """Default options, but shared memory off for the ``-noshm`` rows."""
    return nq.ConnectionOptions(shared_memory="-noshm" not in spec["transport"])


WATCHED: list = []          # every communicator of this process, described on SIGUSR2


def _describe() -> str:
    """For a hung worker: totals over this process's communicators and peers, and the first
    peers that still hold data or have no credit (full statistics of 50 communicators or
    200 peers would drown the stacks)."""
    states: dict = {}
    totals = dict(messages_in=0, messages_out=0, queue_in=0, queue_out=0, inflight=0, memory=0)
    holding, starved = [], []
    for comm in WATCHED:
        try:
            st = comm.statistics()
        except Exception as e:  # noqa: BLE001
            return f"statistics() failed: {e!r}"
        states[f"comm {st.state}"] = states.get(f"comm {st.state}", 0) + 1
        for p in st.peers:
            states[f"peer {p.state}"] = states.get(f"peer {p.state}", 0) + 1
            for k in totals:
                totals[k] += getattr(p, k)
            if p.queue_out or p.inflight or p.queue_in:
                holding.append(p)
            elif p.credit_out <= 0 or p.credit_in <= 0:
                starved.append(p)
    return (f"{len(WATCHED)} communicator(s), {states}, totals {totals}; "
            f"{len(holding)} peer(s) holding data: {holding[:2]!r}; "
            f"{len(starved)} more with credit <= 0: {starved[:1]!r}")


def _diagnosable(comm):
    WATCHED.append(comm)
    return comm


common.on_diagnose(_describe)


def _serve(spec: dict):
    """Bind a server for spec['transport']; returns (server, address for the client)."""
    security = None
    if spec["transport"].startswith("netq-unix"):
        path = os.path.join(spec["tmpdir"], "netq.sock")
        netloc, addr = nq.NetworkLocation(path=path), "unix:" + path
    else:
        port = common.free_port()
        netloc, addr = nq.NetworkLocation(host="127.0.0.1", port=port), f"127.0.0.1:{port}"
        if spec["transport"] == "netq-tls":
            security = nq.SecurityOptions(key=spec["tls"]["key"], certificate=spec["tls"]["cert"])
    opts = nq.CommunicatorOptions(netloc=netloc, security=security,
                                  connection=_connection(spec))
    return _diagnosable(nq.new(_protocol(spec), nq.Purpose.SERVER, opts)), addr


def _connect(spec: dict):
    addr, security = spec["addr"], None
    if addr.startswith("unix:"):
        netloc = nq.NetworkLocation(path=addr[5:])
    else:
        host, port = addr.rsplit(":", 1)
        netloc = nq.NetworkLocation(host=host, port=int(port))
        if spec["transport"] == "netq-tls":
            security = nq.SecurityOptions(certificate=spec["tls"]["cert"])
    opts = nq.CommunicatorOptions(netloc=netloc, security=security,
                                  connection=_connection(spec))
    return _diagnosable(nq.new(_protocol(spec), nq.Purpose.CLIENT, opts))


# ----------------------------------------------------------------------------- one-way throughput
def recv(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    server, addr = _serve(spec)
    rec = common.Recorder(count, size)
    common.ready(addr)
    if spec["transport"] == "netq-tcp-batch":
        get_many = server.get_many
        msgs = get_many(max_messages=BATCH_MESSAGES)
        rec.start()
        n, nbytes = len(msgs), sum(len(m.data) for m in msgs)
        while n < count + 1:
            msgs = get_many(max_messages=BATCH_MESSAGES)
            n += len(msgs)
            for m in msgs:
                nbytes += len(m.data)
        last = msgs[-1].data
        rec.stop()
    elif spec["transport"] in KIND_ROWS:
        get = server.get
        nbytes, last = _receive_dropping(rec, lambda: get().data)
        n = count + 1
    else:
        get = server.get
        nbytes, last = rec.receive_all(lambda: get().data)
        n = count + 1
    rec.report(n, nbytes, last)
    server.close()


KIND_ROWS = {f"netq-unix{road}-{kind}{wait}" for road in ("", "-noshm")
             for kind in ("ro", "memmap", "writable", "bytes") for wait in ("", "-wait")}


def _kind_payload(spec: dict, payload: bytes):
    """The object a KIND_ROWS row puts: ``payload`` as that kind of part."""
    import numpy

    kind = spec["transport"].removesuffix("-wait").rsplit("-", 1)[1]
    if kind == "ro":
        return numpy.frombuffer(payload, numpy.uint8)
    if kind == "memmap":
        path = os.path.join(spec["tmpdir"], "memmap.dat")
        with open(path, "wb") as f:
            f.write(payload)
        return numpy.memmap(path, numpy.uint8, "r")
    if kind == "writable":
        return numpy.frombuffer(payload, numpy.uint8).copy()
    return payload


def _receive_dropping(rec, read) -> tuple[int, object]:
    """Recorder.receive_all, dropping each message before the next read()."""
    last = read()
    rec.start()
    nbytes = len(last)
    for _ in range(rec.count):
        last = None  # done with it: its memory may go before the next one arrives
        last = read()
        nbytes += len(last)
    rec.stop()
    return nbytes, last


def _send_waiting(client, payload, count: int) -> None:
    """put(), wait for the future, put() the same object again."""
    put = client.put
    for _ in range(count):
        put(payload).result(FUTURE_TIMEOUT)


def _payload(spec: dict, client=None):
    """The message put(): bytes, or for the ``-numpy`` rows the same bytes as a uint8 numpy
    array (what researchers send: one ndarray per put(); len() and the CRC check still see
    its bytes); for ``netq-unix-handout`` that array in memory the client handed out
    (``comm.shared_array``: put() sends it without a copy)."""
    payload = common.payload_of(spec["size"])
    if spec["transport"] in KIND_ROWS:
        return _kind_payload(spec, payload)
    if spec["transport"] == "netq-unix-handout" and client is not None:
        import numpy

        array = client.shared_array(len(payload), numpy.uint8)
        array[:] = numpy.frombuffer(payload, numpy.uint8)
        return array
    if spec["transport"].endswith("-numpy"):
        import numpy

        return numpy.frombuffer(payload, numpy.uint8).copy()
    return payload


def send(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    client = _connect(spec)
    payload = _payload(spec, client)
    clock = common.SendClock()
    clock.start()
    client.put(payload).result(FUTURE_TIMEOUT)          # warm-up, received before the rest
    if spec["transport"] == "netq-tcp-batch":
        per_call = max(1, min(BATCH_MESSAGES, BATCH_BYTES // max(size, 1)))
        full = [payload] * per_call
        calls, rest = divmod(count, per_call)
        put_many = client.put_many
        fut = None
        for _ in range(calls):
            fut = put_many(full)
        if rest:
            fut = put_many(full[:rest])
    elif spec["transport"].endswith("-wait"):
        _send_waiting(client, payload, count)
        fut = None
    else:
        put = client.put
        for _ in range(count):
            fut = put(payload)
    clock.sent()
    if fut is not None:
        fut.result(FUTURE_TIMEOUT)
    client.close()
    clock.stop()
    clock.report(count, size)
    common.wait_released()


# ----------------------------------------------------------------------------- round trip
def echo(spec: dict, serve=None, report=dict) -> None:
    """``serve(spec) -> (server, addr)`` and ``report() -> dict`` (extra result fields) let
    other netq workers (netq_mqtt_peer.py) run this same loop."""
    server, addr = (serve or _serve)(spec)
    common.ready(addr)
    common.echo_messages(server, spec["count"])
    common.result(role="echo", peak_rss_kb=common.maxrss_kb(), **report())
    server.close()


def ping(spec: dict, connect=None) -> None:
    size = spec["size"]
    payload = common.payload_of(size)
    client = (connect or _connect)(spec)
    base = common.rss_kb()
    samples = common.queue_round_trips(client, payload, spec["count"])
    client.close()
    common.latency_report(samples, size, base)


def ping_self(spec: dict) -> None:
    """Server and client in this one process, as a notebook holds them: a thread echoes, the
    main thread puts and gets."""
    size, count = spec["size"], spec["count"]
    payload = common.payload_of(size)

    def serve_echo():
        server, addr = _serve(spec)

        def answer():
            try:
                common.echo_messages(server, count)
            finally:
                server.close()

        return addr, answer

    def ping_from(addr: str) -> list[float]:
        client = _connect(dict(spec, addr=addr))
        try:
            return common.queue_round_trips(client, payload, count)
        finally:
            client.close()

    common.in_one_process(serve_echo, ping_from, size)


# ----------------------------------------------------------------------------- stalled receiver
SEQ = struct.Struct("!Q")   # the stall sender numbers its messages; the drain checks the order


def _windows() -> dict:
    c = nq.ConnectionOptions()
    return {"send_budget": c.send_budget, "recv_budget": c.recv_budget, "max_size": c.max_size}


def _tracked_bytes(comm) -> int | None:
    """netq's own count of the bytes it holds (queues + in flight), if it reports one."""
    try:
        return comm.statistics().memory
    except Exception:  # noqa: BLE001 - statistics are optional for the bench
        return None


def stall_recv(spec: dict) -> None:
    """Never calls get() until the orchestrator says ``DRAIN <n>``; then drains n messages and
    checks that they arrive complete and in order."""
    size = spec["size"]
    server, addr = _serve(spec)
    base = common.rss_kb()
    common.ready(addr, base_rss_kb=base)
    expected = int(common.read_command("DRAIN")[0])
    stalled_rss, stalled_peak = common.rss_kb(), common.maxrss_kb()
    tracked = _tracked_bytes(server)
    got = nbytes = 0
    in_order = True
    t0 = time.monotonic()
    while got < expected:
        for m in server.get_many(max_messages=BATCH_MESSAGES, timeout=30):
            in_order &= SEQ.unpack_from(m.data)[0] == got
            got += 1
            nbytes += len(m.data)
    common.result(role="stall-recv", base_rss_kb=base, stalled_rss_kb=stalled_rss,
                  stalled_peak_kb=stalled_peak, netq_memory_bytes=tracked, drained=got,
                  drained_bytes=nbytes,
                  in_order=in_order, drain_s=time.monotonic() - t0,
                  ok=got == expected and nbytes == expected * size and in_order,
                  peak_rss_kb=common.maxrss_kb(), **_windows())
    server.close()


def stall_send(spec: dict) -> None:
    """put() fresh 1 MiB messages for spec['seconds'] to a receiver that does not read; each
    put waits at most 0.1 s (then nq.Full). Memory must stay bounded by the windows."""
    size, seconds = spec["size"], spec["seconds"]
    template = bytearray(common.payload_of(size))
    client = _connect(spec)
    base = common.rss_kb()
    accepted = fulls = 0
    first_full_s = None
    high_rss = base
    fut = None
    t0 = time.monotonic()
    while (el := time.monotonic() - t0) < seconds:
        SEQ.pack_into(template, 0, accepted)
        data = bytes(template)                   # a new object each time: nothing is shared
        try:
            fut = client.put(data, timeout=0.1)
            accepted += 1
        except nq.Full:
            fulls += 1
            if first_full_s is None:
                first_full_s = el
        del data
        high_rss = max(high_rss, common.rss_kb())
    stalled_rss = common.rss_kb()
    tracked = _tracked_bytes(client)
    common.emit("STALLED", accepted=accepted, stalled_rss_kb=stalled_rss, base_rss_kb=base)
    common.read_command("GO")                      # the receiver is draining now
    if fut is not None:
        fut.result(FUTURE_TIMEOUT)
    client.close()
    common.result(role="stall-send", accepted=accepted, full_errors=fulls,
                  first_full_s=first_full_s, base_rss_kb=base, stalled_rss_kb=stalled_rss,
                  stalled_high_rss_kb=high_rss, netq_memory_bytes=tracked,
                  last_future_ok=fut is not None,
                  peak_rss_kb=common.maxrss_kb(), **_windows())
    common.wait_released()


# ----------------------------------------------------------------------------- many clients
def many_recv(spec: dict) -> None:
    size, clients, per_client = spec["size"], spec["clients"], spec["count"]
    total = clients * per_client
    server, addr = _serve(spec)
    base = common.rss_kb()
    common.ready(addr, base_rss_kb=base)
    peers = [int(p) for p in common.read_command("PEERS")]
    per_peer: dict = {}
    nbytes = 0
    get = server.get
    m = get()
    pc0 = [common.proc_cpu_s(p) for p in peers]
    c0, t0 = common.cpu_s(), common.now()
    per_peer[m.peer] = 1
    nbytes += len(m.data)
    for _ in range(total - 1):
        m = get()
        per_peer[m.peer] = per_peer.get(m.peer, 0) + 1
        nbytes += len(m.data)
    t1, c1 = common.now(), common.cpu_s()
    pc1 = [common.proc_cpu_s(p) for p in peers]
    peak = common.maxrss_kb()
    el = t1 - t0
    ok = (len(per_peer) == clients and all(v == per_client for v in per_peer.values())
          and nbytes == total * size and common.crc_matches(m.data, size))
    peer_cpu = None if None in pc0 + pc1 else sum(pc1) - sum(pc0)
    common.result(role="many-recv", ok=ok, peers=len(per_peer), msgs=total, bytes=nbytes,
                  min_per_peer=min(per_peer.values()), max_per_peer=max(per_peer.values()),
                  elapsed=el, msgs_per_s=(total - 1) / el if el > 0 else None,
                  recv_cpu_s=c1 - c0, send_cpu_s=peer_cpu,
                  base_rss_kb=base, peak_rss_kb=peak)
    server.close()


def many_send(spec: dict) -> None:
    size, per_client = spec["size"], spec["count"]
    payload = common.payload_of(size)
    comms = [_connect(spec) for _ in range(spec["comms"])]
    base = common.rss_kb()
    common.emit("CONNECTED", comms=len(comms))
    common.read_command("GO")
    clock = common.SendClock()
    clock.base_rss = base
    clock.start()
    futures = []
    for _ in range(per_client):
        for c in comms:
            futures.append(c.put(payload))
    clock.sent()
    done, pending = concurrent.futures.wait(futures, timeout=FUTURE_TIMEOUT)
    failed = sum(1 for f in done if f.exception() is not None)
    for c in comms:
        c.close()
    clock.stop()
    clock.report(per_client * len(comms), size, comms=len(comms), pending=len(pending),
                 failed=failed)
    common.wait_released()


if __name__ == "__main__":
    common.main({"recv": recv, "send": send, "echo": echo, "ping": ping,
                 "ping-self": ping_self, "stall-recv": stall_recv, "stall-send": stall_send,
                 "many-recv": many_recv, "many-send": many_send})
