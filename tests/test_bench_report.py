"""The README's benchmark block is what ``bench/run.py`` generates from the committed results.

``python3 bench/run.py --readme`` measures and rewrites the block between the bench markers;
``--render bench/results/latest.json --readme`` rewrites it from the results file. A hand edit
of the numbers, or results committed without regenerating the README, fails here.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_run", REPO / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.fixture(scope="module")
def results():
    return json.loads((REPO / "bench" / "results" / "latest.json").read_text())


def test_readme_block_is_generated_from_the_committed_results(bench, results):
    readme = (REPO / "README.md").read_text()
    start, end = readme.index(bench.README_START), readme.index(bench.README_END)
    assert readme[start:end + len(bench.README_END)] == bench.readme_block(results), \
        "README benchmark block is stale: " \
        "python3 bench/run.py --render bench/results/latest.json --readme"


def test_block_states_machine_date_medians_and_spread(bench, results):
    block = bench.readme_block(results)
    meta = results["meta"]
    assert meta["date"][:10] in block and meta["machine"]["cpu_model"] in block
    assert f"median of {meta['reps']}" in block and "min–max" in block
    raw = [r["recv"]["gb_per_s"] for r in results["records"]
           if r["section"] == "throughput" and r["row"] == "raw-tcp" and r.get("size") == 1048576
           and not r.get("failed") and not r.get("calibration")]
    assert f"({min(raw):.2f}–{max(raw):.2f})" in block  # the spread of a row, from the records


def test_update_readme_rewrites_only_the_block(bench, results, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{bench.README_START}\nold numbers\n{bench.README_END}\nafter\n")
    bench.update_readme(str(readme), results)
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith("\nafter\n")
    assert "old numbers" not in text and bench.readme_block(results) in text
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no benchmark markers"):
        bench.update_readme(str(readme), results)


def _throughput(row: str, size: int, rep: int, gbps: float, send_cpu: float, recv_cpu: float,
                count: int = 100) -> dict:
    """A throughput record as bench/run.py stores it (CPU in seconds over `count` messages)."""
    return {"section": "throughput", "row": row, "size": size, "rep": rep, "ok": True,
            "count": count,
            "recv": {"ok": True, "msgs": count, "expected_msgs": count, "gb_per_s": gbps,
                     "msgs_per_s": gbps * 1e9 / size, "recv_cpu_s": recv_cpu,
                     "send_cpu_s": send_cpu,
                     "cpu_us_per_msg": (send_cpu + recv_cpu) / count * 1e6,
                     "base_rss_kb": 1, "peak_rss_kb": 2},
            "send": {"base_rss_kb": 1, "peak_rss_kb": 2}, "other_load_cores": 0.0}


@pytest.fixture
def tls_results(results):
    """The committed results' meta with a small, known set of TCP and TLS records."""
    size = 1 << 20
    records = []
    for rep in range(3):
        records += [_throughput("raw-tcp", size, rep, 4.0, 0.02, 0.01),
                    _throughput("raw-ssl", size, rep, 2.0, 0.05, 0.05),
                    _throughput("netq-tls", size, rep, 1.0 + 0.2 * rep, 0.05, 0.1)]
    meta = {**results["meta"], "sizes": [size], "reps": 3}
    return {"meta": meta, "records": records, "notes": []}


def test_netq_tls_is_compared_with_raw_ssl_of_the_same_rep(bench, tls_results):
    block = bench.readme_block(tls_results)
    ssl_line = next(line for line in block.splitlines() if line.startswith("| raw `ssl` socket"))
    tls_line = next(line for line in block.splitlines() if line.startswith("| **netq TLS**"))
    assert "2.00 (2.00–2.00) |" in ssl_line and "×" not in ssl_line
    assert "1.20 (1.00–1.40) ×0.60 |" in tls_line  # median of 0.5, 0.6, 0.7
    tls_results["summary"] = bench.summarize(tls_results["records"])
    summary = tls_results["summary"]["throughput"][f"netq-tls|{1 << 20}"]
    assert summary["ratio_to_floor"] == pytest.approx(0.6)
    assert summary["ratio_to_raw_tcp"] == pytest.approx(0.3)
    md = bench.markdown({**tls_results, "summary": {**tls_results["summary"], "stall": {},
                                                     "many-clients": {}, "iops": {}}})
    assert "1.200 (×0.30, ×0.60 raw-ssl)" in md


def test_cpu_per_message_is_reported_per_side_next_to_the_peers(bench, tls_results):
    block = bench.readme_block(tls_results)
    assert "CPU per message, µs (sender / receiver" in block
    rows = {line.split(" | ")[0]: line for line in block.splitlines() if " / " in line}
    # 100 messages: 0.05 s sender, 0.1 s receiver -> 500 / 1000 µs per message
    assert rows["| **netq TLS**"].endswith("| 500 / 1000 |")
    assert rows["| raw `ssl`"].endswith("| 500 / 500 |")
    assert rows["| raw TCP"].endswith("| 200 / 100 |")
    summary = bench.summarize(tls_results["records"])["throughput"][f"netq-tls|{1 << 20}"]
    assert summary["send_cpu_us_per_msg"] == pytest.approx(500)
    assert summary["recv_cpu_us_per_msg"] == pytest.approx(1000)


def test_committed_results_render_a_cpu_table_for_every_main_row(bench, results):
    block = bench.readme_block(results)
    cpu = block[block.index("CPU per message, µs (sender / receiver"):block.index("64 B round")]
    measured = {r["row"] for r in results["records"] if r["section"] == "throughput"}
    for row, label in bench.README_CPU:
        assert (f"| {label} |" in cpu) == (row in measured), row


def test_a_busy_run_says_so_in_every_header(bench, tls_results):
    quiet = bench.readme_block(tls_results)
    assert "busy" not in quiet
    tls_results["meta"] = {**tls_results["meta"], "busy": 2, "wall_s": 1}
    block = bench.readme_block(tls_results)
    assert "--reps 3 --busy 2`, **with 2 busy-loop processes running throughout**" in block
    summary = {**bench.summarize(tls_results["records"]), "stall": {}, "many-clients": {},
               "iops": {}}
    md = bench.markdown({**tls_results, "summary": summary})
    assert "2 pure-Python busy-loop process(es) ran for the whole run" in md


@pytest.mark.timeout(60)
def test_busy_loops_spin_until_stopped_and_leave_no_process(bench):
    busy = bench.BusyLoops(2)
    busy.start()
    procs = list(busy.procs)
    try:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    finally:
        busy.stop()
    assert all(p.returncode is not None for p in procs) and busy.procs == []


def _busy_run(results: dict, busy: int, factor: float) -> dict:
    """A --busy run: the committed round trips with every p50 and p99 scaled by factor."""
    records = [{**r, "ping": {**r["ping"], "p50_us": r["ping"]["p50_us"] * factor,
                              "p99_us": r["ping"]["p99_us"] * factor}}
               for r in results["records"]
               if r["section"] == "latency" and not r.get("failed")]
    return {"meta": {**results["meta"], "busy": busy}, "records": records}


def test_round_trips_of_a_busy_run_are_shown_next_to_the_quiet_ones(bench, results, tmp_path):
    quiet = json.loads(json.dumps(results))
    quiet.pop("busy_latency", None)  # the committed results may carry a busy run already
    assert "busy: p50" not in bench.readme_block(quiet)
    with pytest.raises(SystemExit, match="not made with --busy"):
        bench.attach_busy_latency(quiet, _busy_run(results, 0, 1.0))
    busy = _busy_run(results, 2, 0.5)
    path = tmp_path / "busy.json"
    path.write_text(json.dumps(busy))
    rendered = tmp_path / "quiet.json"
    rendered.write_text(json.dumps(quiet))
    assert bench.main(["--render", str(rendered), "--busy-results", str(path)]) == 0
    attached = json.loads(rendered.read_text())
    assert attached["busy_latency"]["busy"] == 2
    block = bench.readme_block(attached)
    assert "on a busy one (2 pure-Python busy-loop processes running, `--busy 2`" in block
    assert "| busy: p50 | busy: p99 | busy: p50 × raw TCP |" in block
    raw = [r["ping"]["p50_us"] for r in results["records"]
           if r["section"] == "latency" and r["row"] == "raw-tcp" and not r.get("failed")]
    round_trips = block[block.index("64 B round trip"):]
    raw_line = next(line for line in round_trips.splitlines() if line.startswith("| raw TCP |"))
    p50 = statistics.median(raw)
    assert f"| ×1.00 | {p50 / 2:.0f} ({min(raw) / 2:.0f}–{max(raw) / 2:.0f}) |" in raw_line
    assert raw_line.endswith("| ×1.00 |")
    md = (tmp_path / "quiet.md").read_text()
    assert "## Round trip on a busy machine: 2 busy-loop processes" in md
