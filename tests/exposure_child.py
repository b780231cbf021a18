"""Servers on addresses that are not loopback, inside a network namespace of the test's own.

Run by ``tests/test_security_defaults.py`` as::

    unshare --net python3 tests/exposure_child.py TRANSPORT COMBINATION...

In a fresh network namespace nothing but this process exists: the child brings ``lo`` up and
gives it two addresses that are not loopback (:data:`HOST4` in 198.18.0.0/15, the
benchmarking range, and :data:`HOST6` in 2001:db8::/32, the documentation range), so a server
bound there is "reachable by other machines" as far as netq can tell, while every packet stays
inside the namespace. For each combination it starts a server (or, for MQTT, a mosquitto on
:data:`HOST4` and a server through it), and when the server starts, a client that does one
round trip; it prints one line ``RESULT {json}`` per combination: ``refused`` (the
UnprotectedServer text) or ``round_trip``, plus the WARNING records of the ``netq`` logger
logged meanwhile. TLS files (a CA, a server certificate for both addresses, a client
certificate) are made here, for these addresses.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import netq as nq
from harness import TLSFiles, write_tls_files

HOST4 = "198.18.0.1"
HOST6 = "2001:db8::1"
ROUND_TRIP_TIMEOUT = 30.0  # seconds; only a broken build waits this long
# default: no protection (on a TLS transport: TLS without client certificates, which
# authenticates the server, not its clients); broker-tls / credentials: MQTT only.
COMBINATIONS = ("default", "authkey", "mtls", "restrict", "bytes", "optout",
                "broker-tls", "credentials")

TRANSPORTS = {  # name: (protocol, host, TLS to the server)
    "tcp": (nq.Protocol.TCP, HOST4, False),
    "tcp6": (nq.Protocol.TCP, HOST6, False),
    "tls": (nq.Protocol.TCP, HOST4, True),
    "grpc": (nq.Protocol.GRPC, HOST4, False),
    "grpc-tls": (nq.Protocol.GRPC, HOST4, True),
    "mqtt": (nq.Protocol.MQTT, HOST4, False),
}


def set_up_namespace() -> None:
    for command in (["ip", "link", "set", "lo", "up"],
                    ["ip", "addr", "add", f"{HOST4}/32", "dev", "lo"],
                    ["ip", "-6", "addr", "add", f"{HOST6}/128", "dev", "lo", "nodad"]):
        subprocess.run(command, check=True, capture_output=True, text=True)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def options_for(transport: str, combination: str, netloc: nq.NetworkLocation,
                files: TLSFiles):
    """(server options, client options) for one combination."""
    if combination not in COMBINATIONS:
        raise ValueError(f"unknown combination {combination!r}")
    protocol, _, tls = TRANSPORTS[transport]
    server_security: dict = {}
    client_security: dict = {}
    serialization = nq.SerializationOptions()
    mqtt = nq.MQTTOptions()
    if tls or combination == "mtls":
        server_security = {"certificate": files.server_cert, "key": files.server_key}
        client_security = {"certificate": files.ca}
    if combination == "authkey":
        key = b"exposure test key"
        server_security["authkey"] = client_security["authkey"] = key
    elif combination == "mtls":
        server_security["client_ca"] = files.ca
        client_security.update(client_certificate=files.client_cert, key=files.client_key)
    elif combination == "restrict":
        serialization = nq.SerializationOptions(
            load=nq.PickleSerializer(restrict=["builtins"]).load)
    elif combination == "bytes":
        serializer = nq.BytesSerializer()
        serialization = nq.SerializationOptions(load=serializer.load, dump=serializer.dump)
    elif combination == "optout":
        server_security["allow_untrusted_peers"] = True
    elif combination == "broker-tls":  # MQTT: TLS to the broker
        server_security = {"certificate": files.ca}
        client_security = {"certificate": files.ca}
    elif combination == "credentials":  # MQTT: broker credentials
        mqtt = nq.MQTTOptions(username="netq", password="secret")
    if protocol is nq.Protocol.MQTT:  # both ends are broker clients: the same security
        client_security = dict(server_security)

    def build(security: dict) -> nq.CommunicatorOptions:
        return nq.CommunicatorOptions(
            netloc=netloc, serialization=serialization, mqtt=mqtt,
            security=nq.SecurityOptions(**security) if security else None)

    return build(server_security), build(client_security)


def run(transport: str, combination: str, files: TLSFiles, directory: Path) -> dict:
    protocol, host, _ = TRANSPORTS[transport]
    records = Records()
    logger = logging.getLogger("netq")
    logger.addHandler(records)
    broker = None
    try:
        if protocol is nq.Protocol.MQTT:
            from netq.lab.brokers import LocalBroker

            tls = ({"certfile": files.server_cert, "keyfile": files.server_key}
                   if combination == "broker-tls" else {})
            broker = LocalBroker(host=host, directory=directory / f"broker-{combination}",
                                 **tls)
            broker.start()
            netloc = nq.NetworkLocation(host, broker.port, path=f"exposure-{combination}")
        else:
            netloc = nq.NetworkLocation(host, 0)
        server_options, client_options = options_for(transport, combination, netloc, files)
        try:
            server = nq.new(protocol, nq.Purpose.SERVER, server_options)
        except nq.UnprotectedServer as refusal:
            return {"refused": str(refusal), "warnings": records.messages}
        try:
            if protocol is not nq.Protocol.MQTT:
                client_options = client_options.replace(
                    netloc=nq.NetworkLocation(host, server.address[1]))
            bytes_only = combination == "bytes"
            with nq.new(protocol, nq.Purpose.CLIENT, client_options) as client:
                client.put(b"ping" if bytes_only else "ping").result(ROUND_TRIP_TIMEOUT)
                message = server.get(timeout=ROUND_TRIP_TIMEOUT)
                server.put(b"pong" if bytes_only else "pong", message.peer).result(
                    ROUND_TRIP_TIMEOUT)
                reply = client.get(timeout=ROUND_TRIP_TIMEOUT)
            address = server.address
        finally:
            server.close(timeout=ROUND_TRIP_TIMEOUT)
        return {"round_trip": [repr(message.data), repr(reply.data)],
                "address": repr(address), "warnings": records.messages}
    finally:
        logger.removeHandler(records)
        if broker is not None:
            broker.stop()


def main(argv: list[str]) -> int:
    transport, combinations = argv[0], argv[1:]
    set_up_namespace()
    with tempfile.TemporaryDirectory(prefix="netq-exposure-") as name:
        directory = Path(name)
        files = write_tls_files(directory, ips=(HOST4, HOST6), dns=(), name="exposure test")
        for combination in combinations:
            result = run(transport, combination, files, directory)
            print("RESULT " + json.dumps({"combination": combination, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
