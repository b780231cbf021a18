"""net-queue's iops scenarios (``bench/iops.py``) have a raw-socket floor.

The floor (``--lib raw``, ``bench/workers/raw_iops.py``) runs the scenario end to end over one
blocking socket per side, both modes, and every message arrives with its bytes counted (the
report's division by it: ``tests/test_bench_report.py``). No speed is asserted:
``bench/run.py`` measures.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
IOPS = REPO / "bench" / "iops.py"

pytest.importorskip("numpy", reason="the iops scenarios send numpy arrays (pip install numpy)")


def _result(line: str) -> dict:
    assert line.startswith("RESULT "), line
    return json.loads(line[len("RESULT "):])


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_raw_floor_runs_the_scenario_and_counts_every_byte(mode):
    scenario = [mode, "--min-size", "8", "--step-size", "2", "--max-size", "16", "--reps", "3"]
    server = subprocess.Popen([sys.executable, str(IOPS), "--lib", "raw", "server", *scenario,
                               "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        ready = server.stdout.readline()
        assert ready.startswith("READY "), ready
        port = json.loads(ready[len("READY "):])["addr"].rsplit(":", 1)[1]
        client = subprocess.run([sys.executable, str(IOPS), "--lib", "raw", "client", *scenario,
                                 "--port", port], capture_output=True, text=True, timeout=60)
        assert client.returncode == 0, client.stderr[-2000:]
        server_out, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0
    results = [_result(line) for line in (client.stdout + server_out).splitlines()
               if line.startswith("RESULT ")]
    assert {r["role"] for r in results} == {"client", "server"}
    for result in results:
        # Every message of the other side arrived, with the byte count it was sent with.
        assert result["ok"] and result["lib"] == "raw" and result["received"] == result["messages"]
        assert result["received_bytes"] * 2 == result["bytes"]
