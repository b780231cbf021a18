"""net-queue's iops scenarios (``bench/iops.py``) beside their raw-socket floor.

The floor (``--lib raw``, ``bench/workers/raw_iops.py``) runs the scenario end to end over one
blocking socket per side, both modes, and every message arrives with its bytes counted; the
report divides each library's Gbps by the floor's of the same rep. No speed is asserted:
``bench/run.py`` measures.
"""

from __future__ import annotations

import importlib.util
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


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_run_iops", REPO / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def _iops_record(row: str, scenario: str, rep: int, gbps: float) -> dict:
    side = {"gbps": gbps, "iops": 1000.0, "elapsed": 1.0, "cpu_s": 0.5, "ops": 2000,
            "peak_rss_kb": 1024, "ok": True}
    return {"section": "iops", "row": row, "rep": rep, "scenario": scenario, "ok": True,
            "client": side, "server": side}


def test_each_library_is_divided_by_the_floor_of_the_same_rep(bench):
    scenario = bench.IOPS_SCENARIOS[0][0]
    records = []
    for rep, (raw, netq, net_queue) in enumerate([(30.0, 24.0, 10.0), (20.0, 19.0, 8.5),
                                                  (25.0, 20.0, 8.0)]):
        records += [_iops_record("raw-tcp", scenario, rep, raw),
                    _iops_record("netq-tcp", scenario, rep, netq),
                    _iops_record("net-queue", scenario, rep, net_queue)]
    iops = bench.summarize(records)["iops"]
    netq = iops[f"{scenario}|netq-tcp"]
    assert netq["ratio_to_raw"] == pytest.approx(0.8)  # median of 0.8, 0.95, 0.8
    assert netq["ratio_to_net_queue"] == pytest.approx(2.4)  # median of 2.4, 2.24, 2.5
    assert iops[f"{scenario}|raw-tcp"]["ratio_to_raw"] == pytest.approx(1.0)
    table = "\n".join(bench.markdown({
        "meta": {"date": "2026-12-07", "machine": {"cpu_model": "cpu", "cores": 2,
                                                    "kernel": "k"},
                 "python": {"main": "3.11"}, "mode": "full", "reps": 3, "target_s": 0.3,
                 "sizes": []},
        "records": records, "notes": [],
        "summary": {"throughput": {}, "latency": {}, "stall": {}, "many-clients": {},
                    "iops": iops}}).splitlines())
    assert "× raw-tcp" in table
    netq_line = next(line for line in table.splitlines()
                     if line.startswith(f"| {scenario} | netq-tcp |"))
    assert "×2.40 | ×0.80 |" in netq_line
