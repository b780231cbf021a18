"""Options, the transport registry and netq.new()."""

import dataclasses
import errno
import re
import subprocess
import sys
import uuid

import pytest

import netq as nq
from netq import transports


def test_every_options_instance_gets_its_own_id():
    ids = {nq.CommunicatorOptions().id for _ in range(100)}
    assert len(ids) == 100
    assert all(isinstance(i, uuid.UUID) and i.version == 4 for i in ids)


def test_options_are_frozen_and_replaceable():
    options = nq.CommunicatorOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.netloc = nq.NetworkLocation(port=1)
    changed = options.replace(netloc=nq.NetworkLocation(port=1234))
    assert changed.netloc.port == 1234 and changed.id == options.id


def test_connection_defaults_follow_max_size():
    connection = nq.ConnectionOptions(max_size=1 << 20)
    assert connection.merge_size == 1 << 20
    assert connection.efficient_size == (1 << 20) // 64


@pytest.mark.parametrize("kwargs", [
    {"max_size": 10}, {"recv_budget": 0}, {"send_budget": 0}, {"heartbeat": 0},
    {"session_timeout": -1}, {"spin": -1},
])
def test_connection_options_reject_nonsense(kwargs):
    with pytest.raises(ValueError):
        nq.ConnectionOptions(**kwargs)


def test_message_size_default_is_capped():
    assert nq.SerializationOptions().message_limit == 4 * nq.GiB
    assert nq.SerializationOptions(message_size=10).message_limit == 10


def test_network_location_text_and_unix_path():
    assert str(nq.NetworkLocation()) == "127.0.0.1:51966"
    assert str(nq.NetworkLocation(host="::1", port=5)) == "[::1]:5"
    assert nq.NetworkLocation(path="/tmp/x.sock").unix_path() == "/tmp/x.sock"
    assert nq.NetworkLocation(port=7).unix_path().endswith("-7.sock")


def test_unregistered_protocol_is_a_clear_error():
    with pytest.raises(nq.UnsupportedProtocol, match="tcp, unix"):
        transports.lookup("carrier-pigeon")
    with pytest.raises(nq.UnsupportedProtocol, match="named 'carrier-pigeon'; netq has: tcp"):
        nq.new("carrier-pigeon")


def test_new_takes_names_in_any_case_and_says_what_it_takes_otherwise():
    with nq.new("TCP", "Server", nq.CommunicatorOptions(netloc=("127.0.0.1", 0))) as server:
        assert server.protocol is nq.Protocol.TCP and server.purpose is nq.Purpose.SERVER
    with pytest.raises(nq.UnsupportedProtocol, match=r"TLS is Protocol.TCP with SecurityOpt"):
        nq.new("tls", "server")
    with pytest.raises(ValueError, match="'server' or 'client'\\), not 'srv'"):
        nq.new("tcp", "srv")


def test_registry_lists_the_socket_transports():
    assert {"tcp", "unix"} <= set(transports.available())


@pytest.mark.parametrize("protocol", ["tcp", "grpc"])
def test_server_binds_in_the_constructor_so_a_taken_port_raises_at_once(protocol):
    if protocol == "grpc":
        pytest.importorskip("grpc", reason="pip install 'netq[grpc]'")
    with nq.new(protocol, nq.Purpose.SERVER,
                options=nq.CommunicatorOptions(netloc=nq.NetworkLocation(port=0))) as server:
        port = server.address[1]
        with pytest.raises(OSError) as taken:
            nq.new(protocol, nq.Purpose.SERVER,
                   options=nq.CommunicatorOptions(netloc=nq.NetworkLocation(port=port)))
    # The address, and the ways out: in a notebook the other server is often the kernel's own.
    assert taken.value.errno == errno.EADDRINUSE
    assert f"127.0.0.1:{port} is taken: another server listens there" in str(taken.value)
    assert "listen on port 0" in str(taken.value)


def test_a_plain_host_port_tuple_is_a_network_location():
    options = nq.CommunicatorOptions(netloc=("::1", 5000))
    assert type(options.netloc) is nq.NetworkLocation
    assert options.netloc == nq.NetworkLocation("::1", 5000)
    assert options.replace(name="x").netloc == options.netloc
    assert nq.CommunicatorOptions(netloc=("127.0.0.1", 0, "/tmp/s")).netloc.path == "/tmp/s"


@pytest.mark.parametrize(("netloc", "error", "says"), [
    ("127.0.0.1:5000", TypeError, "(host, port) or (host, port, path) tuple"),
    (("127.0.0.1",), TypeError, "(host, port) or (host, port, path) tuple"),
    (("127.0.0.1", "5000"), TypeError, "port must be an int, not '5000'"),
    (("127.0.0.1", True), TypeError, "port must be an int"),
    ((None, 5000), TypeError, "host must be a str"),
    (("127.0.0.1", 70000), ValueError, "port must be 0-65535, not 70000"),
    (nq.NetworkLocation("127.0.0.1", -1), ValueError, "port must be 0-65535"),
    (("127.0.0.1", 5000, 7), TypeError, "path must be a str or None"),
])
def test_a_netloc_that_is_not_one_says_what_is_wrong(netloc, error, says):
    with pytest.raises(error, match=re.escape(says)):
        nq.CommunicatorOptions(netloc=netloc)


MISSING_EXTRAS_SCRIPT = """
import sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("grpc", "paho"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Missing())
import netq as nq
for protocol in ("grpc", "mqtt"):
    try:
        nq.new(protocol, "server")
    except ImportError as error:
        print(error)
"""


@pytest.mark.timeout(60)
def test_a_transport_whose_extra_is_missing_names_the_install():
    done = subprocess.run([sys.executable, "-c", MISSING_EXTRAS_SCRIPT], capture_output=True,
                          text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    grpc_says, mqtt_says = done.stdout.splitlines()
    assert grpc_says.startswith("Protocol.GRPC needs grpcio: pip install 'netq[grpc]'")
    assert mqtt_says.startswith("Protocol.MQTT needs paho-mqtt: pip install 'netq[mqtt]'")


def test_a_communicators_repr_says_where_it_listens_or_connects():
    options = nq.CommunicatorOptions(netloc=("127.0.0.1", 0), name="hub")
    with nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, options) as server:
        port = server.address[1]
        assert repr(server).startswith(f"<netq server tcp 127.0.0.1:{port} name='hub' id=")
        assert server.statistics().address == f"127.0.0.1:{port}"
    assert repr(server).endswith(" peers=0 closed>")
    # A Unix socket's file follows from the port: the client names that file, not a port.
    with nq.new(nq.Protocol.UNIX, nq.Purpose.CLIENT,
                nq.CommunicatorOptions(netloc=("127.0.0.1", 9))) as client:
        path = nq.NetworkLocation(port=9).unix_path()
        assert repr(client).startswith(f"<netq client unix unix:{path} id=")
        assert client.loop.connect_target() == f"unix:{path}"
        assert client.statistics().address == f"unix:{path}"  # the widget's title says it too
