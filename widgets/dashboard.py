"""The kernel-wide dashboard: every communicator of this kernel and every link between them.

``netq.widgets.dashboard()`` shows, at ``1 / interval`` Hz:

* a map: one box per communicator (servers on the left, clients on the right, peers in other
  processes in grey), one line per link, its width growing with the bytes per second it carries
  and red while its traffic waits;
* one row per communicator: role, transport, address, state, peers, rates, and its budgets in
  use (received and not yet taken out of the receive budget; memory held);
* one row per link (who talks to whom, in both directions, queues, credit);
* the stalls as they happen: which link waits, since when and why (the sentence
  ``statistics()`` gives and netq logs as a WARNING), and the last stalls that ended.

One thread (``netq-dashboard``) samples every communicator's ``statistics()``. It ends when no
communicator has been open for ``idle_stop`` seconds (at once once every communicator it saw has
closed, after showing them closed) or on :meth:`Dashboard.stop`. :meth:`Dashboard.to_html`
returns a standalone HTML page of the current snapshot (no script: the map is inline SVG), and
:meth:`Dashboard.save` writes it. Displayed in a notebook, the live widget is replaced by that
static form when the dashboard stops, so an executed notebook keeps a picture of it.
"""

from __future__ import annotations

import collections
import html
import logging
import math
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import ipywidgets

from ..communicator import live_communicators
from ..display import (
    STATE_COLOURS,
    STYLE,
    format_address,
    format_byte_rate,
    format_bytes,
    format_count,
    format_duration,
    title_state,
)
from ..statistics import CommunicatorStatistics, PeerStatistics
from .replaceable import ReplaceableView

__all__ = ("Dashboard", "dashboard", "Link", "Stall", "DashboardSnapshot")

LOGGER = logging.getLogger("netq.widgets")
DEFAULT_INTERVAL = 1.0  # seconds


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
    def state(self) -> str:
        row = self.a_row or self.b_row
        return "" if row is None else row.state


@dataclass
class Stall:
    """A link whose traffic waited: where, why, from when (``time.time()``) and for how long."""
    communicator: uuid.UUID
    peer: uuid.UUID
    reason: str
    started: float
    ended: float | None = None

    @property
    def seconds(self) -> float:
        return (self.ended if self.ended is not None else time.time()) - self.started


@dataclass
class DashboardSnapshot:
    """What one tick saw: each communicator's statistics (by id), the links, the stalls."""
    taken: float  # time.time()
    communicators: dict[uuid.UUID, CommunicatorStatistics] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    active_stalls: list[Stall] = field(default_factory=list)
    recent_stalls: list[Stall] = field(default_factory=list)


def find_links(stats: Mapping[uuid.UUID, CommunicatorStatistics]) -> list[Link]:
    """Pair the two ends of every connection between communicators of this kernel (a peer's
    id is the other end's communicator id); a peer in another process is a one-ended link."""
    links: dict[frozenset[uuid.UUID], Link] = {}
    for ident, snapshot in stats.items():
        for row in snapshot.peers:
            key = frozenset((ident, row.peer))
            if key in links:
                continue
            other = stats.get(row.peer)
            other_row = None
            if other is not None:
                other_row = next((r for r in other.peers if r.peer == ident), None)
            if snapshot.purpose == "client" and other is not None:
                links[key] = Link(row.peer, ident, other_row, row)
            else:
                links[key] = Link(ident, row.peer, row, other_row)
    return sorted(links.values(), key=lambda link: (str(link.a), str(link.b)))


class Dashboard(ReplaceableView):
    """A live view of every communicator in this kernel. Use :func:`dashboard`.

    ``interval``: seconds between samples. ``names``: display names by communicator id (or
    peer id, for peers in other processes); default: ``server 1a2b3c4d``. ``idle_stop``:
    seconds with no open communicator before the thread ends. ``history``: ended stalls kept.
    """

    def __init__(self, interval: float = DEFAULT_INTERVAL, *,
                 names: Mapping[uuid.UUID, str] | None = None, idle_stop: float = 30.0,
                 history: int = 10, start: bool | None = None) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive (seconds)")
        self.interval = interval
        self.names = names if names is not None else {}  # read at each tick: may grow
        self.idle_stop = idle_stop
        self.widget = ipywidgets.HTML(value="")
        self.widget.add_class("netq-dashboard")
        self._lock = threading.Lock()
        self._stalls: dict[tuple[uuid.UUID, uuid.UUID], Stall] = {}
        self._ended: collections.deque[Stall] = collections.deque(maxlen=history)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._stopped = False
        self.ticks = 0
        self.cpu_seconds = 0.0  # CPU time of the sampling thread (time.thread_time)
        self.wall_seconds = 0.0
        self.errors: collections.deque[BaseException] = collections.deque(maxlen=20)
        self.snapshot = self.sample()
        self.widget.value = self.render()
        if start:
            self.start()

    # -- sampling ----------------------------------------------------------------------------

    def sample(self) -> DashboardSnapshot:
        """Take one snapshot of every communicator (and update the stall log)."""
        stats: dict[uuid.UUID, CommunicatorStatistics] = {}
        for communicator in live_communicators():
            try:
                stats[communicator.id] = communicator.statistics()
            except Exception as error:  # noqa: BLE001 - one broken communicator hides none
                self.errors.append(error)
        now = time.time()
        seen = set()
        for ident, snapshot in stats.items():
            for row in snapshot.peers:
                if not row.blocked:
                    continue
                key = (ident, row.peer)
                seen.add(key)
                stall = self._stalls.get(key)
                if stall is None or stall.reason != row.blocked:
                    if stall is not None:
                        stall.ended = now
                        self._ended.appendleft(stall)
                    self._stalls[key] = Stall(ident, row.peer, row.blocked,
                                              now - row.blocked_for)
        for key in [key for key in self._stalls if key not in seen]:
            stall = self._stalls.pop(key)
            stall.ended = now
            self._ended.appendleft(stall)
        return DashboardSnapshot(now, stats, find_links(stats),
                                 sorted(self._stalls.values(), key=lambda s: s.started),
                                 list(self._ended))

    def update(self) -> None:
        """Sample and show (what the thread does each tick)."""
        with self._lock:
            self.snapshot = self.sample()
            self.widget.value = self.render()

    def start(self) -> Dashboard:
        """Start the sampling thread (idempotent)."""
        self._stopped = False
        if self.running:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="netq-dashboard", daemon=True)
        self._thread.start()
        self._show_live()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop sampling (the thread ends within one interval) and show the static form."""
        self._stopped = True
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self.update()
        self._show_static()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def cpu_fraction(self) -> float:
        """CPU time of the sampling thread / its wall-clock lifetime (1.0 = one core)."""
        return self.cpu_seconds / max(self.wall_seconds, 1e-9)

    def _run(self) -> None:
        cpu_start, wall_start = time.thread_time(), time.monotonic()
        idle_since: float | None = None
        seen_open = False
        try:
            while not self._stop.wait(self.interval):
                try:
                    self.update()
                except Exception as error:  # noqa: BLE001 - never print from a thread
                    self.errors.append(error)
                    LOGGER.debug("netq dashboard: %r", error, exc_info=error)
                self.ticks += 1
                self.cpu_seconds = time.thread_time() - cpu_start
                self.wall_seconds = time.monotonic() - wall_start
                states = [s.state for s in self.snapshot.communicators.values()]
                if any(state != "closed" for state in states):
                    seen_open, idle_since = True, None
                    continue
                now = time.monotonic()
                idle_since = idle_since if idle_since is not None else now
                if seen_open or now - idle_since >= self.idle_stop:
                    break
        finally:
            self._stop.set()
            self.cpu_seconds = time.thread_time() - cpu_start
            self.wall_seconds = time.monotonic() - wall_start
            try:
                self._show_static()
            except Exception as error:  # noqa: BLE001
                self.errors.append(error)

    # -- rendering ---------------------------------------------------------------------------

    def name(self, ident: uuid.UUID) -> str:
        """A communicator's (or outside peer's) display name."""
        given = self.names.get(ident)
        if given is not None:
            return given
        snapshot = self.snapshot.communicators.get(ident) if hasattr(self, "snapshot") \
            else None
        if snapshot is None:
            return f"peer {str(ident)[:8]}"
        return f"{snapshot.purpose} {str(ident)[:8]}"

    def render(self) -> str:
        """The dashboard as HTML (title, map, communicators, links, stalls); no script."""
        snap = self.snapshot
        escape = html.escape
        stats = snap.communicators
        open_count = sum(1 for s in stats.values() if s.state != "closed")
        state = ("stopped" if self._stopped and open_count else
                 "open" if open_count else "closed")
        colour = STATE_COLOURS.get(state, "#616161")
        total = sum(link.bytes_per_s for link in snap.links)
        parts = [STYLE, _DASHBOARD_STYLE, '<div class="netq-summary netq-dashboard-view">',
                 '<div class="netq-title"><span class="netq-role">netq dashboard</span>',
                 f'<span class="netq-badge netq-state-{state}" style="background:{colour}">'
                 f'{state}</span>',
                 f'<span class="netq-fact">{len(stats)} communicator'
                 f'{"" if len(stats) == 1 else "s"} ({open_count} open)</span>',
                 f'<span class="netq-fact">{len(snap.links)} link'
                 f'{"" if len(snap.links) == 1 else "s"}, {format_byte_rate(total)}</span>',
                 f'<span class="netq-fact">{len(snap.active_stalls)} waiting</span>',
                 f'<span class="netq-fact">at {_clock(snap.taken)}</span></div>']
        if not stats:
            parts.append('<div class="netq-note">No communicator in this kernel yet: '
                         'create one with netq.new(...) and this view lists it.</div></div>')
            return "".join(parts)
        parts.append(self._map_svg())
        parts.append('<table class="netq-table"><thead><tr><th>communicator</th><th>transport'
                     '</th><th>address</th><th class="state">state</th><th>peers</th>'
                     '<th>in msg/s</th><th>in</th><th>out msg/s</th><th>out</th>'
                     '<th>received, not taken</th><th>memory held</th></tr></thead><tbody>')
        for ident, snapshot in stats.items():
            word = title_state(snapshot)
            badge = (f'<span class="netq-badge" style="background:'
                     f'{STATE_COLOURS.get(word, "#616161")}">{escape(word)}</span>')
            parts.append(
                f'<tr class="communicator" data-id="{ident}"><td>{escape(self.name(ident))}</td>'
                f'<td>{escape(snapshot.protocol.upper())}</td>'
                f'<td>{escape(format_address(snapshot.address))}</td>'
                f'<td class="state">{badge}</td><td>{len(snapshot.peers)}</td>'
                f'<td>{format_count(snapshot.messages_in_per_s)}</td>'
                f'<td>{format_byte_rate(snapshot.bytes_in_per_s)}</td>'
                f'<td>{format_count(snapshot.messages_out_per_s)}</td>'
                f'<td>{format_byte_rate(snapshot.bytes_out_per_s)}</td>'
                f'<td>{_budget_bar(snapshot.recv_held, snapshot.recv_budget)}</td>'
                f'<td>{_budget_bar(snapshot.memory, snapshot.recv_budget + snapshot.send_budget)}'
                f'</td></tr>')
        parts.append("</tbody></table>")
        if snap.links:
            parts.append('<table class="netq-table netq-links"><thead><tr><th>link</th>'
                         '<th class="state">state</th><th>→ msg/s</th><th>→</th>'
                         '<th>← msg/s</th><th>←</th><th>messages → / ←</th>'
                         '<th>queued → / ←</th><th>credit →</th>'
                         '<th class="state">waiting</th></tr></thead><tbody>')
            for link in snap.links:
                row = link.a_row
                forward = (row.messages_out_per_s, row.bytes_out_per_s) if row else \
                    (link.b_row.messages_in_per_s, link.b_row.bytes_in_per_s) if link.b_row \
                    else (math.nan, math.nan)
                back = (row.messages_in_per_s, row.bytes_in_per_s) if row else \
                    (link.b_row.messages_out_per_s, link.b_row.bytes_out_per_s) if link.b_row \
                    else (math.nan, math.nan)
                queued = (f"{row.queue_out} / {row.queue_in}" if row else
                          f"{link.b_row.queue_in} / {link.b_row.queue_out}" if link.b_row
                          else "-")
                credit = format_bytes(row.credit_out) if row else "-"
                totals = (f"{format_count(row.messages_out)} / {format_count(row.messages_in)}"
                          if row else f"{format_count(link.b_row.messages_in)} / "
                          f"{format_count(link.b_row.messages_out)}" if link.b_row else "-")
                kind = "link blocked" if link.blocked else "link"
                parts.append(
                    f'<tr class="{kind}" data-a="{link.a}" data-b="{link.b}">'
                    f'<td>{escape(self.name(link.a))} → {escape(self.name(link.b))}</td>'
                    f'<td class="state">{escape(link.state)}</td>'
                    f'<td>{format_count(forward[0])}</td><td>{format_byte_rate(forward[1])}</td>'
                    f'<td>{format_count(back[0])}</td><td>{format_byte_rate(back[1])}</td>'
                    f'<td>{totals}</td><td>{queued}</td><td>{credit}</td>'
                    f'<td class="state">{escape(link.blocked) or "-"}</td></tr>')
            parts.append("</tbody></table>")
        parts.append(self._stalls_html())
        parts.append("</div>")
        return "".join(parts)

    def _stalls_html(self) -> str:
        escape = html.escape
        snap = self.snapshot
        if not snap.active_stalls and not snap.recent_stalls:
            return '<div class="netq-note">No stalls: every link\'s traffic flows.</div>'
        parts = ['<div class="netq-stalls">']
        for stall in snap.active_stalls:
            parts.append(f'<div class="netq-waits">waiting {format_duration(stall.seconds)}: '
                         f'{escape(self.name(stall.communicator))} → '
                         f'{escape(self.name(stall.peer))}: {escape(stall.reason)}</div>')
        for stall in snap.recent_stalls:
            when = _clock(stall.started)
            parts.append(f'<div class="netq-note">ended, {when} for '
                         f'{format_duration(stall.seconds)}: '
                         f'{escape(self.name(stall.communicator))} → '
                         f'{escape(self.name(stall.peer))}: {escape(stall.reason)}</div>')
        parts.append("</div>")
        return "".join(parts)

    def _map_svg(self) -> str:
        """Servers left, clients right, outside peers grey; a line per link."""
        escape = html.escape
        snap = self.snapshot
        stats = snap.communicators
        left = [i for i, s in stats.items() if s.purpose == "server"]
        right = [i for i, s in stats.items() if s.purpose != "server"]
        outside_left: list[uuid.UUID] = []
        outside_right: list[uuid.UUID] = []
        for link in snap.links:
            for end, other in ((link.a, link.b), (link.b, link.a)):
                if end in stats:
                    continue
                side = outside_right if stats[other].purpose == "server" else outside_left
                if end not in side:
                    side.append(end)
        left_nodes, right_nodes = left + outside_left, right + outside_right
        rows = max(len(left_nodes), len(right_nodes), 1)
        width, box_w, box_h, gap = 640, 170, 30, 10
        height = rows * (box_h + gap) + gap
        place: dict[uuid.UUID, tuple[float, float]] = {}

        def column(nodes: list[uuid.UUID], x: float) -> None:
            offset = (height - len(nodes) * (box_h + gap) + gap) / 2
            for index, node in enumerate(nodes):
                place[node] = (x, offset + index * (box_h + gap))

        column(left_nodes, 4)
        column(right_nodes, width - box_w - 4)
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="netq-map" width="{width}" '
               f'height="{height}" font-family="sans-serif" font-size="11">']
        for link in snap.links:
            if link.a not in place or link.b not in place:
                continue
            (ax, ay), (bx, by) = place[link.a], place[link.b]
            ax_end = ax + box_w if ax < bx else ax
            bx_end = bx if ax < bx else bx + box_w
            rate = link.bytes_per_s
            stroke = 1.0 + min(6.0, math.log10(1 + rate / 1024)) if rate > 0 else 1.0
            colour = "#c62828" if link.blocked else "#888" if link.state != "connected" \
                else "#2e7d32"
            dash = ' stroke-dasharray="4 3"' if link.state != "connected" else ""
            y1, y2 = ay + box_h / 2, by + box_h / 2
            why = f"; {escape(link.blocked)}" if link.blocked else ""
            out.append(f'<line x1="{ax_end:.0f}" y1="{y1:.0f}" x2="{bx_end:.0f}" y2="{y2:.0f}" '
                       f'stroke="{colour}" stroke-width="{stroke:.1f}"{dash}><title>'
                       f'{escape(self.name(link.a))} ↔ {escape(self.name(link.b))}: '
                       f'{format_byte_rate(rate)}{why}</title></line>')
            out.append(f'<text x="{(ax_end + bx_end) / 2:.0f}" y="{(y1 + y2) / 2 - 3:.0f}" '
                       f'text-anchor="middle" fill="{colour}">{format_byte_rate(rate)}</text>')
        for node, (x, y) in place.items():
            snapshot = stats.get(node)
            word = title_state(snapshot) if snapshot is not None else "other process"
            fill = STATE_COLOURS.get(word, "#9e9e9e")
            label = self.name(node)
            address = format_address(snapshot.address) if snapshot is not None else "-"
            detail = ("not in this kernel" if snapshot is None else snapshot.protocol.upper()
                      + (f" {address}" if address != "-" else ""))
            out.append(f'<rect x="{x:.0f}" y="{y:.0f}" width="{box_w}" height="{box_h}" rx="4" '
                       f'fill="#fff" stroke="{fill}" stroke-width="2"/>'
                       f'<rect x="{x:.0f}" y="{y:.0f}" width="5" height="{box_h}" fill="{fill}"/>'
                       f'<text x="{x + 10:.0f}" y="{y + 12:.0f}" font-weight="600">'
                       f'{escape(label[:24])}</text>'
                       f'<text x="{x + 10:.0f}" y="{y + 25:.0f}" fill="#555" font-size="10">'
                       f'{escape(word)} · {escape(detail[:26])}</text>')
        out.append("</svg>")
        return "".join(out)

    # -- static export and display -------------------------------------------------------

    def to_html(self) -> str:
        """A standalone HTML page of the current snapshot (no script, no network)."""
        return ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>netq dashboard'
                f'</title></head><body>{self.render()}</body></html>')

    def save(self, path) -> None:
        """Write :meth:`Dashboard.to_html` to ``path`` (UTF-8)."""
        with open(path, "w", encoding="utf-8") as file:
            file.write(self.to_html())

    def __repr__(self) -> str:
        snap = self.snapshot
        lines = [f"netq dashboard: {len(snap.communicators)} communicators, "
                 f"{len(snap.links)} links, {len(snap.active_stalls)} waiting"]
        for ident, snapshot in snap.communicators.items():
            lines.append(f"  {self.name(ident)}: {snapshot.summary()}")
        lines.extend(f"  ! {self.name(s.communicator)} -> {self.name(s.peer)}: {s.reason}"
                     for s in snap.active_stalls)
        return "\n".join(lines)

    def static_bundle(self) -> dict[str, str]:
        return {"text/plain": repr(self), "text/html": self.render()}

    def _live_bundle(self) -> dict:
        bundle = self.widget._repr_mimebundle_() or {}
        bundle.update(self.static_bundle())
        return bundle


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def _budget_bar(used: int, budget: int) -> str:
    """``1.5 MiB of 64 MiB`` with a small bar (red past 90 %)."""
    if budget <= 0:
        return format_bytes(used)
    fraction = min(1.0, max(0.0, used / budget))
    colour = "#c62828" if fraction > 0.9 else "#1565c0"
    return (f'<span class="netq-bar"><span style="width:{fraction * 100:.0f}%;'
            f'background:{colour}"></span></span>{format_bytes(used)} of {format_bytes(budget)}')


_DASHBOARD_STYLE = ("<style>.netq-bar{display:inline-block;width:50px;height:7px;"
                    "background:#e0e0e0;margin-right:5px;vertical-align:middle}"
                    ".netq-bar span{display:block;height:7px}"
                    ".netq-map{display:block;margin:4px 0 8px}"
                    ".netq-dashboard-view{max-width:none}"
                    ".netq-links{margin-top:8px}"
                    ".netq-links tr.blocked td{background:#fde2e1}"
                    ".netq-links td.state{max-width:360px;white-space:normal;text-align:left}"
                    ".netq-stalls{margin-top:6px}</style>")


def dashboard(interval: float = DEFAULT_INTERVAL, **options) -> Dashboard:
    """A live view of every communicator in this kernel and the links between them.

    Display it (a cell's last expression); ``.stop()`` ends its thread, ``.save(path)``
    writes a static HTML snapshot. Options: see :class:`Dashboard`.
    """
    return Dashboard(interval, **options)
