"""netq/display/formatting.py: numbers, addresses and durations as people read them."""

from __future__ import annotations

from netq.display.formatting import (
    format_address,
    format_byte_rate,
    format_bytes,
    format_count,
    format_duration,
    format_rate,
    format_tick_bytes,
    format_uptime,
)


def test_formatters():
    assert format_count(950) == "950"
    assert format_count(12345) == "12.3k" and format_count(1.2e6) == "1.20M"
    assert format_rate(0) == "0" and format_rate(2.5) == "2.50"
    assert format_rate(123.4) == "123"
    assert format_bytes(0) == "0 B" and format_bytes(65536) == "64.0 KiB"
    assert format_bytes(4 << 20) == "4.00 MiB"
    assert format_count(float("nan")) == "-"


def test_addresses_durations_and_rates_read_as_people_write_them():
    assert format_address("('127.0.0.1', 44503)") == "127.0.0.1:44503"
    assert format_address(("::1", 80, 0, 0)) == "[::1]:80"
    assert format_address("('::1', 80, 0, 0)") == "[::1]:80"
    assert format_address("/tmp/netq.sock") == "/tmp/netq.sock"
    assert format_address(None) == "-"
    assert format_duration(4.24) == "4.2 s"
    assert format_duration(192) == "3 min 12 s"
    assert format_duration(7500) == "2 h 05 min"
    assert format_uptime(192.5) == "3 min 12.5 s"
    assert format_uptime(7512.5) == "2 h 05 min 12.5 s"
    assert format_byte_rate(2.5 * (1 << 20)) == "2.50 MiB/s"
    assert format_byte_rate(512) == "512 B/s"


def test_byte_ticks_carry_no_needless_decimals():
    assert format_tick_bytes(0) == "0"
    assert format_tick_bytes(512) == "512 B"
    assert format_tick_bytes(256 << 10) == "256 KiB"
    assert format_tick_bytes(1.5 * (1 << 20)) == "1.5 MiB"
