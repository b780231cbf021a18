"""Helpers for the widget tests: a recorded "frontend" and snapshots built by hand.

The ``frontend`` fixture (conftest.py) replaces ``comm.create_comm`` (what ipywidgets 8 uses
to open widget comms) with :class:`RecordingComm`: every message a browser would receive is
JSON-encoded (as the kernel's session would: ``allow_nan=False``, a NaN fails the test) and
recorded, and :class:`Frontend` replays them into a replica of what the browser holds: each
widget's state (the ``comm_open`` state, then every ``update``), and for a monitor the point
history its ES module keeps (``widgets/frontend/monitor.js``: each synced ``point`` appended
once, bounded to ``frame.history``, replaced by the kernel's answer to ``{"type": "history"}``).
:meth:`Frontend.ask_history` sends that question as the browser's module does when it loads.
"""

from __future__ import annotations

import json
import threading
import uuid

import netq as nq
from netq.statistics import CommunicatorStatistics, PeerStatistics


class RecordingComm:
    kernel = "recording"  # ipywidgets only sends when comm.kernel is not None

    def __init__(self, frontend: Frontend, target_name="", data=None, metadata=None,
                 buffers=None, comm_id=None, **_kwargs) -> None:
        self.comm_id = comm_id or uuid.uuid4().hex
        self.target_name = target_name
        self.frontend = frontend
        self._callback = None
        frontend._record(self, "comm_open", data, buffers)

    def send(self, data=None, metadata=None, buffers=None) -> None:
        self.frontend._record(self, "comm_msg", data, buffers)

    def close(self, data=None, metadata=None, buffers=None, deleting=False) -> None:
        self.frontend._record(self, "comm_close", data, buffers)

    def on_msg(self, callback) -> None:
        self._callback = callback

    def on_close(self, callback) -> None:
        pass

    def deliver(self, data: dict, buffers=()) -> None:
        """A message from the browser to the kernel-side widget."""
        self._callback({"content": {"comm_id": self.comm_id, "data": data},
                        "buffers": list(buffers)})


class PointHistory:
    """The monitor module's point history, replayed (the rules of monitor.js appendPoint)."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.series: dict[str, list] = {}

    def append(self, point: dict, history: int) -> bool:
        if not point or not isinstance(point.get("t"), (int, float)):
            return False
        if self.t and point["t"] <= self.t[-1]:
            return False
        length = len(self.t)
        self.t.append(point["t"])
        self.series = {key: self.series.get(key, [None] * length) + [sample]
                       for key, sample in point.get("values", {}).items()}
        excess = len(self.t) - history
        if excess > 0:
            del self.t[:excess]
            for samples in self.series.values():
                del samples[:excess]
        return True

    def replace(self, message: dict, point: dict, history: int) -> None:
        self.t = list(message.get("t", []))
        self.series = {key: list(samples) for key, samples in message.get("series", {}).items()}
        self.append(point, history)


class Frontend:
    """What a browser would have received, replayed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list[dict] = []  # every message, JSON-decoded again
        self.comms: dict[str, RecordingComm] = {}
        self.states: dict[str, dict] = {}  # comm_id -> widget state
        self.histories: dict[str, PointHistory] = {}  # comm_id -> a monitor's point history
        self.custom: list[dict] = []  # custom messages from the kernel, in order
        self.bytes_sent = 0  # JSON bytes of every message (what the wire would carry)

    def create_comm(self, **kwargs) -> RecordingComm:
        comm = RecordingComm(self, **kwargs)
        self.comms[comm.comm_id] = comm
        return comm

    def _record(self, comm: RecordingComm, kind: str, data, buffers) -> None:
        text = json.dumps(data, allow_nan=False)  # browsers' JSON has no NaN
        wire = json.loads(text)
        message = {"kind": kind, "comm_id": comm.comm_id, "data": wire,
                   "buffers": [bytes(b) for b in buffers or ()]}
        with self.lock:
            self.bytes_sent += len(text)
            self.messages.append(message)
            self._apply(message)

    def _apply(self, message: dict) -> None:
        data = message["data"] or {}
        comm_id = message["comm_id"]
        if message["kind"] == "comm_open":
            self.states[comm_id] = dict(data.get("state", {}))
            self._point(comm_id)
        elif message["kind"] == "comm_msg" and data.get("method") == "update":
            state = self.states.setdefault(comm_id, {})
            state.update(data.get("state", {}))
            if "point" in data.get("state", {}):
                self._point(comm_id)
        elif message["kind"] == "comm_msg" and data.get("method") == "custom":
            content = data.get("content", {})
            self.custom.append(content)
            if content.get("type") == "history":
                state = self.states.get(comm_id, {})
                self.histories.setdefault(comm_id, PointHistory()).replace(
                    content, state.get("point", {}), self._history_length(comm_id))

    def _history_length(self, comm_id: str) -> int:
        return self.states.get(comm_id, {}).get("frame", {}).get("history", 600)

    def _point(self, comm_id: str) -> None:
        state = self.states[comm_id]
        if "point" in state:
            self.histories.setdefault(comm_id, PointHistory()).append(
                state["point"], self._history_length(comm_id))

    # -- what tests ask -----------------------------------------------------------------

    def state(self, widget) -> dict:
        with self.lock:
            return dict(self.states[widget.model_id])

    def history(self, widget) -> PointHistory:
        """A copy of the point history the browser's module holds for ``widget``."""
        with self.lock:
            held = self.histories.get(widget.model_id, PointHistory())
            copy = PointHistory()
            copy.t = list(held.t)
            copy.series = {key: list(samples) for key, samples in held.series.items()}
            return copy

    def ask_history(self, widget) -> None:
        """What monitor.js sends when it loads: the kernel answers with the whole window."""
        self.comms[widget.model_id].deliver({"method": "custom",
                                             "content": {"type": "history"}})




def make_row(peer, **fields) -> PeerStatistics:
    values = dict(peer=peer, state="connected", queue_in=0, queue_in_bytes=0, queue_out=0,
                  queue_out_bytes=0, inflight=0, inflight_bytes=0, messages_in=0, bytes_in=0,
                  messages_out=0, bytes_out=0, credit_out=0, credit_in=0, memory=0,
                  reconnects=0, connected_for=1.0, messages_in_per_s=0.0, bytes_in_per_s=0.0,
                  messages_out_per_s=0.0, bytes_out_per_s=0.0)
    values.update(fields)
    return PeerStatistics(**values)


def make_stats(rows, *, now: float = 1.0, state: str = "open") -> CommunicatorStatistics:
    """A snapshot with exactly these rows (rates as given, not recomputed)."""
    rows = tuple(rows)
    return CommunicatorStatistics(
        id=COMMUNICATOR_ID, purpose="server", protocol="tcp", address="127.0.0.1:1",
        state=state, uptime=now, time=now, peers=rows,
        messages_in=sum(r.messages_in for r in rows), bytes_in=sum(r.bytes_in for r in rows),
        messages_out=sum(r.messages_out for r in rows),
        bytes_out=sum(r.bytes_out for r in rows),
        messages_in_per_s=sum(r.messages_in_per_s for r in rows),
        bytes_in_per_s=sum(r.bytes_in_per_s for r in rows),
        messages_out_per_s=sum(r.messages_out_per_s for r in rows),
        bytes_out_per_s=sum(r.bytes_out_per_s for r in rows),
        memory=sum(r.memory for r in rows))


COMMUNICATOR_ID = uuid.uuid4()


# ---------------------------------------------------------------------------- real traffic


class Traffic:
    """A TCP server on 127.0.0.1 and clients putting real messages to it, each on a thread.

    The server's consumer thread gets everything and answers every 50th message, so both
    directions move. ``names`` maps client ids to ``client-<n>``. Close (or use ``with``)
    to stop the threads and close every communicator.
    """

    def __init__(self, clients: int = 3, size: int = 4096, pause: float = 0.002) -> None:
        self.size = size
        self.pause = pause
        self.server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(host="127.0.0.1", port=0)))
        self.port = self.server.address[1]
        self.names: dict[uuid.UUID, str] = {}
        self.clients: list = []
        self._workers: dict = {}  # client -> (stop event, thread)
        self._stop = threading.Event()
        self.received = 0
        self._consumer = threading.Thread(target=self._consume, name="traffic-server",
                                          daemon=True)
        self._consumer.start()
        for _ in range(clients):
            self.add_client()

    def __enter__(self) -> Traffic:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _consume(self) -> None:
        server = self.server
        while True:
            try:
                batch = server.get_many(max_messages=256, timeout=0.05)
            except nq.Empty:
                if self._stop.is_set():
                    return
                continue
            except nq.ResourceClosed:
                return
            for message in batch:
                self.received += 1
                if self.received % 50 == 0:
                    try:
                        server.put(b"receipt", message.peer)
                    except nq.NetqError:
                        pass

    def add_client(self):
        client = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(host="127.0.0.1", port=self.port)))
        self.names[client.id] = f"client-{len(self.names)}"
        stop = threading.Event()
        payload = bytes(self.size)

        def work() -> None:
            while not stop.is_set():
                try:
                    client.put(payload, timeout=1)
                except nq.Full:
                    continue
                except nq.NetqError:
                    return
                try:
                    while True:
                        client.get_nowait()
                except (nq.Empty, nq.ResourceGone):  # closed, or the server went away
                    pass
                stop.wait(self.pause)

        thread = threading.Thread(target=work, name=f"traffic-{self.names[client.id]}",
                                  daemon=True)
        self.clients.append(client)
        self._workers[client] = (stop, thread)
        thread.start()
        return client

    def remove_client(self, client) -> None:
        stop, thread = self._workers.pop(client)
        stop.set()
        thread.join(10)
        client.close(timeout=5)
        self.clients.remove(client)

    def close(self) -> None:
        for client in list(self.clients):
            self.remove_client(client)
        self._stop.set()
        self.server.close(timeout=5)
        self._consumer.join(10)
