"""Every name net-queue's README documents exists in netq, with the same meaning.

netq keeps the API of net-queue (PyPI ``net-queue``) as its first release documented it: the
README of net-queue 1.0.0, whose sections "Constants", "Structures", "Functions" and "Classes"
are walked here in their order. Code written against it (``import net_queue as nq``,
``from net_queue.stream import PickleSerializer``) runs with ``netq`` in their place. A move
inside netq that drops one of these names fails here, not in a user's program.

The documented names netq does not keep, each with what replaces it, are listed in
:data:`NOT_KEPT` and in the CHANGELOG; the last test holds the two lists together.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
import uuid
from concurrent.futures import Future
from pathlib import Path

import pytest

import netq
import netq.stream
from netq.lab.brokers import free_port

REPO = Path(__file__).resolve().parent.parent

# A documented name netq does not keep -> what a net-queue user writes instead. The CHANGELOG
# names each one (test_every_name_not_kept_is_in_the_changelog).
NOT_KEPT = {
    "`{protocol}.{purpose}.Communicator`": "netq.new(protocol, purpose, options): one "
                                           "Communicator class serves every transport",
    "`Stream` is not a `BufferedIOBase`": "the chunk methods (readchunk, writechunk, ...) and "
                                          "bytes(stream)",
}


# ------------------------------------------------------------------------------ Constants

def test_protocol_and_purpose_have_the_documented_members() -> None:
    assert {"TCP", "MQTT", "GRPC"} <= set(netq.Protocol.__members__)
    assert set(netq.Purpose.__members__) == {"CLIENT", "SERVER"}


# ----------------------------------------------------------------------------- Structures

def field_defaults(cls: type) -> dict[str, object]:
    """The fields a dataclass is built with, and each one's default (or default factory's)."""
    out: dict[str, object] = {}
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            out[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            out[field.name] = field.default_factory()
    return out


def test_communicator_options_fields_and_defaults() -> None:
    options = netq.CommunicatorOptions()
    assert isinstance(options.id, uuid.UUID) and options.id.version == 4
    assert netq.CommunicatorOptions().id != options.id  # a fresh uuid4 each, never shared
    assert options.netloc == netq.NetworkLocation("127.0.0.1", 51966)
    assert options.workers == 1
    assert options.connection == netq.ConnectionOptions()
    assert options.serialization is not None
    assert options.security is None
    documented = {"id", "netloc", "workers", "connection", "serialization", "security"}
    assert documented <= set(field_defaults(netq.CommunicatorOptions))


def test_connection_options_sizes() -> None:
    options = netq.ConnectionOptions()
    assert options.max_size == 4 * 1024 ** 2
    assert options.merge_size == options.max_size
    assert options.efficient_size == options.max_size // 64
    smaller = netq.ConnectionOptions(max_size=1024 ** 2)
    assert (smaller.merge_size, smaller.efficient_size) == (1024 ** 2, 1024 ** 2 // 64)


def test_serialization_options_default_to_pickle() -> None:
    options = netq.SerializationOptions()
    assert (options.message_size, options.queue_size) == (-1, -1)
    assert isinstance(options.load.__self__, netq.stream.PickleSerializer)  # type: ignore[attr-defined]
    assert isinstance(options.dump.__self__, netq.stream.PickleSerializer)  # type: ignore[attr-defined]
    assert options.load(options.dump({"answer": 42})) == {"answer": 42}


def test_security_options_key_and_certificate() -> None:
    options = netq.SecurityOptions()
    assert (options.key, options.certificate) == (None, None)
    named = netq.SecurityOptions(key=Path("server.key"), certificate=Path("server.pem"))
    assert (named.key, named.certificate) == (Path("server.key"), Path("server.pem"))


def test_network_location_is_a_named_tuple_with_the_documented_defaults() -> None:
    where = netq.NetworkLocation()
    assert isinstance(where, tuple)
    assert netq.NetworkLocation._fields[:2] == ("host", "port")
    assert (where.host, where.port) == ("127.0.0.1", 51966)
    host, port, *_ = netq.NetworkLocation("::1", 9000)
    assert (host, port) == ("::1", 9000)


# ------------------------------------------------------------------------------ Functions

def test_new_takes_protocol_purpose_options_with_the_documented_defaults() -> None:
    parameters = inspect.signature(netq.new).parameters
    assert list(parameters)[:3] == ["protocol", "purpose", "options"]
    assert parameters["protocol"].default == netq.Protocol.TCP
    assert parameters["purpose"].default == netq.Purpose.CLIENT


# -------------------------------------------------------------------------------- Classes

def test_communicator_put_get_close_with_and_its_id() -> None:
    """The documented calls, by keyword as the README names them, over TCP on loopback."""
    where = netq.NetworkLocation("127.0.0.1", free_port())
    server_options = netq.CommunicatorOptions(netloc=where)
    client_options = netq.CommunicatorOptions(netloc=where)
    with netq.new(protocol=netq.Protocol.TCP, purpose=netq.Purpose.SERVER,
                  options=server_options) as server, \
            netq.new(protocol=netq.Protocol.TCP, purpose=netq.Purpose.CLIENT,
                     options=client_options) as client:
        assert isinstance(server, netq.Communicator)
        assert client.options is client_options
        assert client.id == client_options.id
        future = client.put("Hello, Server!")
        assert isinstance(future, Future)
        assert future.result(timeout=30) is None  # resolved: the server's netq has it
        message = server.get(timeout=30)
        assert (message.peer, message.data) == (client.id, "Hello, Server!")
        server.put("Hello, Client!", message.peer).result(timeout=30)  # peer-targeted
        assert client.get(timeout=30).data == "Hello, Client!"
    server.close()  # a second close is harmless
    with pytest.raises(netq.ResourceClosed):
        client.put("late")


def test_stream_has_every_documented_method() -> None:
    stream = netq.stream.Stream()
    assert stream.nchunks == 0 and stream.nbytes == 0 and stream.empty()
    assert stream.writechunk(memoryview(b"ab")) == 2  # each write says how many bytes
    assert stream.writechunks([memoryview(b"cd"), memoryview(b"ef")]) == 4
    assert stream.update([b"gh"]) == 2
    assert (stream.nchunks, stream.nbytes) == (4, 8)
    assert bytes(stream.peekchunk()) == b"ab"
    assert bytes(stream.unwritechunk()) == b"gh"
    first = stream.readchunk()
    assert bytes(first) == b"ab"
    assert stream.unreadchunk(first) == 2
    assert stream.tobytes() == bytes(stream) == b"abcdef"
    shallow = copy.copy(stream)
    assert [bytes(c) for c in shallow.readchunks()] == [b"ab", b"cd", b"ef"]
    assert stream.copy().nbytes == 6 and stream.nbytes == 6  # a copy reads its own chunks
    with stream as same:
        assert same is stream
    assert stream.empty()  # leaving `with` releases the chunks
    stream.update([b"x"])
    stream.clear()
    assert stream.empty()
    assert netq.stream.Stream.frombytes(b"xyz").tobytes() == b"xyz"


def test_pickle_serializer_restrict_and_bytes_serializer() -> None:
    assert netq.stream.PickleSerializer is netq.serializers.PickleSerializer is \
        netq.PickleSerializer
    assert netq.stream.BytesSerializer is netq.serializers.BytesSerializer is \
        netq.BytesSerializer
    anything = netq.stream.PickleSerializer()
    assert anything.load(anything.dump({1, 2})) == {1, 2}
    only_uuid = netq.stream.PickleSerializer(restrict=["uuid.UUID"])
    key = uuid.uuid4()
    assert only_uuid.load(only_uuid.dump(key)) == key
    with pytest.raises(pickle.UnpicklingError):
        only_uuid.load(only_uuid.dump(Path("not allowed")))
    as_bytes = netq.stream.BytesSerializer()
    assert bytes(as_bytes.load(as_bytes.dump(b"raw bytes"))) == b"raw bytes"


def test_the_seed_module_paths_import() -> None:
    """``from net_queue.stream import X`` and ``import net_queue as nq; nq.X``, with netq."""
    from netq import (  # noqa: F401  (importing is the test)
        CommunicatorOptions,
        ConnectionOptions,
        NetworkLocation,
        Protocol,
        Purpose,
        ResourceClosed,
        SecurityOptions,
        SerializationOptions,
        new,
    )
    from netq.stream import BytesSerializer, PickleSerializer, Stream  # noqa: F401


def test_every_name_not_kept_is_in_the_changelog() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    for name in NOT_KEPT:
        assert name in changelog, f"the CHANGELOG does not name {name}"
