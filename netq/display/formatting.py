"""Numbers as people read them: counts, rates, bytes, addresses, durations, axis ticks.

One unit convention everywhere: binary (KiB = 1024 B, MiB = 1024 KiB), for memory, credit and
rates alike (MiB/s), so that a rate and a budget can be compared at a glance. Every function
takes a plain number (or an address) and returns the text a table, a title or a tick shows.
"""

from __future__ import annotations

import re

# format_bytes is the engine's diagnostics' own formatter (their log lines and the views must
# read alike); it is re-exported here so that display callers find every formatter in one place.
from ..diagnostics import format_bytes

__all__ = ("MiB", "format_count", "format_rate", "format_bytes", "format_byte_rate",
           "format_address", "format_duration", "format_uptime", "format_tick_bytes")

#: Bytes in a MiB, as a float: the rate columns divide bytes/s by it to show MiB/s.
MiB = float(1 << 20)


def format_count(value: float) -> str:
    """A message count or rate with a k/M/G suffix: ``950``, ``12.3k``, ``1.20M``."""
    value = float(value)
    if value != value:  # NaN
        return "-"
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            number = value / scale
            return f"{number:.2f}{suffix}" if abs(number) < 10 else f"{number:.1f}{suffix}"
    return f"{value:.0f}"


def format_rate(value: float) -> str:
    """A rate already divided by its unit (MiB/s), two significant decimals near zero."""
    value = float(value)
    if value != value:
        return "-"
    if value == 0:
        return "0"
    if abs(value) < 10:
        return f"{value:.2f}"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"


def format_byte_rate(value: float) -> str:
    """Bytes per second, auto-scaled: ``0 B/s``, ``512 B/s``, ``2.38 MiB/s``."""
    return f"{format_bytes(value)}/s" if value == value else "-"


def format_address(address: object) -> str:
    """An address as people write it: ``127.0.0.1:44503``, ``[::1]:80``, a Unix socket's path.

    Accepts what transports report: a ``(host, port[, flow, scope])`` tuple, its ``str()``
    (``"('127.0.0.1', 44503)"``), a path, or any other text (returned as is).
    """
    if address is None or address in ("None", ""):
        return "-"  # not bound or connected (yet, or any more)
    if isinstance(address, str):
        match = _TUPLE.fullmatch(address.strip())
        if match is None:
            return address
        host, port = match.group(1), int(match.group(2))
    elif isinstance(address, tuple) and len(address) >= 2:
        host, port = str(address[0]), int(address[1])
    else:
        return str(address)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_TUPLE = re.compile(r"\(\s*'([^']*)'\s*,\s*(\d+)\s*(?:,[^)]*)?\)")


def format_duration(seconds: float) -> str:
    """``4.2 s``, ``3 min 12 s``, ``2 h 05 min``."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def format_uptime(seconds: float) -> str:
    """A clock that moves at every 2 Hz sample: ``4.2 s``, ``3 min 12.5 s``, ``2 h 05 min 12.5 s``
    (:func:`format_duration` rounds to whole seconds and minutes past the first minute)."""
    seconds = round(max(0.0, float(seconds)), 1)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes:.0f} min {rest:04.1f} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours:.0f} h {minutes:02.0f} min {rest:04.1f} s"


def format_tick_bytes(value: float) -> str:
    """A byte tick with no needless decimals: ``0``, ``512 B``, ``256 KiB``, ``1.5 MiB``."""
    if value == 0:
        return "0"
    for suffix, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)):
        if abs(value) >= scale or suffix == "B":
            return f"{value / scale:.3g} {suffix}"
    raise AssertionError("unreachable")
