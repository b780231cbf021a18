"""The transport suite's harness: how tests build, connect and clean up communicators.

``tests/conftest.py`` turns these into fixtures (``transport``, ``tls_files``); test modules and
transport helpers import the classes from here (never from a conftest: pytest may load another
``conftest`` module under that name).

* :class:`TransportSpec` (and :class:`SocketSpec`): how the suite drives one transport;
* :class:`Harness`: ``make_server(**overrides)`` / ``make_client(server, **overrides)`` build the
  right options for a transport, and its teardown closes everything it made, with timeouts;
* :class:`Child`: a communicator in another process (``tests/netq_child.py``), over pipes;
* :func:`build_options`: overrides by field name (see ``tests/conftest.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import netq as nq
from netq_child import encode_options
from netq_testing import shut_down_below

REPO = Path(__file__).resolve().parent.parent
CHILD_SCRIPT = Path(__file__).resolve().parent / "netq_child.py"
CLOSE_TIMEOUT = 3.0  # seconds each communicator gets at fixture teardown


@dataclasses.dataclass(frozen=True)
class TLSFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def report_from_forked_child(target, args: tuple, wait: float) -> dict:
    """Run ``target(*args, connection)`` in a child forked by ``multiprocessing`` and return
    the JSON report it sends through ``connection``; the child is killed if it outlives
    ``wait`` seconds, and must exit with 0."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=target, args=(*args, sender))
    child.start()
    sender.close()
    try:
        assert receiver.poll(wait), "the forked child reported nothing"
        report = json.loads(receiver.recv())
        child.join(wait)
        assert child.exitcode == 0, child.exitcode
    finally:
        if child.is_alive():
            child.kill()
            child.join(wait)
        child.close()
        receiver.close()
    return report


def write_tls_files(directory: Path, *, ips: tuple[str, ...] = ("127.0.0.1", "::1"),
                    dns: tuple[str, ...] = ("localhost",), name: str = "netq test") -> TLSFiles:
    """A throwaway CA, a server certificate for ``ips`` and ``dns`` and a client certificate
    (ECDSA P-256, valid from an hour ago for two days), written as PEM files in ``directory``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def subject(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def issue(common: str, key, issuer_name, issuer_key, *, ca: bool, usage=None, san=None):
        builder = (x509.CertificateBuilder()
                   .subject_name(subject(common))
                   .issuer_name(issuer_name)
                   .public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=2))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            builder = builder.add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        else:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                critical=False)
        if san is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def write_key(key, path: Path) -> None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))

    def write_cert(cert, path: Path) -> None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = issue(f"{name} CA", ca_key, subject(f"{name} CA"), ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = issue(dns[0] if dns else ips[0], server_key, ca_cert.subject, ca_key, ca=False,
                        usage=ExtendedKeyUsageOID.SERVER_AUTH,
                        san=[*(x509.DNSName(host) for host in dns),
                             *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips)])
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = issue(f"{name} client", client_key, ca_cert.subject, ca_key, ca=False,
                        usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    files = TLSFiles(ca=directory / "ca.pem", server_cert=directory / "server.pem",
                     server_key=directory / "server.key", client_cert=directory / "client.pem",
                     client_key=directory / "client.key")
    write_cert(ca_cert, files.ca)
    write_cert(server_cert, files.server_cert)
    write_key(server_key, files.server_key)
    write_cert(client_cert, files.client_cert)
    write_key(client_key, files.client_key)
    return files


# ============================================================================ transports


@dataclasses.dataclass
class Env:
    """What a spec may use to build options: a private directory and the TLS files."""

    directory: Path
    request: pytest.FixtureRequest
    _counter: int = 0

    @property
    def tls(self) -> TLSFiles:
        return self.request.getfixturevalue("tls_files")

    def unique_path(self, stem: str, suffix: str) -> Path:
        self._counter += 1
        return self.directory / f"{stem}{self._counter}{suffix}"


class TransportSpec:
    """How the suite drives one transport. Subclass and add an instance to TRANSPORTS."""

    name: str
    protocol: nq.Protocol
    defaults: dict = {}  # option overrides of every communicator of the spec (read only)
    byte_stream = False  # raw_connect() works: the fault tests can speak bytes to the server
    supports_cut = False  # cut() works: the session-resume tests can break a live link

    def unavailable(self) -> str | None:
        """A reason to skip this transport on this machine, or None."""
        return None

    def server_netloc(self, env: Env) -> nq.NetworkLocation:
        raise NotImplementedError

    def client_netloc(self, netloc: nq.NetworkLocation, address) -> nq.NetworkLocation:
        """Where a client finds a server configured with ``netloc`` and bound to ``address``.

        The result stays valid after that server is gone, and a new server made with it as its
        own ``netloc`` listens in the same place (a restart).
        """
        raise NotImplementedError

    def security(self, env: Env, purpose: nq.Purpose) -> nq.SecurityOptions | None:
        return None

    @staticmethod
    def tls_security(env: Env, purpose: nq.Purpose) -> nq.SecurityOptions:
        """The test CA's server certificate for a server; trust in that CA for a client."""
        files = env.tls
        if purpose is nq.Purpose.SERVER:
            return nq.SecurityOptions(key=files.server_key, certificate=files.server_cert)
        return nq.SecurityOptions(certificate=files.ca)

    def raw_connect(self, env: Env, netloc: nq.NetworkLocation, *, wrap: bool = True):
        """A blocking socket carrying netq frames to the server (TLS done when ``wrap``)."""
        raise NotImplementedError

    def cut(self, client: nq.Communicator) -> bool:
        """Break the client's live link without a goodbye (a network cut). False if no link."""
        raise NotImplementedError

    def upstream(self, netloc: nq.NetworkLocation):
        """The byte-stream endpoint a client configured with ``netloc`` connects to:
        ``(host, port)`` or a Unix path (what a fault proxy forwards to)."""
        if self.protocol is nq.Protocol.UNIX:
            return netloc.unix_path()
        return (netloc.host, netloc.port)

    def through(self, netloc: nq.NetworkLocation, address) -> nq.NetworkLocation:
        """``netloc`` with its endpoint replaced by ``address`` (a proxy's, same family)."""
        if isinstance(address, tuple):
            return netloc._replace(host=address[0], port=address[1])
        return netloc._replace(path=address)


class SocketSpec(TransportSpec):
    """TCP over IPv4/IPv6 (optionally TLS), or Unix domain sockets."""

    byte_stream = True
    supports_cut = True

    def __init__(self, name: str, protocol: nq.Protocol, host: str | None = None,
                 tls: bool = False, **defaults) -> None:
        self.name = name
        self.protocol = protocol
        self.host = host
        self.tls = tls
        self.defaults = defaults  # option overrides every communicator of the spec gets

    def __repr__(self) -> str:
        return f"<transport {self.name}>"

    def unavailable(self) -> str | None:
        if self.host is None:
            return None
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((self.host, 0))
                probe.listen(1)
                with socket.create_connection(probe.getsockname()[:2], timeout=2):
                    pass
        except OSError as error:
            return f"{self.host} loopback not usable here: {error}"
        return None

    def server_netloc(self, env: Env) -> nq.NetworkLocation:
        if self.protocol is nq.Protocol.UNIX:
            return nq.NetworkLocation(path=str(env.unique_path("s", ".sock")))
        return nq.NetworkLocation(host=self.host, port=0)

    def client_netloc(self, netloc: nq.NetworkLocation, address) -> nq.NetworkLocation:
        if self.protocol is nq.Protocol.UNIX:
            return nq.NetworkLocation(path=netloc.path)
        return nq.NetworkLocation(host=self.host, port=address[1])

    def security(self, env: Env, purpose: nq.Purpose) -> nq.SecurityOptions | None:
        return self.tls_security(env, purpose) if self.tls else None

    def raw_connect(self, env: Env, netloc: nq.NetworkLocation, *, wrap: bool = True):
        if self.protocol is nq.Protocol.UNIX:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            sock.connect(netloc.unix_path())
            return sock
        sock = socket.create_connection((netloc.host, netloc.port), timeout=10)
        if self.tls and wrap:
            context = ssl.create_default_context(cafile=str(env.tls.ca))
            sock = context.wrap_socket(sock, server_hostname=netloc.host)
        return sock

    def cut(self, client: nq.Communicator) -> bool:
        session = client._engine.server_session
        link = session.link if session is not None else None
        if link is None or link.dropped:
            return False
        try:
            fd = link.channel.sock.fileno()  # a SocketChannel (netq.transports.sockets)
        except OSError:
            return False
        return fd >= 0 and shut_down_below(fd)


# ============================================================================ options

_CONNECTION_FIELDS = {f.name for f in dataclasses.fields(nq.ConnectionOptions)}
_SERIALIZATION_FIELDS = {f.name for f in dataclasses.fields(nq.SerializationOptions)}
_SECURITY_FIELDS = {f.name for f in dataclasses.fields(nq.SecurityOptions)}
_TOP_FIELDS = {f.name for f in dataclasses.fields(nq.CommunicatorOptions)}


def build_options(default_netloc: nq.NetworkLocation,
                  default_security: nq.SecurityOptions | None,
                  /, **overrides) -> nq.CommunicatorOptions:
    """CommunicatorOptions from a transport's netloc/security plus test overrides."""
    connection, serialization, secure, top = {}, {}, {}, {}
    for key, value in overrides.items():
        if key in _TOP_FIELDS:
            top[key] = value
        elif key in _CONNECTION_FIELDS:
            connection[key] = value
        elif key in _SERIALIZATION_FIELDS:
            serialization[key] = value
        elif key in _SECURITY_FIELDS:
            secure[key] = value
        else:
            raise TypeError(f"unknown option override {key!r}")
    if connection:
        base = top.pop("connection", None)
        top["connection"] = (dataclasses.replace(base, **connection) if base is not None
                             else nq.ConnectionOptions(**connection))
    if serialization:
        base = top.pop("serialization", None)
        top["serialization"] = (dataclasses.replace(base, **serialization) if base is not None
                                else nq.SerializationOptions(**serialization))
    security = default_security
    if "security" not in top:
        if secure:
            security = (dataclasses.replace(security, **secure) if security is not None
                        else nq.SecurityOptions(**secure))
        top["security"] = security
    top.setdefault("netloc", default_netloc)
    return nq.CommunicatorOptions(**top)


# ============================================================================ child processes


class Child:
    """A communicator in another process (tests/netq_child.py, or a ``script`` speaking its
    protocol), driven over pipes."""

    def __init__(self, spec: dict, log: Path, netloc: nq.NetworkLocation, *,
                 script: Path = CHILD_SCRIPT, ready_timeout: float = 30) -> None:
        self.netloc = netloc  # what it was configured with
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO), str(CHILD_SCRIPT.parent)] + ([env["PYTHONPATH"]]
                                                     if env.get("PYTHONPATH") else []))
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
            text=True, bufsize=1)
        self._lines: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="child-reader", daemon=True)
        self._reader.start()
        try:
            ready = self._next(ready_timeout)
        except BaseException:
            self.close()  # a child that never said ready must not live on unattended
            raise
        self.id = uuid.UUID(ready["id"])
        self.address = ready["address"]
        self.pid = ready["pid"]

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _next(self, timeout: float) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"child {self.proc.pid} silent for {timeout} s; log:\n"
                               f"{self.log()}") from None
        if line is None:
            raise RuntimeError(f"child {self.proc.pid} ended; log:\n{self.log()}")
        return json.loads(line)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def request(self, op: str, timeout: float = 30, **fields):
        """Run one command in the child; its result, or RuntimeError with its error."""
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        reply = self._next(timeout)
        if not reply.get("ok"):
            raise RuntimeError(f"child {op} failed: {reply.get('error')}")
        return reply["result"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        # SIGKILL cannot be refused, but the kernel's reaping took over 10 s at a load average
        # of 170 (a soak on a shared 2-core machine)
        self.proc.wait(60)

    def close(self) -> None:
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._reader.join(5)
        self._log.close()


# ============================================================================ the harness


class Harness:
    """Makes servers and clients for one transport; closes them all at teardown."""

    def __init__(self, spec: TransportSpec, env: Env) -> None:
        self.spec = spec
        self.env = env
        self.name = spec.name
        self.protocol = spec.protocol
        self.servers: list[nq.Communicator] = []
        self.clients: list[nq.Communicator] = []
        self.children: list[Child] = []
        self.proxies: list = []

    def __repr__(self) -> str:
        return f"<Harness {self.name}>"

    # -- options ------------------------------------------------------------------------

    def server_options(self, **overrides) -> nq.CommunicatorOptions:
        return build_options(self.spec.server_netloc(self.env),
                             self.spec.security(self.env, nq.Purpose.SERVER),
                             **{**getattr(self.spec, "defaults", {}), **overrides})

    def client_options(self, server, **overrides) -> nq.CommunicatorOptions:
        """``server``: a Communicator, or the NetworkLocation a client should use."""
        return build_options(self.location(server),
                             self.spec.security(self.env, nq.Purpose.CLIENT),
                             **{**getattr(self.spec, "defaults", {}), **overrides})

    def location(self, server) -> nq.NetworkLocation:
        """Where clients find ``server`` (a Communicator or a server Child); still valid
        after it is gone, and usable as a new server's ``netloc`` to restart in its place."""
        if isinstance(server, nq.NetworkLocation):
            return server
        if isinstance(server, Child):
            return self.spec.client_netloc(server.netloc, server.address)
        return self.spec.client_netloc(server.options.netloc, server.address)

    # -- communicators ------------------------------------------------------------------

    def make_server(self, **overrides) -> nq.Communicator:
        server = nq.new(self.protocol, nq.Purpose.SERVER, self.server_options(**overrides))
        self.servers.append(server)
        return server

    def make_client(self, server, **overrides) -> nq.Communicator:
        client = nq.new(self.protocol, nq.Purpose.CLIENT,
                        self.client_options(server, **overrides))
        self.clients.append(client)
        return client

    def connect(self, server, timeout: float = 20, **overrides) -> nq.Communicator:
        """A client whose first message reached ``server`` (which gets and checks it)."""
        client = self.make_client(server, **overrides)
        client.put(("hello", str(client.id))).result(timeout)
        message = server.get(client.id, timeout=timeout)
        assert message.data == ("hello", str(client.id))
        return client

    # -- child processes ----------------------------------------------------------------

    def spawn_client(self, server, **overrides) -> Child:
        options = self.client_options(server, **overrides)
        return self._spawn(nq.Purpose.CLIENT, options)

    def spawn_server(self, **overrides) -> Child:
        return self._spawn(nq.Purpose.SERVER, self.server_options(**overrides))

    def _spawn(self, purpose: nq.Purpose, options: nq.CommunicatorOptions) -> Child:
        child = Child(encode_options(self.protocol, purpose, options),
                      self.env.unique_path("child", ".log"), options.netloc)
        self.children.append(child)
        return child

    def raw_connect(self, server, *, wrap: bool = True):
        if not self.spec.byte_stream:
            pytest.skip(f"{self.name} is not a byte stream")
        return self.spec.raw_connect(self.env, self.location(server), wrap=wrap)

    def proxy(self, server):
        """A fault_proxy.FaultProxy in front of what clients of ``server`` connect to (the
        broker for MQTT); closed at teardown, after the communicators."""
        from fault_proxy import FaultProxy

        proxy = FaultProxy(self.spec.upstream(self.location(server)),
                           path=self.env.unique_path("proxy", ".sock"))
        self.proxies.append(proxy)
        return proxy

    def connect_via(self, proxy, server, timeout: float = 20, **overrides) -> nq.Communicator:
        """:meth:`connect`, but the client reaches ``server`` through ``proxy``."""
        netloc = self.spec.through(self.location(server), proxy.address)
        return self.connect(server, timeout, netloc=netloc, **overrides)

    def cut(self, client: nq.Communicator) -> bool:
        if not self.spec.supports_cut:
            pytest.skip(f"{self.name} cannot cut a link")
        return self.spec.cut(client)

    # -- teardown -----------------------------------------------------------------------

    def close_all(self, timeout: float = CLOSE_TIMEOUT) -> list[str]:
        """Close clients (in parallel), then servers, then kill children. Never hangs."""
        problems = []
        for child in self.children:
            child.close()
        for group in (self.clients, self.servers):
            closers = []
            for comm in group:
                def close(comm=comm):
                    try:
                        comm.close(timeout=timeout)
                    except Exception as error:  # noqa: BLE001 - reported below
                        problems.append(f"{comm!r}.close(): {error!r}")
                thread = threading.Thread(target=close, name="test-closer", daemon=True)
                thread.start()
                closers.append((comm, thread))
            deadline = time.monotonic() + timeout + 10
            for comm, thread in closers:
                thread.join(max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    problems.append(f"{comm!r}.close(timeout={timeout}) did not return")
        for proxy in self.proxies:
            proxy.close()
        return problems
