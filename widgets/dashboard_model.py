"""The dashboard's data model: what one tick of :class:`netq.widgets.dashboard.Dashboard`
sees (each communicator's statistics, the links paired from both ends, the waits) and the
bounded history of every link and communicator its sparklines are drawn from.
"""

from __future__ import annotations

import collections
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..display.formatting import format_address, format_byte_rate
from ..display.tables import title_state
from ..statistics import CommunicatorStatistics, PeerStatistics

__all__ = ("Link", "LinkFigures", "Stall", "DashboardSnapshot", "find_links",
           "communicator_state", "History", "HISTORY", "SPARK_SCALE", "MAP_NODES", "map_layout")

MAP_NODES = 10  # boxes per side of the map; the quietest others are folded into one box
HISTORY = 120  # samples kept per link and per communicator (2 minutes at the default 1 Hz)
SPARK_SCALE = 100  # sparkline points travel as integers 0..SPARK_SCALE of the row's maximum


@dataclass(frozen=True)
class Link:
    """One connection as seen from one or both of its ends (``a`` is the server's side where
    the server is in this kernel). ``a_row`` / ``b_row``: that end's row for the other
    (None when that end is in another process)."""
    a: uuid.UUID
    b: uuid.UUID
    a_row: PeerStatistics | None
    b_row: PeerStatistics | None

    @property
    def rows(self) -> tuple[PeerStatistics, ...]:
        return tuple(row for row in (self.a_row, self.b_row) if row is not None)

    @property
    def bytes_per_s(self) -> float:
        """Bytes per second carried, both directions, as the better-informed end counts."""
        row = self.a_row or self.b_row
        return 0.0 if row is None else row.bytes_in_per_s + row.bytes_out_per_s

    @property
    def blocked(self) -> str:
        return "; ".join(row.blocked for row in self.rows if row.blocked)

    @property
    def blocked_for(self) -> float:
        """Seconds the longest of its waits has lasted (0 while its traffic flows)."""
        return max((row.blocked_for for row in self.rows if row.blocked), default=0.0)

    @property
    def state(self) -> str:
        row = self.a_row or self.b_row
        return "" if row is None else row.state


class LinkFigures(NamedTuple):
    """A link's figures in the direction of its arrow (→ is from ``a`` to ``b``): bytes and
    messages per second, messages in total, queued messages (unsent at the sender plus not yet
    taken by ``get()`` at the receiver, where that end is known) and credit in bytes."""
    forward_bytes: float
    back_bytes: float
    forward_messages: float
    back_messages: float
    forward_total: int
    back_total: int
    forward_queued: int
    back_queued: int
    forward_credit: int | None
    back_credit: int | None

    @classmethod
    def of(cls, link: Link) -> LinkFigures:
        a, b = link.a_row, link.b_row
        if a is not None:
            forward = (a.bytes_out_per_s, a.messages_out_per_s, a.messages_out)
            back = (a.bytes_in_per_s, a.messages_in_per_s, a.messages_in)
        elif b is not None:
            forward = (b.bytes_in_per_s, b.messages_in_per_s, b.messages_in)
            back = (b.bytes_out_per_s, b.messages_out_per_s, b.messages_out)
        else:
            forward = back = (0.0, 0.0, 0)
        forward_queued = (a.queue_out if a else 0) + (b.queue_in if b else 0)
        back_queued = (a.queue_in if a else 0) + (b.queue_out if b else 0)
        forward_credit = a.credit_out if a else b.credit_in if b else None
        back_credit = b.credit_out if b else a.credit_in if a else None
        return cls(forward[0], back[0], forward[1], back[1], int(forward[2]), int(back[2]),
                   forward_queued, back_queued, forward_credit, back_credit)

    @property
    def bytes_per_s(self) -> float:
        return self.forward_bytes + self.back_bytes


@dataclass
class Stall:
    """A wait: on a link (``peer`` is the other end) or, with ``peer`` None, a ``get()`` of
    ``communicator`` that waits. Why, from when (``time.time()``) and for how long."""
    communicator: uuid.UUID
    peer: uuid.UUID | None
    reason: str
    started: float
    ended: float | None = None

    @property
    def seconds(self) -> float:
        return (self.ended if self.ended is not None else time.time()) - self.started


@dataclass
class DashboardSnapshot:
    """What one tick saw: each communicator's statistics (by id), the links, the waits."""
    taken: float  # time.time()
    communicators: dict[uuid.UUID, CommunicatorStatistics] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    active_stalls: list[Stall] = field(default_factory=list)
    recent_stalls: list[Stall] = field(default_factory=list)


def find_links(stats: Mapping[uuid.UUID, CommunicatorStatistics]) -> list[Link]:
    """Pair the two ends of every connection between communicators of this kernel (a peer's
    id is the other end's communicator id); a peer in another process is a one-ended link.
    A connection that every known end reports ``closed`` is over and not listed (a closed
    communicator still lists its former peers as long as it is referenced)."""
    links: dict[frozenset[uuid.UUID], Link] = {}
    over: set[frozenset[uuid.UUID]] = set()
    for ident, snapshot in stats.items():
        for row in snapshot.peers:
            key = frozenset((ident, row.peer))
            if key in links or key in over:
                continue
            other = stats.get(row.peer)
            other_row = None
            if other is not None:
                other_row = next((r for r in other.peers if r.peer == ident), None)
            if all(end.state == "closed" for end in (row, other_row) if end is not None):
                over.add(key)
            elif snapshot.purpose == "client" and other is not None:
                links[key] = Link(row.peer, ident, other_row, row)
            else:
                links[key] = Link(ident, row.peer, row, other_row)
    return sorted(links.values(), key=lambda link: (str(link.a), str(link.b)))


def communicator_state(stats: CommunicatorStatistics) -> str:
    """The word a communicator's badge shows: :func:`netq.display.tables.title_state`, and
    ``waiting`` also while one of its ``get()`` calls waits."""
    word = title_state(stats)
    if word in ("open", "connecting") and stats.get_waiting:
        return "waiting"
    return word


class History:
    """The last ``size`` samples of one link or communicator (tuples of floats) and the tick
    it was last seen at. A tick it missed is a gap (None) when it shows up again."""
    __slots__ = ("samples", "last_tick")

    def __init__(self, size: int) -> None:
        self.samples: collections.deque[tuple[float, ...] | None] = collections.deque(
            maxlen=size)
        self.last_tick = -1

    def add(self, tick: int, values: tuple[float, ...]) -> None:
        if self.last_tick >= 0:
            for _ in range(min(tick - self.last_tick - 1, self.samples.maxlen or 0)):
                self.samples.append(None)
        self.samples.append(values)
        self.last_tick = tick

    def sparkline(self, indices: Iterable[int], formatter) -> dict[str, Any]:
        """The series at ``indices`` as integers 0..SPARK_SCALE of their common maximum
        (None: a gap), and that maximum formatted (what the top of the sparkline means)."""
        indices = tuple(indices)
        top = max((sample[i] for sample in self.samples if sample is not None
                   for i in indices), default=0.0)
        scale = SPARK_SCALE / top if top > 0 else 0.0
        series = [[None if sample is None else round(sample[i] * scale)
                   for sample in self.samples] for i in indices]
        # the samples kept span the sparkline's width (a young link's 5 samples too)
        return {"series": series, "max": formatter(top), "size": max(len(self.samples), 2)}


def map_layout(snap: DashboardSnapshot,
               figures: Mapping[tuple[uuid.UUID, uuid.UUID], LinkFigures],
               name: Callable[[uuid.UUID], str]) -> dict[str, Any]:
    """Servers left, clients right, outside peers grey on the side opposite their end;
    at most MAP_NODES boxes a side (the busiest), the rest folded into one box. Every
    position is computed here, in a 640-unit-wide coordinate system the view scales."""
    stats = snap.communicators
    traffic: dict[uuid.UUID, float] = collections.defaultdict(float)
    side: dict[uuid.UUID, str] = {}
    for ident, snapshot in stats.items():
        side[ident] = "left" if snapshot.purpose == "server" else "right"
        traffic[ident] += 0.0
    for link in snap.links:
        rate = figures[(link.a, link.b)].bytes_per_s
        for end, other in ((link.a, link.b), (link.b, link.a)):
            traffic[end] += rate
            if end not in side:
                side[end] = "right" if stats[other].purpose == "server" else "left"
    width, box_w, box_h, gap = 640, 176, 30, 8
    columns: dict[str, list[uuid.UUID]] = {"left": [], "right": []}
    folded: dict[str, list[uuid.UUID]] = {"left": [], "right": []}
    for column in ("left", "right"):
        members = [ident for ident, where in side.items() if where == column]
        busiest = sorted(members, key=lambda i: (-traffic[i], name(i)))
        if len(busiest) > MAP_NODES:
            shown, folded[column] = busiest[:MAP_NODES - 1], busiest[MAP_NODES - 1:]
        else:
            shown = busiest
        columns[column] = sorted(shown, key=lambda i: (stats.get(i) is None, name(i)))
    rows = max(len(columns["left"]) + bool(folded["left"]),
               len(columns["right"]) + bool(folded["right"]), 1)
    height = rows * (box_h + gap) + gap
    place: dict[object, tuple[float, float]] = {}
    nodes = []
    for column, x in (("left", 2.0), ("right", float(width - box_w - 2))):
        count = len(columns[column]) + bool(folded[column])
        top = (height - count * (box_h + gap) + gap) / 2
        for index, ident in enumerate(columns[column]):
            y = top + index * (box_h + gap)
            place[ident] = (x, y)
            known = stats.get(ident)
            word = communicator_state(known) if known else "other process"
            address = format_address(known.address) if known else "-"
            detail = ("not in this kernel" if known is None else
                      known.protocol.upper() + (f" {address}" if address != "-" else ""))
            nodes.append({"name": name(ident), "x": x, "y": round(y, 1),
                          "state": word.replace(" ", "-"),
                          "detail": f"{word} · {detail}" if known else word,
                          "outside": known is None})
        if folded[column]:
            y = top + len(columns[column]) * (box_h + gap)
            place[column] = (x, y)
            rate = sum(traffic[i] for i in folded[column])
            nodes.append({"name": f"+{len(folded[column])} more", "x": x,
                          "y": round(y, 1), "state": "more",
                          "detail": f"folded · {format_byte_rate(rate)}",
                          "outside": False})
    edges: dict[tuple[object, object], dict[str, Any]] = {}
    for link in snap.links:
        ends = [end if end in place else side.get(end, "left") for end in (link.a, link.b)]
        if ends[0] not in place or ends[1] not in place or ends[0] == ends[1]:
            continue
        figure = figures[(link.a, link.b)]
        key = (ends[0], ends[1])
        edge = edges.get(key)
        if edge is None:
            edge = edges[key] = {"rate": 0.0, "waiting": False, "connected": False,
                                 "links": 0, "names": (name(link.a),
                                                       name(link.b))}
        edge["rate"] += figure.bytes_per_s
        edge["waiting"] = edge["waiting"] or bool(link.blocked)
        edge["connected"] = edge["connected"] or link.state == "connected"
        edge["links"] += 1
    drawn = []
    for (first, second), edge in edges.items():
        (ax, ay), (bx, by) = place[first], place[second]
        x1, x2 = (ax + box_w, bx) if ax < bx else (ax, bx + box_w)
        rate = edge["rate"]
        tone = "waiting" if edge["waiting"] else "flowing" if edge["connected"] else "idle"
        label = format_byte_rate(rate)
        names = (f"{edge['links']} links" if edge["links"] > 1 else
                 f"{edge['names'][0]} ↔ {edge['names'][1]}")
        y1, y2 = ay + box_h / 2, by + box_h / 2
        # the label sits near the right-hand end, where lines fanning out of one box
        # have parted; an idle line carries none (its title still says 0 B/s)
        left_x, left_y, right_x, right_y = (x1, y1, x2, y2) if x1 < x2 else (x2, y2, x1, y1)
        drawn.append({"x1": round(x1, 1), "y1": round(y1, 1),
                      "x2": round(x2, 1), "y2": round(y2, 1),
                      "width": round(1.0 + min(6.0, math.log10(1 + rate / 1024)), 1),
                      "tone": tone, "label": label if rate > 0 else "",
                      "label_x": round(left_x + 0.72 * (right_x - left_x), 1),
                      "label_y": round(left_y + 0.72 * (right_y - left_y) - 3, 1),
                      "title": f"{names}: {label}" + ("; waiting" if edge["waiting"]
                                                      else "")})
    return {"width": width, "height": height, "box_w": box_w, "box_h": box_h,
            "nodes": nodes, "edges": drawn}
