"""Raw TCP endpoints: the pure-Python floor that every other row is compared with.

raw-tcp        blocking socket, TCP_NODELAY, 8-byte big-endian length prefix; the sender does
               one ``sendmsg([hdr, payload])`` per message; the receiver ``recv_into`` a reused
               buffer with MSG_WAITALL (header, then payload). Never materialises a message:
               an upper bound, and the denominator of every ratio.
raw-tcp-batch  the sender coalesces frames <= 64 KiB into one scatter-gather ``sendmsg``
               (<= 64 KiB or 1000 iovecs, no payload copy); the receiver ``recv_into`` a 1 MiB
               staging buffer, parses many frames per syscall and hands out owned ``bytes``;
               payloads > 64 KiB are read straight into a fresh ``bytearray`` (MSG_WAITALL).
raw-unix       raw-tcp over a Unix stream socket in the run's temp dir (the same-host floor)
raw-ssl        raw-tcp's framing over a blocking ``ssl`` socket (TLS 1.2 minimum, the run's
               self-signed certificate, verified by the client against it; whatever version
               and cipher OpenSSL negotiates: TLS 1.3, AES-GCM on x86). SSL sockets cannot
               ``sendmsg``: the sender joins header and payload into one ``sendall`` up to
               64 KiB (a copy that small is cheaper than a TLS record and a syscall of its
               own) and makes two ``sendall`` calls (header, then the payload itself, no copy)
               above that. The receiver ``recv_into`` one reused buffer in a loop (SSL sockets
               take no MSG_WAITALL; each call returns at most one TLS record). The floor of
               ``netq-tls``'s ratios.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

HDR = struct.Struct("!Q")
SMALL = 64 * 1024          # frames up to this size are coalesced / staged
STAGE = 1 << 20            # staging buffer of the batch receiver
BATCH_IOV = 1000           # < IOV_MAX (1024)


# ----------------------------------------------------------------------------- sockets
def listen() -> tuple[socket.socket, str]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def listen_unix(tmpdir: str) -> tuple[socket.socket, str]:
    path = os.path.join(tmpdir, "raw.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(1)
    return s, "unix:" + path


def accept(listener: socket.socket) -> socket.socket:
    conn, _ = listener.accept()
    listener.close()
    if conn.family != socket.AF_UNIX:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def connect(addr: str) -> socket.socket:
    if addr.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(addr[5:])
        return s
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def sendmsg_all(sock: socket.socket, bufs: list, total: int) -> None:
    sent = sock.sendmsg(bufs)
    if sent == total:
        return
    views = [memoryview(b).cast("B") for b in bufs]   # rare: partial write
    while views:
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if not views:
            return
        if sent:
            views[0] = views[0][sent:]
        sent = sock.sendmsg(views)


def ssl_server_context(tls: dict) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls["cert"], tls["key"])
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def ssl_client_context(tls: dict) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)   # verifies the certificate and host
    context.load_verify_locations(tls["cert"])
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def ssl_recv_exact(sock: ssl.SSLSocket, view: memoryview, n: int) -> None:
    got = 0
    while got < n:
        r = sock.recv_into(view[got:n], n - got)
        if not r:
            raise EOFError("peer closed")
        got += r


def recv_exact(sock: socket.socket, view: memoryview, n: int) -> None:
    got = sock.recv_into(view, n, socket.MSG_WAITALL)
    while got < n:
        r = sock.recv_into(view[got:n], n - got, socket.MSG_WAITALL)
        if r == 0:
            raise EOFError("peer closed")
        got += r


# ----------------------------------------------------------------------------- readers
class ReusedBufferReader:
    """Two syscalls per message, no user-space copy, one reused buffer."""

    def __init__(self, sock: socket.socket, size: int, exact=recv_exact) -> None:
        self.sock = sock
        self.exact = exact
        self.hdr = bytearray(8)
        self.hv = memoryview(self.hdr)
        self.buf = bytearray(max(size, 1))
        self.bv = memoryview(self.buf)

    def read(self) -> memoryview:
        self.exact(self.sock, self.hv, 8)
        n = HDR.unpack(self.hdr)[0]
        if n > len(self.buf):
            self.buf = bytearray(n)
            self.bv = memoryview(self.buf)
        if n:
            self.exact(self.sock, self.bv, n)
        return self.bv[:n]


class StagingReader:
    """Many frames per recv_into of a 1 MiB staging buffer; owned messages out."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray(STAGE)
        self.mv = memoryview(self.buf)
        self.start = self.end = 0

    def read(self):
        buf, mv = self.buf, self.mv
        while True:
            start, end = self.start, self.end
            avail = end - start
            if avail >= 8:
                n = HDR.unpack_from(buf, start)[0]
                if n <= SMALL and avail >= 8 + n:
                    self.start = start + 8 + n
                    return bytes(mv[start + 8:start + 8 + n])
                if n > SMALL:
                    out = bytearray(n)
                    ov = memoryview(out)
                    have = min(avail - 8, n)
                    ov[:have] = mv[start + 8:start + 8 + have]
                    self.start = start + 8 + have
                    if have < n:
                        self.start = self.end = 0
                        recv_exact(self.sock, ov[have:], n - have)
                    return out
            if start:                                   # compact, then one bulk recv
                if avail:
                    mv[:avail] = mv[start:end]
                self.start, self.end = 0, avail
            r = self.sock.recv_into(mv[self.end:], STAGE - self.end)
            if not r:
                raise EOFError("peer closed")
            self.end += r


# ----------------------------------------------------------------------------- roles
def recv(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    batched = spec["transport"] == "raw-tcp-batch"
    listener, addr = listen_unix(spec["tmpdir"]) if spec["transport"] == "raw-unix" else listen()
    rec = common.Recorder(count, size)
    common.ready(addr)
    sock = accept(listener)
    if spec["transport"] == "raw-ssl":
        sock = ssl_server_context(spec["tls"]).wrap_socket(sock, server_side=True)
        read = ReusedBufferReader(sock, size, ssl_recv_exact).read
    else:
        read = (StagingReader(sock) if batched else ReusedBufferReader(sock, size)).read
    nbytes, last = rec.receive_all(read)
    rec.report(count + 1, nbytes, last)
    sock.close()


def send(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    payload = common.payload_of(size)
    sock = connect(spec["addr"])
    if spec["transport"] == "raw-ssl":
        host = spec["addr"].rsplit(":", 1)[0]
        sock = ssl_client_context(spec["tls"]).wrap_socket(sock, server_hostname=host)
    clock = common.SendClock()
    clock.start()
    if spec["transport"] == "raw-ssl":
        _send_ssl(sock, payload, count + 1)
    elif spec["transport"] == "raw-tcp-batch" and size <= SMALL:
        _send_coalesced(sock, payload, count + 1)
    else:
        sendmsg, pack = sock.sendmsg, HDR.pack
        total = 8 + size
        for _ in range(count + 1):
            hdr = pack(size)
            if sendmsg([hdr, payload]) != total:
                sendmsg_all(sock, [hdr, payload], total)   # finishes the partial write
    clock.sent()
    sock.shutdown(socket.SHUT_WR)  # an SSL socket drops its TLS layer here: plain reads below
    while sock.recv(65536):  # b"" once the receiver has read everything and closed (TLS 1.3:
        pass                 # after the session tickets the sender never read)
    sock.close()
    clock.stop()
    clock.report(count, size)
    common.wait_released()


def _send_ssl(sock: ssl.SSLSocket, payload: bytes, n: int) -> None:
    """Per message: one ``sendall(header + payload)`` up to SMALL, else two ``sendall``."""
    pack, size, sendall = HDR.pack, len(payload), sock.sendall
    if size <= SMALL:
        for _ in range(n):
            sendall(pack(size) + payload)
    else:
        for _ in range(n):
            sendall(pack(size))
            sendall(payload)


def _send_coalesced(sock: socket.socket, payload: bytes, n: int) -> None:
    """Per message: append header + payload to the pending iovec list (like a library's put);
    one sendmsg per ~64 KiB or 1000 iovecs."""
    pack, size = HDR.pack, len(payload)
    iov, pending = [], 0
    for _ in range(n):
        iov.append(pack(size))
        iov.append(payload)
        pending += 8 + size
        if pending >= SMALL or len(iov) >= BATCH_IOV:
            sendmsg_all(sock, iov, pending)
            iov, pending = [], 0
    if iov:
        sendmsg_all(sock, iov, pending)


def _answer(sock: socket.socket, size: int, count: int) -> None:
    reader = ReusedBufferReader(sock, size)
    for _ in range(common.WARMUP_PINGS + count):
        m = reader.read()
        sendmsg_all(sock, [HDR.pack(len(m)), m], 8 + len(m))


def _ping(addr: str, size: int, count: int) -> list[float]:
    payload = common.payload_of(size)
    sock = connect(addr)
    reader = ReusedBufferReader(sock, size)
    frame = [HDR.pack(size), payload]

    def roundtrip():
        sendmsg_all(sock, frame, 8 + size)
        reader.read()

    try:
        return common.ping_loop(roundtrip, count)
    finally:
        sock.close()


def echo(spec: dict) -> None:
    listener, addr = listen()
    common.ready(addr)
    sock = accept(listener)
    _answer(sock, spec["size"], spec["count"])
    common.result(role="echo", peak_rss_kb=common.maxrss_kb())
    sock.close()


def ping(spec: dict) -> None:
    base = common.rss_kb()
    samples = _ping(spec["addr"], spec["size"], spec["count"])
    common.latency_report(samples, spec["size"], base)


def ping_self(spec: dict) -> None:
    """Echo thread and pinging main thread in this one process (a notebook's pattern)."""
    size, count = spec["size"], spec["count"]

    def serve_echo():
        listener, addr = listen()

        def answer():
            sock = accept(listener)
            try:
                _answer(sock, size, count)
            finally:
                sock.close()

        return addr, answer

    common.in_one_process(serve_echo, lambda addr: _ping(addr, size, count), size)


if __name__ == "__main__":
    common.main({"recv": recv, "send": send, "echo": echo, "ping": ping, "ping-self": ping_self})
