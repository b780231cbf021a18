"""Child of test_ctrl_c_during_caller_led_gets_tears_no_link.

A TCP server streams 4000 messages of 2 KiB, in bursts of 20 every 1 ms or so, to a client
whose main thread takes them with get() (leading the loop) while another thread sends SIGINT
to the main thread every 1 ms. Prints ``RESULT <json>``.
"""

from __future__ import annotations

import json
import signal
import threading

import netq as nq

T = 30.0
TOTAL = 4000
BURST = 20
PAD = bytes(2048)  # parse work per message, so that interrupts land in the turns' work


def main() -> None:
    # The test needs Python's own handler, whatever this process inherited (an ignored SIGINT
    # under nohup or a background job would make every pthread_kill below a no-op).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER,
                    nq.CommunicatorOptions(netloc=nq.NetworkLocation(host="127.0.0.1", port=0)))
    port = server.address[1]
    client = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT,
                    nq.CommunicatorOptions(netloc=nq.NetworkLocation(host="127.0.0.1",
                                                                     port=port)))
    for index in range(5):  # a few round trips park the client's I/O thread
        client.put(index)
        message = server.get(timeout=T)
        server.put(message.data, message.peer)
        client.get(timeout=T)
    stop = threading.Event()
    main_ident = threading.main_thread().ident
    assert main_ident is not None

    pacing = threading.Event()  # never set: a short pause between puts

    def stream() -> None:
        for index in range(TOTAL):  # in bursts: the client's get() waits, then reads a burst
            server.put((index, PAD))
            if index % BURST == BURST - 1:
                pacing.wait(0.001)

    def interrupt() -> None:
        while not stop.wait(0.001):  # pacing the interrupts, not waiting for anything
            signal.pthread_kill(main_ident, signal.SIGINT)

    streamer = threading.Thread(target=stream)
    interrupter = threading.Thread(target=interrupt)
    streamer.start()
    interrupter.start()
    got: list[int] = []
    interrupts = 0
    try:
        while not got or got[-1] < TOTAL - 1:
            try:
                got.append(client.get(timeout=5).data[0])
            except KeyboardInterrupt:
                interrupts += 1
            except nq.Empty:
                break  # the last message was the one an interrupt dropped in get()
    finally:
        stop.set()
        while interrupter.is_alive():  # its last signals may still land here
            try:
                interrupter.join(T)
            except KeyboardInterrupt:
                interrupts += 1
    streamer.join(T)
    row = next(p for p in client.statistics().peers if p.peer == server.id)
    result = {
        "total": TOTAL, "received": len(got), "interrupts": interrupts,
        "in_order_no_duplicates": all(a < b for a, b in zip(got, got[1:], strict=False)),
        "reconnects": row.reconnects, "caller_led_turns": client.loop.caller_led_turns,
    }
    print("RESULT " + json.dumps(result), flush=True)
    client.close(timeout=T)
    server.close(timeout=T)


if __name__ == "__main__":
    main()
