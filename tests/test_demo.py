"""The README's first command: python -m netq demo."""

import io
import subprocess
import sys
import uuid

import pytest

from netq import demo
from netq.statistics import PeerStatistics, RateMeter


@pytest.mark.parametrize("protocol", ["tcp", "unix", "mqtt", "grpc"])
def test_demo_moves_traffic_and_loses_nothing(protocol):
    out = io.StringIO()
    summary = demo.run(clients=3, seconds=1.5, interval=0.5, protocol=protocol, out=out)
    assert summary["received"] == summary["sent"] > 0
    assert summary["problems"] == []
    text = out.getvalue()
    assert "client-0" in text and "summary:" in text and "lost 0" in text


def test_demo_command_line_exits_zero():
    result = subprocess.run([sys.executable, "-m", "netq", "demo", "--seconds", "1",
                             "--clients", "2"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "summary:" in result.stdout


def test_usage_and_unknown_command():
    for argv in ([], ["nope"]):
        run = subprocess.run([sys.executable, "-m", "netq", *argv], capture_output=True)
        assert run.returncode == 2, argv


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
