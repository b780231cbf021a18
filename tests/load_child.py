"""Many netq clients in one process, for the load test (tests/test_load.py).

    python3 tests/load_child.py '{"protocol": "tcp", "host": ..., "port": ..., "first": 0,
                                  "clients": 100, "messages": 20, "size": null}'

Builds ``clients`` client communicators (global indexes ``first`` .., see :func:`size_of`),
answers ``{"ready": ...}``, then obeys one line per command on stdin, answering one JSON line:

    go      every client puts ``messages`` messages, interleaved across clients (all of them
            flood at once); answers when every future has resolved, with the time it took
    close   closes every client (in parallel); answers with this process's peak RSS

Each message is ``(client index, sequence number, crc32 of payload, payload)``; the payload's
size is ``size_of(client, sequence)`` (or ``size`` when given) and its first 4 bytes stamp the
sequence number.
"""

from __future__ import annotations

import json
import random
import resource
import sys
import threading
import time
import zlib

import netq as nq

KiB, MiB = nq.KiB, nq.MiB


def size_of(client: int, seq: int) -> int:
    """64 B .. 1 MiB: log-uniform 64 B .. 64 KiB, plus one 1 MiB message from every tenth
    client and one 256 KiB message from every tenth other client."""
    if seq == 0 and client % 10 == 0:
        return 1 * MiB
    if seq == 1 and client % 10 == 5:
        return 256 * KiB
    rng = random.Random(client * 7919 + seq)
    return int(64 * 2 ** rng.uniform(0, 10))


def payload_of(client: int, seq: int, size: int | None = None) -> bytes:
    size = size_of(client, seq) if size is None else size
    stamp = (client << 8 | seq).to_bytes(4, "little")
    return (stamp * (size // 4 + 1))[:size]


def message_of(client: int, seq: int, size: int | None = None) -> tuple:
    payload = payload_of(client, seq, size)
    return client, seq, zlib.crc32(payload), payload


def _reply(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main() -> None:
    spec = json.loads(sys.argv[1])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # ~4 descriptors per communicator (socket, selector, wake pipe)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    netloc = nq.NetworkLocation(spec["host"], spec["port"])
    first, count, messages = spec["first"], spec["clients"], spec["messages"]
    size = spec.get("size")  # every message this size, instead of size_of()
    clients = [nq.new(nq.Protocol(spec["protocol"]), nq.Purpose.CLIENT,
                      nq.CommunicatorOptions(netloc=netloc)) for _ in range(count)]
    _reply(ready=True, ids=[str(client.id) for client in clients])
    for line in sys.stdin:
        command = line.strip()
        if command == "go":
            started = time.perf_counter()
            futures = []
            for seq in range(messages):
                for index, client in enumerate(clients):
                    futures.append(client.put(message_of(first + index, seq, size)))
            for future in futures:
                future.result(120)
            _reply(ok=True, seconds=time.perf_counter() - started)
        elif command == "close":
            closers = [threading.Thread(target=client.close, kwargs={"timeout": 30},
                                        name="load-closer") for client in clients]
            for thread in closers:
                thread.start()
            for thread in closers:
                thread.join()
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            _reply(ok=True, peak_rss=peak)
        elif command:
            _reply(ok=False, error=f"unknown command {command!r}")
    # stdin closed: the test is done with us (or died).


if __name__ == "__main__":
    main()
