"""A netq communicator in a child process, driven line by line over stdin/stdout (JSON).

Used by the fault tests (a process that can be SIGKILLed, a new process reusing a client id,
a server that crashes) and importable by ``conftest.py`` for :func:`encode_options`.

    python3 tests/netq_child.py '<options as JSON>'

The child builds the communicator from the JSON (see :func:`encode_options`), answers
``{"ready": true, "id": ..., "address": ...}``, then serves one command per stdin line and
answers one JSON line each: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...}``.
It exits when stdin closes (so an orphan never outlives the test run).

Commands (``{"op": NAME, ...}``):

    put        data, wait=true        put a JSON-able object (wait: until delivered)
    put_bytes  size, wait=false,      put ``bytes`` of ``size`` (pattern filled; without wait,
               zeros=false            from a thread: the answer comes at once; ``zeros``:
                                      zero-filled, which costs no memory until it is read, and
                                      reading only maps the kernel's zero page: a 256 MiB
                                      message that is killed early never needs 256 MiB)
    throttle   chunk, pause           make every socket write at most ``chunk`` bytes and
                                      sleep ``pause`` s before it (a slow link, in this process)
    get        count, timeout         get ``count`` messages; result: their data
    stats                             a few statistics() fields (recv_held: received bytes
                                      not yet taken by get())
    close      timeout                close the communicator
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

import netq as nq

_SERIALIZATION_FIELDS = ("message_size", "queue_size")


def encode_options(protocol, purpose, options: nq.CommunicatorOptions) -> dict:
    """A JSON-able description of the options (default serializer only)."""
    default = nq.SerializationOptions()
    serialization = options.serialization
    if serialization.load != default.load or serialization.dump != default.dump:
        raise ValueError("a child process can only use the default serializer")
    security = options.security
    if security is not None:
        security = {field.name: getattr(security, field.name)
                    for field in dataclasses.fields(security)}
        security = {name: (value.hex() if isinstance(value, bytes)
                           else os.fspath(value) if isinstance(value, Path) else value)
                    for name, value in security.items()}
    return {
        "protocol": str(nq.Protocol(protocol).value),
        "purpose": str(nq.Purpose(purpose).value),
        "id": str(options.id),
        "netloc": list(options.netloc),
        "connection": dataclasses.asdict(options.connection),
        "serialization": {name: getattr(serialization, name) for name in _SERIALIZATION_FIELDS},
        "security": security,
        "mqtt": dataclasses.asdict(options.mqtt),
    }


def decode_options(spec: dict) -> tuple[nq.Protocol, nq.Purpose, nq.CommunicatorOptions]:
    security = spec["security"]
    if security is not None:
        if security.get("authkey") is not None:
            security["authkey"] = bytes.fromhex(security["authkey"])
        security = nq.SecurityOptions(**security)
    options = nq.CommunicatorOptions(
        id=uuid.UUID(spec["id"]),
        netloc=nq.NetworkLocation(*spec["netloc"]),
        connection=nq.ConnectionOptions(**spec["connection"]),
        serialization=nq.SerializationOptions(**spec["serialization"]),
        security=security,
        mqtt=nq.MQTTOptions(**spec.get("mqtt", {})),
    )
    return nq.Protocol(spec["protocol"]), nq.Purpose(spec["purpose"]), options


def _throttle(chunk: int, pause: float) -> None:
    """Every write of every link in this process: at most ``chunk`` bytes, after ``pause`` s.

    Links write through ``Connection.write_to`` (each call of the carrier's write it makes
    is throttled here) and, where descriptors may go along, ``Connection.outgoing``."""
    from netq.protocol.connection import Connection

    def slowed(buffers):
        time.sleep(pause)  # simulates the slow link asked for
        taken, total = [], 0
        for buffer in buffers:
            view = memoryview(buffer).cast("B")[: chunk - total]
            taken.append(view)
            total += len(view)
            if total >= chunk:
                break
        return taken

    original_outgoing = Connection.outgoing
    original_write_to = Connection.write_to

    def outgoing(self):
        buffers = original_outgoing(self)
        return slowed(buffers) if buffers else buffers

    def write_to(self, write):
        return original_write_to(self, lambda buffers: write(slowed(buffers)))

    Connection.outgoing = outgoing
    Connection.write_to = write_to


def _jsonable(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes": len(value)}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    return value


def _serve(comm, command: dict):
    op = command["op"]
    if op == "put":
        future = comm.put(command["data"])
        if command.get("wait", True):
            future.result(command.get("timeout", 30))
        return None
    if op == "put_bytes":
        size = command["size"]
        data = bytes(size) if command.get("zeros") else (b"netq" * (size // 4 + 1))[:size]
        if command.get("wait", False):
            comm.put(data).result(command.get("timeout", 30))
        else:
            # put() may write a large message itself on an idle link: keep answering.
            threading.Thread(target=comm.put, args=(data,), name="child-put",
                             daemon=True).start()
        return None
    if op == "throttle":
        _throttle(command["chunk"], command["pause"])
        return None
    if op == "get":
        messages = []
        for _ in range(command["count"]):
            messages.append(_jsonable(comm.get(timeout=command.get("timeout", 30)).data))
        return messages
    if op == "stats":
        stats = comm.statistics()
        return {"state": stats.state, "recv_held": stats.recv_held,
                "recv_outstanding": stats.recv_outstanding,
                "peers": [{"peer": str(row.peer), "state": row.state,
                           "reconnects": row.reconnects} for row in stats.peers]}
    if op == "close":
        comm.close(timeout=command.get("timeout"))
        return None
    raise ValueError(f"unknown op {op!r}")


def _reply(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main() -> None:
    protocol, purpose, options = decode_options(json.loads(sys.argv[1]))
    comm = nq.new(protocol, purpose, options)
    serve_commands(comm, lambda command: _serve(comm, command))


def serve_commands(comm: nq.Communicator, serve) -> None:
    """Say ready (id, address, pid), then answer each JSON command line on stdin with
    ``serve(command)``'s result or its error, until stdin closes; then leave at once."""
    address = comm.address
    _reply(ready=True, id=str(comm.id), address=list(address) if isinstance(address, tuple)
           else address, pid=os.getpid())
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = serve(json.loads(line))
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            _reply(ok=False, error=repr(error), type=type(error).__name__)
        else:
            _reply(ok=True, result=result)
    # stdin closed: the test is done with us (or died). Leave without ceremony.
    os._exit(0)


if __name__ == "__main__":
    main()
