"""What the tutorial notebooks share: reading measurements honestly, an SVG bar chart, and a
live traffic demo.

* :func:`rounded` and :func:`median_and_spread`: a measured figure to 2-3 significant digits,
  and the median of repeated runs with their range, so a cell never quotes noise as a digit.
* :func:`verdict`: the sentence a ratio supports, with a tolerance band: inside it, no winner.
* :func:`log_ticks`: the 1-2-5 values between two bounds, for readable log-scale axes.
* :func:`bar_chart`: an inline SVG bar chart with a reference line (no plotting library).
* :class:`LiveTraffic`: a server and a few clients on loopback with light traffic that keeps
  flowing by itself, shown in the server's live monitor, bounded in time.

Nothing here is needed to send a message; the notebooks import it (``from netq.lab.notebook
import ...``) so that their cells show what they measure rather than how they draw it.
"""

from __future__ import annotations

import html
import math
import statistics
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import new
from ..exceptions import Empty
from ..options import CommunicatorOptions, NetworkLocation, Protocol, Purpose

if TYPE_CHECKING:
    from ..communicator import Communicator

__all__ = ("rounded", "median_and_spread", "verdict", "log_ticks", "bar_chart", "LiveTraffic")


def rounded(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, with thousands separators and no exponent:
    ``rounded(1557023.4) == "1,560,000"``, ``rounded(0.012345, 2) == "0.012"``."""
    if digits < 1:
        raise ValueError(f"digits must be at least 1, got {digits}")
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    exponent = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - exponent)
    return f"{round(value, digits - 1 - exponent):,.{decimals}f}"


def median_and_spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, lowest, highest) of repeated measurements of one thing."""
    if not values:
        raise ValueError("no measurements")
    return statistics.median(values), min(values), max(values)


def verdict(ratio: float, *, above: str, below: str, tolerance: float = 0.10,
            rounds: Sequence[float] = ()) -> str:
    """What ``ratio`` (a / b, measured) supports: ``above`` when it exceeds 1 + ``tolerance``,
    ``below`` when it is under 1 - ``tolerance``, otherwise that neither is clearly ahead.

    ``tolerance`` is the band the run's noise can produce (0.10: ±10 %); inside it a cell must
    not call a winner. ``rounds``, the ratio of each repeated round (``ratio`` being their
    median), withholds the verdict too when some rounds fall on either side of 1. The answer
    starts with the ratio to 2 decimals (what the band is judged on shows)."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    if not ratio > 0:
        raise ValueError(f"a ratio of two measurements is positive, got {ratio}")
    if rounds and min(rounds) < 1 < max(rounds) and abs(ratio - 1) > tolerance:
        outcome = "no clear difference: the rounds fall on both sides of 1"
    elif ratio > 1 + tolerance:
        outcome = above
    elif ratio < 1 - tolerance:
        outcome = below
    else:
        outcome = f"within ±{100 * tolerance:g} %: no clear difference"
    return f"{ratio:.2f}x, {outcome}"


def log_ticks(low: float, high: float) -> list[float]:
    """The 1-2-5 values (…, 1, 2, 5, 10, 20, …) between ``low`` and ``high`` (both > 0), for a
    log-scale axis whose every point has a labelled tick near it."""
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, got {low}, {high}")
    ticks, decade = [], 10.0 ** math.floor(math.log10(low))
    while decade <= high:
        ticks += [float(f"{step * decade:.12g}") for step in (1, 2, 5)
                  if low <= step * decade <= high]
        decade *= 10
    return ticks


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], *, y_label: str,
              x_label: str, reference: tuple[str, float], y_max: float | None = None,
              colour: str = "#1f77b4", width: int = 660, height: int = 250) -> str:
    """An inline SVG bar chart (a string for ``IPython.display.HTML``): one bar per label,
    y ticks at 1-2-5 steps, axis titles, a dashed red line at ``reference = (legend, value)``
    and a legend under the plot area, outside the bars. ``y_max`` defaults to 1.15 times the
    largest of the values and the reference. Every text is HTML-escaped."""
    if len(labels) != len(values) or not labels:
        raise ValueError(f"need one value per label, got {len(labels)} labels and "
                         f"{len(values)} values")
    left, right, top, bottom = 56, 10, 26, 62
    inner_w, inner_h = width - left - right, height - top - bottom
    y_max = y_max or 1.15 * max(*values, reference[1])
    step = next(s * 10.0 ** e for e in range(-3, 16) for s in (1, 2, 5)
                if y_max / (s * 10.0 ** e) <= 6)  # 1-2-5 steps, at most 6 of them

    def y(value: float) -> float:
        return top + inner_h * (1 - value / y_max)

    slot = inner_w / len(labels)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="10">',
           f'<text x="{left}" y="14" font-size="12" font-weight="600">{html.escape(title)}</text>']
    for n in range(int(y_max / step + 1e-9) + 1):
        tick = n * step
        out.append(f'<line x1="{left - 4}" x2="{left + inner_w}" y1="{y(tick):.1f}" '
                   f'y2="{y(tick):.1f}" stroke="#e4e4e4"/><text x="{left - 6}" '
                   f'y="{y(tick) + 3:.1f}" text-anchor="end">{tick:g}</text>')
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        x = left + i * slot
        out.append(f'<rect x="{x + 0.15 * slot:.1f}" y="{y(value):.1f}" width="{0.7 * slot:.1f}" '
                   f'height="{y(0) - y(value):.1f}" fill="{colour}"><title>'
                   f'{html.escape(label)}: {value:g}</title></rect><text x="{x + slot / 2:.1f}" '
                   f'y="{top + inner_h + 12}" text-anchor="middle" font-size="9">'
                   f'{html.escape(label)}</text>')
    out.append(f'<line x1="{left}" x2="{left + inner_w}" y1="{y(reference[1]):.1f}" '
               f'y2="{y(reference[1]):.1f}" stroke="#d62728" stroke-dasharray="5 3"/>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + inner_h}" stroke="#666"/>'
               f'<line x1="{left}" x2="{left + inner_w}" y1="{top + inner_h}" '
               f'y2="{top + inner_h}" stroke="#666"/>')
    out.append(f'<text x="{left + inner_w / 2}" y="{top + inner_h + 28}" text-anchor="middle">'
               f'{html.escape(x_label)}</text><text transform="translate(14 {top + inner_h / 2}) '
               f'rotate(-90)" text-anchor="middle">{html.escape(y_label)}</text>')
    legend_y = height - 10
    out.append(f'<rect x="{left}" y="{legend_y - 8}" width="12" height="9" fill="{colour}"/>'
               f'<text x="{left + 16}" y="{legend_y}">{html.escape(y_label)}</text>'
               f'<line x1="{left + 200}" x2="{left + 224}" y1="{legend_y - 4}" y2="{legend_y - 4}" '
               f'stroke="#d62728" stroke-dasharray="5 3"/><text x="{left + 230}" y="{legend_y}">'
               f'{html.escape(reference[0])}</text>')
    return "".join(out) + "</svg>"


class LiveTraffic:
    """A TCP server and ``clients`` clients on loopback with light traffic, in a live monitor.

    Every ``tick`` seconds client ``n`` (named ``live-n``) puts ``n + 1`` messages of ``size``
    bytes and the server takes whatever arrived, on one background thread. After ``minutes``
    (or at :meth:`stop`) that thread closes the clients and the server and stops the monitor,
    whose view then shows its static snapshot. ``timeout`` (seconds) bounds each close.
    """

    def __init__(self, minutes: float = 10.0, clients: int = 3, tick: float = 0.05,
                 size: int = 2048, timeout: float = 20.0) -> None:
        if minutes <= 0 or clients < 1 or tick <= 0 or size < 0:
            raise ValueError("LiveTraffic needs minutes > 0, clients >= 1, tick > 0, size >= 0")
        self.timeout = timeout
        self.server: Communicator = new(Protocol.TCP, Purpose.SERVER, CommunicatorOptions(
            netloc=NetworkLocation("127.0.0.1", 0)))
        self.clients: list[Communicator] = []
        try:
            where = NetworkLocation("127.0.0.1", self.server.address[1])
            for _ in range(clients):  # options of its own each: a fresh client id
                self.clients.append(new(Protocol.TCP, Purpose.CLIENT,
                                        CommunicatorOptions(netloc=where)))
            self.names = {c.id: f"live-{n}" for n, c in enumerate(self.clients)}
            self.monitor = self.server.monitor(names=self.names)  # netq.display's live monitor
            self.monitor.start()  # sampling from now on, before it is displayed
        except BaseException:
            self._close_all()
            raise
        self.tick, self.payload = tick, bytes(size)
        self.received = 0  # messages the server took so far
        self.ends_at = time.time() + 60 * minutes  # wall-clock time the traffic stops by itself
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(60 * minutes,),
                                        name="netq-lab-live-traffic", daemon=True)
        self._thread.start()

    def _close_all(self) -> None:
        for client in self.clients:
            client.close(timeout=self.timeout)
        self.server.close(timeout=self.timeout)

    def _run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while not self._stop.wait(self.tick) and time.monotonic() < deadline:
                for n, client in enumerate(self.clients):
                    for _ in range(n + 1):
                        client.put(self.payload)
                while True:
                    try:
                        self.server.get_nowait()
                    except Empty:
                        break
                    self.received += 1
        finally:
            self._close_all()
            self.monitor.stop()  # the view turns into its static snapshot

    @property
    def running(self) -> bool:
        """Whether the traffic still flows (False once :meth:`stop` or the time limit ended it)."""
        return self._thread.is_alive()

    def stop(self) -> int:
        """Stop the traffic now, close everything, leave the static snapshot; returns how many
        messages the server received. Waits at most three times ``timeout`` for the thread."""
        self._stop.set()
        self._thread.join(3 * self.timeout)
        return self.received
