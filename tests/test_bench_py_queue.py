"""The bench's py-queue row (the plain-Python floor of a put()/get() queue) runs end to end
next to netq-tcp, which is then also compared with it. It asserts no speed: performance is
measured by ``bench/run.py``, never by a timed test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_py_queue_row_runs_verifies_and_is_netq_tcps_floor(tmp_path):
    results = tmp_path / "floor.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--only", "py-queue,netq-tcp,throughput",
         "--sizes", "64,4K,64K", "--reps", "1", "--target", "0.02", "--json", str(results)],
        capture_output=True, text=True, timeout=160, cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads(results.read_text())["summary"]["throughput"]
    sizes = (64, 4096, 65536)
    assert set(summary) == {f"{row}|{size}" for row in ("py-queue", "netq-tcp") for size in sizes}
    for row in summary.values():
        assert row["ok"], row  # every message arrived, intact (count, bytes, CRC)
        assert row["send_cpu_us_per_msg"] > 0 and row["recv_cpu_us_per_msg"] > 0
    for size in sizes:
        assert summary[f"netq-tcp|{size}"]["ratio_to_floor"] > 0
    assert "py-queue" in (tmp_path / "floor.md").read_text()
