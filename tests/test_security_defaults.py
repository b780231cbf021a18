"""Secure by default beyond loopback (netq.exposure): who may unpickle from whom.

A server that other machines (or, on a Unix socket, other users) can reach, with no authkey, no
client certificates and an unrestricted pickle, refuses to start; each way forward starts it;
the opt-out logs a WARNING; loopback servers behave exactly as before.

Where the addresses come from: a non-loopback address is used in this process only for a check
that refuses before anything binds (``198.18.0.1`` is not even an address of this host, so a
server that got as far as binding would fail with ``OSError`` instead). Servers that do start
on non-loopback addresses run in ``tests/exposure_child.py`` inside a network namespace of the
test's own (``unshare --net``), where nothing else exists: no packet leaves it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import netq as nq
import netq.aio
from netq import exposure
from netq.lab.brokers import free_port

HERE = Path(__file__).resolve().parent
NOT_HERE = "198.18.0.1"  # benchmarking range: never an address of this host outside a namespace
WIDE_HOSTS = ("0.0.0.0", "::", "", NOT_HERE)
T = 30.0  # seconds any single wait may take on a loaded machine
CHILD_TIMEOUT = 100.0  # seconds one namespace child may run (pytest-timeout is 120 s)
SERVER_COMBINATIONS = ("default", "authkey", "mtls", "restrict", "bytes", "optout")
MQTT_COMBINATIONS = ("default", "authkey", "restrict", "bytes", "optout", "broker-tls",
                     "credentials")
THREE_WAYS = ("SecurityOptions(authkey=", "netq.shared_authkey(", "client_ca=",
              "PickleSerializer(restrict=", "BytesSerializer", "allow_untrusted_peers=True",
              "Running across machines")


def exposure_records(caplog) -> list[str]:
    """WARNINGs the exposure decision logged (other netq warnings are not its business)."""
    return [record.getMessage() for record in caplog.records
            if record.name == "netq" and record.module == "exposure"
            and record.levelno >= logging.WARNING]


def _needs_grpc(protocol: nq.Protocol) -> None:
    if protocol is nq.Protocol.GRPC:
        pytest.importorskip("grpc")


def _options(host: str = "0.0.0.0", port: int = 0, **security) -> nq.CommunicatorOptions:
    return nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(host, port),
        security=nq.SecurityOptions(**security) if security else None)


def _listening_ports() -> set[int]:
    """TCP ports anything in this network namespace listens on (from /proc/net)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# ============================================================ refused before binding


@pytest.mark.parametrize("host", WIDE_HOSTS, ids=lambda h: h or "empty")
@pytest.mark.parametrize("protocol,tls", [(nq.Protocol.TCP, False), (nq.Protocol.TCP, True),
                                          (nq.Protocol.GRPC, False), (nq.Protocol.GRPC, True)],
                         ids=["tcp", "tls", "grpc", "grpc-tls"])
def test_default_server_beyond_loopback_is_refused_before_binding(protocol, tls, host,
                                                                  tls_files):
    _needs_grpc(protocol)
    port = free_port()
    security = {"certificate": tls_files.server_cert, "key": tls_files.server_key} if tls else {}
    with pytest.raises(nq.UnprotectedServer) as refused:
        nq.new(protocol, nq.Purpose.SERVER, _options(host, port, **security))
    text = str(refused.value)
    assert isinstance(refused.value, ValueError)  # bad options: a ValueError like the others
    assert f"this {protocol.value} server" in text and "not loopback" in text
    assert "other machines can reach it" in text and "run code in this process" in text
    for way in THREE_WAYS:
        assert way in text, way
    assert ("TLS without client_ca" in text) == tls
    assert port not in _listening_ports()  # nothing was bound, on any address


def test_the_asyncio_face_follows_the_same_rule():
    async def main():
        with pytest.raises(nq.UnprotectedServer):
            netq.aio.new(purpose=nq.Purpose.SERVER, options=_options("0.0.0.0"))
        async with netq.aio.new(purpose=nq.Purpose.SERVER,
                                options=_options("127.0.0.1")) as server:
            assert server.peers == ()

    asyncio.run(main())


def test_a_client_is_never_refused():
    """Clients do not listen: the rule is for servers (the decision only: a client would
    connect at once, and this process sends nothing beyond loopback)."""
    assert exposure.check(nq.Protocol.TCP, nq.Purpose.CLIENT, _options(NOT_HERE)) is None


# ============================================================ the decision, without binding


@pytest.mark.parametrize("protocol", [nq.Protocol.TCP, nq.Protocol.GRPC])
@pytest.mark.parametrize("way", ["authkey", "mtls", "restrict", "bytes", "own-load"])
def test_each_way_forward_passes_the_check(protocol, way, tls_files, caplog):
    """The decision only (starting for real is in the namespace test below): with any of the
    protections, a wildcard server passes the check silently."""
    security: dict = {}
    serialization = nq.SerializationOptions()
    if way == "authkey":
        security = {"authkey": b"k"}
    elif way == "mtls":
        security = {"certificate": tls_files.server_cert, "key": tls_files.server_key,
                    "client_ca": tls_files.ca}
    elif way == "restrict":
        serialization = nq.SerializationOptions(load=nq.PickleSerializer(restrict=["numpy"]).load)
    elif way == "bytes":
        serialization = nq.SerializationOptions(load=nq.BytesSerializer().load)
    else:  # a load of the caller's own is the caller's decision
        serialization = nq.SerializationOptions(load=lambda stream: stream.tobytes())
    options = nq.CommunicatorOptions(
        netloc=nq.NetworkLocation("0.0.0.0", 0), serialization=serialization,
        security=nq.SecurityOptions(**security) if security else None)
    assert exposure.protection(options) is not None
    exposure.check(protocol, nq.Purpose.SERVER, options)
    assert exposure_records(caplog) == []


def test_tls_without_client_certificates_is_not_protection(tls_files):
    options = _options(certificate=tls_files.server_cert, key=tls_files.server_key)
    assert exposure.protection(options) is None
    with pytest.raises(nq.UnprotectedServer, match="TLS without client_ca"):
        exposure.check(nq.Protocol.TCP, nq.Purpose.SERVER, options)


def test_the_opt_out_passes_the_check_with_one_warning(caplog):
    exposure.check(nq.Protocol.TCP, nq.Purpose.SERVER, _options(allow_untrusted_peers=True))
    (warning,) = exposure_records(caplog)
    assert "accepts untrusted peers" in warning and "allow_untrusted_peers=True" in warning
    assert "0.0.0.0" in warning and "run code in this process" in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.5.6.7", "::1", "localhost",
                                  "::ffff:127.0.0.1"])
def test_loopback_hosts_are_not_reachable_by_others(host):
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(host, 0))
    assert exposure.reachable_by_others(nq.Protocol.TCP, options) is None
    assert exposure.reachable_by_others(nq.Protocol.GRPC, options) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", NOT_HERE, "2001:db8::1"])
def test_other_hosts_are_reachable_by_others(host):
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(host, 0))
    assert "not loopback" in exposure.reachable_by_others(nq.Protocol.TCP, options)


# ============================================================ loopback: exactly as before


def test_loopback_servers_start_as_before_with_no_warning(transport, caplog):
    """Every transport of the suite (loopback, its broker on loopback): default options and
    the opt-out both start, move a message, and log nothing about exposure."""
    for overrides in ({}, {"allow_untrusted_peers": True}):
        server = transport.make_server(**overrides)
        client = transport.connect(server)
        server.put("back", client.id).result(T)
        assert client.get(timeout=T).data == "back"
    assert exposure_records(caplog) == []


# ============================================================ Unix sockets: other users


def _unix_options(path: Path, **security) -> nq.CommunicatorOptions:
    return nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(path=str(path)),
        security=nq.SecurityOptions(**security) if security else None)


@pytest.fixture
def open_directory(tmp_path):
    """A directory every user may write to, without the sticky bit."""
    directory = tmp_path / "open"
    directory.mkdir()
    directory.chmod(0o777)
    return directory


@pytest.mark.parametrize("protocol", [nq.Protocol.UNIX, nq.Protocol.GRPC])
def test_unix_socket_in_an_open_directory_is_refused_before_binding(protocol, open_directory):
    _needs_grpc(protocol)
    path = open_directory / "server.sock"
    with pytest.raises(nq.UnprotectedServer) as refused:
        nq.new(protocol, nq.Purpose.SERVER, _unix_options(path))
    text = str(refused.value)
    assert str(open_directory) in text and "mode 0777" in text and "no sticky bit" in text
    for way in THREE_WAYS:
        assert way in text, way
    assert not path.exists()


@pytest.mark.parametrize("mode", [0o700, 0o1777], ids=["private", "sticky"])
def test_unix_socket_in_a_private_or_sticky_directory_starts(tmp_path, mode, caplog):
    directory = tmp_path / "dir"
    directory.mkdir()
    directory.chmod(mode)
    _unix_round_trip(_unix_options(directory / "server.sock"))
    assert exposure_records(caplog) == []


@pytest.mark.parametrize("way", ["authkey", "mtls", "restrict", "bytes", "optout"])
def test_unix_socket_in_an_open_directory_starts_each_way_forward(way, open_directory,
                                                                  tls_files, caplog):
    path = open_directory / "server.sock"
    server_security: dict = {}
    client_security: dict = {}
    serialization = nq.SerializationOptions()
    if way == "authkey":
        server_security = client_security = {"authkey": b"unix key"}
    elif way == "mtls":
        server_security = {"certificate": tls_files.server_cert, "key": tls_files.server_key,
                           "client_ca": tls_files.ca}
        client_security = {"certificate": tls_files.ca, "server_hostname": "localhost",
                           "client_certificate": tls_files.client_cert,
                           "key": tls_files.client_key}
    elif way == "restrict":
        serialization = nq.SerializationOptions(
            load=nq.PickleSerializer(restrict=["builtins"]).load)
    elif way == "bytes":
        serializer = nq.BytesSerializer()
        serialization = nq.SerializationOptions(load=serializer.load, dump=serializer.dump)
    else:
        server_security = {"allow_untrusted_peers": True}

    def options(security: dict) -> nq.CommunicatorOptions:
        return _unix_options(path, **security).replace(serialization=serialization)

    _unix_round_trip(options(server_security), options(client_security),
                     payload=b"ping" if way == "bytes" else "ping")
    warnings = exposure_records(caplog)
    if way == "optout":
        (warning,) = warnings
        assert "accepts untrusted peers" in warning and str(open_directory) in warning
    else:
        assert warnings == []


def _unix_round_trip(server_options, client_options=None, payload="ping"):
    client_options = client_options or server_options.replace(security=None)
    with nq.new(nq.Protocol.UNIX, nq.Purpose.SERVER, server_options) as server, \
            nq.new(nq.Protocol.UNIX, nq.Purpose.CLIENT, client_options) as client:
        client.put(payload).result(T)
        message = server.get(timeout=T)
        assert message.data == payload
        server.put(payload, message.peer).result(T)
        assert client.get(timeout=T).data == payload


@pytest.mark.parametrize("protocol", ["unix", "grpc"])
@pytest.mark.parametrize("umask", [0o002, 0o000, 0o022], ids=["002", "000", "022"])
def test_unix_socket_is_owner_only_whatever_the_umask(tmp_path, umask, protocol):
    """Connecting to a Unix socket needs write permission on its file, which the umask alone
    would give the group (002) or everyone (000): netq makes it owner-only before it listens,
    so such a server starts and stays unreachable by other users. In a child process: the
    umask is process-wide."""
    if protocol == "grpc":
        pytest.importorskip("grpc")
    code = ("import os, stat, sys, netq as nq\n"
            "options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(path=sys.argv[1]))\n"
            "with nq.new(sys.argv[2], nq.Purpose.SERVER, options):\n"
            "    print('MODE %04o' % stat.S_IMODE(os.stat(sys.argv[1]).st_mode))\n")
    path = tmp_path / "server.sock"
    done = subprocess.run(["sh", "-c", f'umask {umask:03o} && exec "$@"', "sh",
                           sys.executable, "-c", code, str(path), protocol],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "MODE 0600", done.stdout


# ============================================================ MQTT: the broker's other clients


@pytest.mark.parametrize("purpose", [nq.Purpose.SERVER, nq.Purpose.CLIENT])
def test_mqtt_through_a_shared_broker_warns_once(purpose, caplog):
    """The decision only (a real broker beyond loopback is in the namespace test)."""
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(NOT_HERE, 1883, path="jobs"))
    exposure.check(nq.Protocol.MQTT, purpose, options)
    (warning,) = exposure_records(caplog)
    assert f"netq MQTT {purpose.value} of service 'jobs'" in warning
    assert f"broker {NOT_HERE}:1883 is not on a loopback address" in warning
    assert "any client of that broker can make this process run code" in warning


@pytest.mark.parametrize("way", ["tls", "credentials", "restrict", "bytes", "loopback",
                                 "localhost"])
def test_mqtt_without_that_risk_does_not_warn(way, tls_files, caplog):
    host = {"loopback": "::1", "localhost": "localhost"}.get(way, NOT_HERE)
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(host, 1883))
    if way == "tls":
        options = options.replace(security=nq.SecurityOptions(certificate=tls_files.ca))
    elif way == "credentials":
        options = options.replace(mqtt=nq.MQTTOptions(username="u", password="p"))
    elif way == "restrict":
        options = options.replace(serialization=nq.SerializationOptions(
            load=nq.PickleSerializer(restrict=["builtins"]).load))
    elif way == "bytes":
        options = options.replace(serialization=nq.SerializationOptions(
            load=nq.BytesSerializer().load))
    exposure.check(nq.Protocol.MQTT, nq.Purpose.CLIENT, options)
    assert exposure_records(caplog) == []


# ============================================================ in a network namespace


def _namespace_unavailable() -> str | None:
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"],
                           capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    if probe.returncode:
        return f"cannot make a network namespace here: {probe.stderr.strip()}"
    return None


def _in_namespace(*arguments: str) -> subprocess.CompletedProcess:
    reason = _namespace_unavailable()
    if reason:
        pytest.skip(reason)
    return subprocess.run(["unshare", "--net", sys.executable, *arguments],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT,
                          env={**os.environ, "PYTHONPATH": str(HERE.parent)})


@pytest.mark.parametrize("transport", ["tcp", "tcp6", "tls", "grpc", "grpc-tls", "mqtt"])
def test_beyond_loopback_in_a_network_namespace(transport):
    """Real servers on addresses that are not loopback, each combination: the default is
    refused (MQTT: warns), each way forward starts and carries a round trip silently, the
    opt-out starts with its one WARNING."""
    if transport.startswith("grpc"):
        pytest.importorskip("grpc")
    if transport == "mqtt":
        pytest.importorskip("paho.mqtt")
        from netq.lab.brokers import find_mosquitto

        try:
            find_mosquitto()
        except nq.BrokerUnavailable as error:
            pytest.skip(str(error))
    combinations = MQTT_COMBINATIONS if transport == "mqtt" else SERVER_COMBINATIONS
    done = _in_namespace(str(HERE / "exposure_child.py"), transport, *combinations)
    assert done.returncode == 0, done.stderr[-4000:]
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line.removeprefix("RESULT "))
            results[result.pop("combination")] = result
    assert set(results) == set(combinations), done.stdout
    host = "2001:db8::1" if transport == "tcp6" else "198.18.0.1"
    for combination, result in results.items():
        warnings = result["warnings"]
        payloads = ["b'ping'", "b'pong'"] if combination == "bytes" else ["'ping'", "'pong'"]
        if transport == "mqtt":
            assert "refused" not in result
            assert result["round_trip"] == payloads, combination
            risky = combination in ("default", "authkey", "optout")  # authkey: still a broker
            assert len(warnings) == (2 if risky else 0), (combination, warnings)
            assert all("any client of that broker" in w for w in warnings)
            assert sorted(w.split(" of service")[0] for w in warnings) == (
                ["netq MQTT client", "netq MQTT server"] if risky else [])
        elif combination == "default":
            text = result["refused"]
            assert host in text and "not loopback" in text, text
            for way in THREE_WAYS:
                assert way in text, way
            assert ("TLS without client_ca" in text) == transport.endswith("tls")
            assert warnings == []
        else:
            assert host in result["address"]
            assert result["round_trip"] == payloads, combination
            if combination == "optout":
                (warning,) = warnings
                assert "accepts untrusted peers" in warning and host in warning
            else:
                assert warnings == [], (combination, warnings)


def test_demo_beyond_loopback_uses_an_authkey_of_its_own():
    done = _in_namespace(
        "-c", "import subprocess, sys\n"
              "subprocess.run(['ip', 'link', 'set', 'lo', 'up'], check=True)\n"
              "subprocess.run(['ip', 'addr', 'add', '198.18.0.1/32', 'dev', 'lo'], check=True)\n"
              "from netq.__main__ import main\n"
              "sys.exit(main(['demo', '--host', '198.18.0.1', '--seconds', '1', "
              "'--clients', '2', '--interval', '0.5']))\n")
    assert done.returncode == 0, done.stderr[-4000:]
    first, second = done.stdout.splitlines()[:2]
    assert "over TCP listening on 198.18.0.1" in first
    assert "reachable beyond this host" in second and "random authkey" in second
    assert "lost 0, out of order 0, failed deliveries 0" in done.stdout


def test_demo_host_is_for_tcp_and_grpc_only():
    done = subprocess.run([sys.executable, "-m", "netq", "demo", "--protocol", "unix",
                           "--host", "0.0.0.0", "--seconds", "0.5"],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert done.returncode == 2
    assert "--host applies to tcp and grpc, not to unix" in done.stderr


# ============================================================ options and the authkey helper


def test_security_options_validate_authkey_and_the_opt_out():
    with pytest.raises(TypeError, match="not str"):
        nq.SecurityOptions(authkey="secret")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be bytes"):
        nq.SecurityOptions(authkey=1234)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        nq.SecurityOptions(authkey=b"")
    key = nq.SecurityOptions(authkey=bytearray(b"abc")).authkey
    assert key == b"abc" and type(key) is bytes
    with pytest.raises(TypeError, match="allow_untrusted_peers"):
        nq.SecurityOptions(allow_untrusted_peers="yes")  # type: ignore[arg-type]
    assert nq.SecurityOptions().allow_untrusted_peers is False


def test_shared_authkey_makes_a_private_key_file_once(tmp_path):
    path = tmp_path / "keys" / "netq.key"
    key = nq.shared_authkey(path)
    assert len(key) == exposure.AUTHKEY_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == key.hex() + "\n"
    assert nq.shared_authkey(path) == key  # the same file: the same key
    assert nq.shared_authkey(str(path), create=False) == key
    assert nq.shared_authkey(tmp_path / "other.key") != key  # a new file: a new key


def test_shared_authkey_refuses_what_it_should_not_use(tmp_path):
    with pytest.raises(FileNotFoundError):
        nq.shared_authkey(tmp_path / "missing.key", create=False)
    assert not (tmp_path / "missing.key").exists()
    readable = tmp_path / "readable.key"
    readable.write_text("00" * 32)
    readable.chmod(0o644)
    with pytest.raises(ValueError, match="readable by other users"):
        nq.shared_authkey(readable)
    garbage = tmp_path / "garbage.key"
    garbage.write_text("not hex")
    garbage.chmod(0o600)
    with pytest.raises(ValueError, match="hex text"):
        nq.shared_authkey(garbage)
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(ValueError, match="empty"):
        nq.shared_authkey(empty)


def test_shared_authkey_protects_a_server_and_its_clients_use_it(tmp_path):
    key = nq.shared_authkey(tmp_path / "netq.key")
    wide = _options("0.0.0.0", authkey=key)
    exposure.check(nq.Protocol.TCP, nq.Purpose.SERVER, wide)  # passes: protected
    with nq.new(purpose=nq.Purpose.SERVER, options=_options("127.0.0.1", authkey=key)) as server:
        where = nq.NetworkLocation("127.0.0.1", server.address[1])
        holder = nq.CommunicatorOptions(netloc=where, security=nq.SecurityOptions(authkey=key))
        with nq.new(options=holder) as client:
            client.put("with the key").result(T)
            assert server.get(timeout=T).data == "with the key"
