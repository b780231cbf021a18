"""One side of the MQTT loss test, in its own process (so its RSS is its own).

    python3 tests/transports/mqtt_loss_peer.py '<json>'

json: role ("consumer" = netq server, "producer" = netq client), host, port, service, count,
size, delay (seconds the consumer sleeps per message), recv_budget, timeout. The producer puts
``count`` messages ``(index, payload)`` as fast as put() lets it; the consumer checks each one
(index in order, payload intact) and sleeps ``delay``. Each prints one JSON line at the end:
what it saw, its peak RSS and the link counters (gaps = broker drops it detected).
"""

from __future__ import annotations

import json
import resource
import sys
import time

import netq as nq
from netq.transports.mqtt import link_statistics


def payload(index: int, size: int) -> bytes:
    stamp = index.to_bytes(8, "little")
    return (stamp * (size // 8 + 1))[:size]


def main() -> None:
    spec = json.loads(sys.argv[1])
    options = nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(spec["host"], spec["port"], path=spec["service"]),
        connection=nq.ConnectionOptions(recv_budget=spec["recv_budget"],
                                        session_timeout=spec["timeout"]),
        mqtt=nq.MQTTOptions(**spec.get("mqtt", {})),
    )
    count, size, timeout = spec["count"], spec["size"], spec["timeout"]
    result = {"role": spec["role"]}
    started = time.monotonic()
    if spec["role"] == "consumer":
        with nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER, options) as server:
            print(json.dumps({"ready": True}), flush=True)
            received, bad = 0, []
            for expected in range(count):
                index, data = server.get(timeout=timeout).data
                if index != expected or data != payload(index, size):
                    bad.append((expected, index))
                received += 1
                time.sleep(spec["delay"])
            result.update(received=received, bad=bad[:10], links=link_statistics(server))
            result["seconds"] = time.monotonic() - started
            result["rss_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            print(json.dumps(result), flush=True)
            sys.stdin.readline()  # stay until the producer is done
    else:
        with nq.new(nq.Protocol.MQTT, nq.Purpose.CLIENT, options) as client:
            futures = [client.put((index, payload(index, size)), timeout=timeout)
                       for index in range(count)]
            failed = 0
            for future in futures:
                if future.exception(timeout) is not None:
                    failed += 1
            result.update(sent=count, failed=failed, links=link_statistics(client))
            result["seconds"] = time.monotonic() - started
            result["rss_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
