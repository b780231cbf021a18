"""Helpers for the widget tests: a recorded "frontend" and snapshots built by hand.

The ``frontend`` fixture (conftest.py) replaces ``comm.create_comm`` (what ipywidgets 8 uses
to open widget comms) with :class:`RecordingComm`: every message a browser would receive is
JSON-encoded (as the kernel's session would) and recorded, and :class:`Frontend` replays them
into a replica of what the browser holds: each widget's state, and the data of every bokeh
ColumnDataSource after the kernel's PATCH-DOC messages. ``Frontend.echo`` sends back what
jupyter_bokeh 4.1's browser side sends after applying a patch (the same events, marked
``"event": "jsevent"``).
"""

from __future__ import annotations

import json
import math
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


def _decode(value):
    """Bokeh's JSON serialization -> plain Python (maps, NaN numbers, lists)."""
    if isinstance(value, dict):
        kind = value.get("type")
        if kind == "map":
            return {key: _decode(item) for key, item in value.get("entries", [])}
        if kind == "number":
            return float(value["value"])
        if "id" in value and len(value) == 1:
            return value  # a reference
        return {key: _decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


class Frontend:
    """What a browser would have received, replayed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list[dict] = []  # every message, JSON-decoded again
        self.comms: dict[str, RecordingComm] = {}
        self.states: dict[str, dict] = {}  # comm_id -> widget state
        self.sources: dict[str, dict] = {}  # bokeh model id -> ColumnDataSource data
        self.patches: list[dict] = []  # decoded PATCH-DOC contents, in order
        self._pending: dict[str, list] = {}  # comm_id -> payloads of a PATCH-DOC in progress

    def create_comm(self, **kwargs) -> RecordingComm:
        comm = RecordingComm(self, **kwargs)
        self.comms[comm.comm_id] = comm
        return comm

    def _record(self, comm: RecordingComm, kind: str, data, buffers) -> None:
        wire = json.loads(json.dumps(data))  # what a session would put on the wire
        message = {"kind": kind, "comm_id": comm.comm_id, "data": wire,
                   "buffers": [bytes(b) for b in buffers or ()]}
        with self.lock:
            self.messages.append(message)
            self._apply(message)

    def _apply(self, message: dict) -> None:
        data = message["data"] or {}
        comm_id = message["comm_id"]
        if message["kind"] == "comm_open":
            self.states[comm_id] = dict(data.get("state", {}))
            self._load_bundle(self.states[comm_id])
        elif message["kind"] == "comm_msg" and data.get("method") == "update":
            self.states.setdefault(comm_id, {}).update(data.get("state", {}))
            self._load_bundle(data.get("state", {}))
        elif message["kind"] == "comm_msg" and data.get("method") == "custom":
            content = data.get("content", {})
            if content.get("msg") == "patch":
                self._patch_payload(comm_id, content, message["buffers"])

    def _load_bundle(self, state: dict) -> None:
        """A new render_bundle: the view re-renders from it (its sources replace ours)."""
        bundle = state.get("render_bundle")
        if not bundle:
            return
        if isinstance(bundle, str):
            bundle = json.loads(bundle)
        for doc in bundle["docs_json"].values():
            for root in doc["roots"]:
                self._collect_sources(root, replace=True)

    def _collect_sources(self, node, replace: bool = False) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and node.get("name") == "ColumnDataSource" \
                    and (replace or node["id"] not in self.sources):
                # (BokehJS keeps a model it knows when a patch mentions it by value)
                attributes = node.get("attributes", {})
                self.sources[node["id"]] = _decode(attributes.get("data", {"type": "map"}))
            for value in node.values():
                self._collect_sources(value, replace)
        elif isinstance(node, list):
            for value in node:
                self._collect_sources(value, replace)

    def _patch_payload(self, comm_id: str, content: dict, buffers: list) -> None:
        pending = self._pending.setdefault(comm_id, [])
        pending.append(content.get("payload"))
        if len(pending) < 3:
            return
        header = json.loads(pending[0])
        if header.get("num_buffers"):
            raise AssertionError("the widget sent bokeh buffers; the replica expects JSON only")
        body = json.loads(pending[2])
        self._pending[comm_id] = []
        self.patches.append(body)
        for event in body.get("events", []):
            self._collect_sources(event)  # new models (renderers, sources) by value
            kind = event.get("kind")
            if kind == "ColumnsStreamed":
                source = self.sources[event["model"]["id"]]
                new = _decode(event["data"])
                rollover = event.get("rollover")
                for key, values in new.items():
                    column = source.setdefault(key, []) + list(values)
                    if rollover is not None and len(column) > rollover:
                        column = column[-rollover:]
                    source[key] = column
            elif kind == "ColumnDataChanged":  # source.data = {...}
                new = _decode(event["data"])
                columns = event.get("cols")
                if columns is None:
                    self.sources[event["model"]["id"]] = new
                else:
                    source = self.sources[event["model"]["id"]]
                    for key in columns:
                        source[key] = new[key]
            elif kind == "ModelChanged" and event.get("attr") == "data":
                if event["model"]["id"] in self.sources:
                    self.sources[event["model"]["id"]] = _decode(event["new"])

    # -- what tests ask -----------------------------------------------------------------

    def state(self, widget) -> dict:
        with self.lock:
            return dict(self.states[widget.model_id])

    def source(self, source) -> dict:
        with self.lock:
            return {key: list(values) for key, values in self.sources[source.id].items()}

    def echo(self, bokeh_widget) -> int:
        """Send back every patch event, as jupyter_bokeh's browser side does; returns count."""
        comm = self.comms[bokeh_widget.model_id]
        with self.lock:
            patches = list(self.patches)
        count = 0
        for body in patches:
            for event in body.get("events", []):
                if event.get("kind") in ("ColumnsStreamed", "ColumnsPatched", "ModelChanged"):
                    content = dict(event, event="jsevent")
                    comm.deliver({"method": "custom", "content": content})
                    count += 1
        return count


def same_columns(a: dict, b: dict) -> bool:
    """Two ColumnDataSource data dicts are equal (NaN == NaN)."""
    if set(a) != set(b):
        return False
    return all(len(a[k]) == len(b[k]) and all(_same(x, y) for x, y in zip(a[k], b[k], strict=True))
               for k in a)


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
                except (nq.Empty, nq.ResourceClosed):
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
