"""The README's first command, ``python -m netq demo``, and the command line around it.

The demo runs for real (a server and clients on loopback, every transport this machine has);
the command line is run as a subprocess, the way a newcomer types it, and once on a real
pseudo-terminal to see the live table redrawn in place.
"""

import fcntl
import io
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
import uuid

import pytest

import netq
from netq import transports
from netq.lab import demo
from netq.statistics import PeerStatistics, RateMeter

ANSI = re.compile(r"\x1b\[")


def netq_command(*args: str, timeout: float = 120, code: str | None = None):
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "netq", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


# ============================================================================ the demo itself


@pytest.mark.parametrize("protocol", demo.protocols())
def test_demo_moves_traffic_and_loses_nothing(protocol):
    if demo.missing(protocol):
        pytest.skip(f"{protocol}: {demo.missing(protocol)}")
    out = io.StringIO()  # not a terminal: plain lines
    try:
        summary = demo.run(clients=3, seconds=1.5, interval=0.5, protocol=protocol, out=out)
    except demo.Unavailable as why:  # mqtt: neither mosquitto nor amqtt can be had here
        pytest.skip(str(why))
    assert summary["received"] == summary["sent"] > 0
    assert summary["acknowledged"] == summary["sent"] and summary["failed"] == 0
    assert summary["problems"] == []
    text = out.getvalue()
    first = text.splitlines()[0]
    assert first.startswith("netq demo: a server and 3 clients") and protocol in first.lower()
    if protocol == "mqtt":  # which broker it ran through, on the next line
        assert text.splitlines()[1].startswith("MQTT broker: ")
    assert "puts messages of 64 B to 1 MiB" in first and "replies to every 100th" in first
    assert len(re.findall(r"^ *\d+\.\d s  \d of 3 clients connected", text, re.MULTILINE)) >= 2
    assert "client-0" in text and "credit in" in text  # the final table
    assert "may go below zero by up to one message" in text  # the legend
    assert "acknowledged deliveries (the server's netq confirmed receipt)" in text
    assert "receipts" not in text and "lost 0" in text
    assert not ANSI.search(text) and "widen" not in text and "wider terminal" not in text


def test_demo_redirected_to_a_file_is_plain(tmp_path):
    target = tmp_path / "demo.txt"
    with open(target, "w") as out:
        result = subprocess.run([sys.executable, "-m", "netq", "demo", "--seconds", "1.2",
                                 "--clients", "2", "--interval", "0.4"], stdout=out,
                                stderr=subprocess.PIPE, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = target.read_text()
    assert text.startswith("netq demo: a server and 2 clients")
    assert "\x1b" not in text and "terminal" not in text
    assert "summary:" in text and "lost 0, out of order 0, failed deliveries 0" in text


def test_demo_on_a_terminal_redraws_one_table_in_place():
    """A real pseudo-terminal, 80 columns: the table wraps and is redrawn over itself."""
    controller, terminal = os.openpty()
    try:
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 80, 0, 0))
        process = subprocess.Popen(
            [sys.executable, "-m", "netq", "demo", "--seconds", "1.5", "--clients", "2"],
            stdin=subprocess.DEVNULL, stdout=terminal, stderr=subprocess.PIPE)
        os.close(terminal)
        terminal = None
        output = bytearray()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 1)
            if not ready:
                continue
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
        assert process.wait(timeout=30) == 0, process.stderr.read()
        process.stderr.close()
    finally:
        os.close(controller)
        if terminal is not None:
            os.close(terminal)
    text = output.decode().replace("\r\n", "\n")
    assert text.startswith("netq demo: a server and 2 clients")
    assert text.index("credit out  bytes the client still lets") < text.index("\nclient-0 ")
    assert "a wider terminal shows it unwrapped" in text  # said once, on a terminal only
    assert text.count("wider terminal") == 1
    # Each redraw moves up exactly the rows the previous table took at 80 columns.
    parts = re.split(r"\x1b\[(\d+)F\x1b\[J", text)
    assert len(parts) >= 5, text  # at least three tables
    tables = [parts[0][parts[0].index("netq server"):], *parts[2::2]]
    for table, rows in zip(tables, parts[1::2], strict=False):
        lines = table.rstrip("\n").split("\n")
        assert int(rows) == sum(max(1, -(-len(line) // 80)) for line in lines), table
        assert not any(line.startswith("summary:") for line in lines)
    assert "summary:" in text and "lost 0" in text


# ============================================================================ command line


def test_help_lists_the_demo_with_the_same_options_as_its_own_help():
    top = netq_command("--help")
    assert top.returncode == 0, top.stderr
    sub = netq_command("demo", "--help")
    assert sub.returncode == 0, sub.stderr
    choices = "{" + ",".join(demo.protocols()) + "}"
    # Every transport netq ships (the engine tests register an in-memory one of their own).
    assert set(demo.protocols()) == set(transports.available())
    assert choices in sub.stdout and choices in top.stdout
    assert "demo" in top.stdout and demo.SUMMARY.split()[0] in top.stdout
    # the demo's usage line appears in both, word for word
    usage = " ".join(sub.stdout.split("\n\n")[0].removeprefix("usage: ").split())
    assert usage in " ".join(top.stdout.split())
    for text in (top.stdout, sub.stdout):
        assert "``" not in text and ":mod:" not in text and ":func:" not in text
    assert "--version" in top.stdout


def test_version():
    result = netq_command("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"netq {netq.__version__} (from ")
    assert os.path.dirname(netq.__file__) in result.stdout


def test_usage_and_unknown_command():
    bare = netq_command()
    assert bare.returncode == 2 and "usage: python -m netq" in bare.stderr
    unknown = netq_command("nope")
    assert unknown.returncode == 2 and "invalid choice: 'nope'" in unknown.stderr
    wrong = netq_command("demo", "--protocol", "carrier-pigeon")
    assert wrong.returncode == 2 and "invalid choice" in wrong.stderr


def test_a_missing_dependency_is_named_in_help_and_at_run_time():
    # sys.modules[name] = None is how Python marks a module as not importable.
    code = ("import sys; sys.modules['grpc'] = None; from netq.__main__ import main; "
            "raise SystemExit(main(sys.argv[1:]))")
    run = netq_command("demo", "--protocol", "grpc", code=code)
    assert run.returncode == 2
    assert run.stderr.strip() == ("netq demo: --protocol grpc cannot run here: grpcio is not "
                                  "installed: pip install 'netq[grpc]'")
    helped = " ".join(netq_command("demo", "--help", code=code).stdout.split())
    assert "Not usable here: grpc: grpcio is not installed" in helped
    assert "mqtt:" not in helped.partition("Not usable here:")[2]  # amqtt stands in for mosquitto


def test_render_shows_one_row_per_peer():
    peer = uuid.uuid4()
    row = PeerStatistics(peer=peer, state="connected", queue_in=3, queue_in_bytes=30,
                         queue_out=1, queue_out_bytes=10, inflight=0, inflight_bytes=0,
                         messages_in=5, bytes_in=50, messages_out=1, bytes_out=10,
                         credit_out=100, credit_in=200, memory=40, reconnects=0,
                         connected_for=1.0, messages_in_per_s=0, bytes_in_per_s=0,
                         messages_out_per_s=0, bytes_out_per_s=0)
    stats = RateMeter().snapshot(now=1.0, peers=[row], closed_totals=(0, 0, 0, 0),
                                 id=uuid.uuid4(), purpose="server", protocol="tcp",
                                 address="127.0.0.1:1", state="open", uptime=1.0)
    text = demo.render(stats, {peer: "alpha"})
    assert "alpha" in text and "connected" in text
    assert stats.messages_in == 5 and stats.memory == 40
    line = demo.progress_line(1.0, stats, clients=2, acknowledged=7)
    assert "1 of 2 clients connected" in line and "acknowledged deliveries so far 7" in line
