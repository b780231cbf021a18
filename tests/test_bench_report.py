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
    quiet.pop("busy", None)
    assert "busy: p50" not in bench.readme_block(quiet)
    with pytest.raises(SystemExit, match="not made with --busy"):
        bench.attach_busy_run(quiet, _busy_run(results, 0, 1.0))
    busy = _busy_run(results, 2, 0.5)
    path = tmp_path / "busy.json"
    path.write_text(json.dumps(busy))
    rendered = tmp_path / "quiet.json"
    rendered.write_text(json.dumps(quiet))
    assert bench.main(["--render", str(rendered), "--busy-results", str(path)]) == 0
    attached = json.loads(rendered.read_text())
    assert attached["busy"]["busy"] == 2 and "busy_latency" not in attached
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


# ----------------------------------------------------------------------------- busy throughput
KIB64 = 64 << 10


def _ping(row: str, rep: int, p50: float, ping_cpu: float | None = None,
          echo_cpu: float | None = None, n: int = 1000) -> dict:
    """A round-trip record as bench/run.py stores it (CPU in seconds over n round trips)."""
    return {"section": "latency", "row": row, "size": 64, "rep": rep, "ok": True,
            "ping": {"role": "ping", "n": n, "size": 64, "p50_us": p50, "p99_us": 2 * p50,
                     "ping_cpu_s": ping_cpu, "echo_cpu_s": echo_cpu}}


def _tcp_run(results: dict, netq_gbps: float, netq_cpu: float, busy: int = 0) -> dict:
    """Three reps of raw-tcp (1.0 GB/s, 10 + 10 ms of CPU per 100 messages), pyzmq (0.8 GB/s)
    and netq-tcp (netq_gbps; netq_cpu s on each side) at 64 B and 64 KiB, plus round trips."""
    records = []
    for rep in range(3):
        for size in (64, KIB64):
            records += [_throughput("raw-tcp", size, rep, 1.0, 0.01, 0.01),
                        _throughput("zmq-push", size, rep, 0.8, 0.005, 0.005),
                        _throughput("netq-tcp", size, rep, netq_gbps, netq_cpu, netq_cpu)]
        records += [_ping("raw-tcp", rep, 20.0, 0.01, 0.01), _ping("netq-tcp", rep, 50.0,
                                                                   0.03, 0.02)]
    meta = {**results["meta"], "sizes": [64, KIB64], "reps": 3, "busy": busy,
            "date": "2026-11-26T01:00:00+00:00" if busy else results["meta"]["date"]}
    return {"meta": meta, "records": records, "notes": []}


def _target_line(block: str, label: str) -> list[str]:
    line = next(line for line in block.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def _with_summary(bench, run: dict) -> dict:
    return {**run, "summary": {**bench.summarize(run["records"]), "stall": {},
                               "many-clients": {}, "iops": {}}}


def test_busy_throughput_is_attached_and_shown_next_to_the_quiet_one(bench, results):
    quiet = _tcp_run(results, 0.5, 0.01)
    busy = _tcp_run(results, 0.45, 0.012, busy=2)
    busy["records"].append({"section": "stall", "row": "netq-tcp", "size": 1 << 20, "rep": 0,
                            "ok": True})
    quiet["busy_latency"] = {"busy": 2, "date": "2026-11-25", "reps": 3, "records": []}
    bench.attach_busy_run(quiet, busy)
    assert "busy_latency" not in quiet  # the older attachment is replaced, not kept beside
    attached = quiet["busy"]
    assert (attached["busy"], attached["reps"], attached["sizes"]) == (2, 3, [64, KIB64])
    assert {r["section"] for r in attached["records"]} == {"throughput", "latency"}

    md = bench.markdown(_with_summary(bench, quiet))
    heading = ("## One-way throughput on a busy machine: 2 busy-loop processes (`--busy 2`"
               " run of 2026-11-26")
    busy_md = md[md.index(heading):]
    gbps = busy_md[:busy_md.index("\n### Messages/s")]
    assert "### GB/s (× raw-tcp" in gbps
    assert "| netq-tcp | 0.450 (×0.45) | 0.450 (×0.45) |" in gbps
    assert "| raw-tcp | 1.000 (×1.00) | 1.000 (×1.00) |" in gbps
    assert f"{0.45e9 / 64:,.0f}" in busy_md  # messages/s of the busy run
    # 12 + 12 ms over 100 messages: 120 µs per side, ×1.20 raw TCP's 100 + 100
    assert "| netq-tcp | 120 / 120 (×1.20) | 120 / 120 (×1.20) |" in busy_md
    assert md.index("## One-way throughput: GB/s") < md.index(heading)  # quiet table first

    block = bench.readme_block(quiet)
    assert "| target | bound | this run | met | `--busy 2` | met | within 20 % of this run |" \
        in block
    assert _target_line(block, "netq TCP one-way × raw TCP, 64 B") == \
        ["netq TCP one-way × raw TCP, 64 B", "≥ ×1.0", "×0.50", "**no**", "×0.45", "**no**",
         "yes (-10.0 %)"]
    assert _target_line(block, "netq TCP one-way × pyzmq PUSH/PULL, 64 KiB")[2:] == \
        ["×0.62", "**no**", "×0.56", "**no**", "yes (-10.0 %)"]
    assert _target_line(block, "CPU per message (sender + receiver), netq TCP × raw TCP, "
                               "64 KiB")[2:] == ["×1.00", "yes", "×1.20", "yes", "yes (+20.0 %)"]


@pytest.mark.parametrize(("busy_gbps", "within"), [
    (0.41, "yes (-18.0 %)"), (0.39, "**no** (-22.0 %)"), (0.59, "yes (+18.0 %)"),
    (0.61, "**no** (+22.0 %)")])
def test_the_busy_check_holds_within_20_percent_of_the_quiet_ratio(bench, results, busy_gbps,
                                                                    within):
    quiet = _tcp_run(results, 0.5, 0.01)
    bench.attach_busy_run(quiet, _tcp_run(results, busy_gbps, 0.01, busy=2))
    line = _target_line(bench.readme_block(quiet), "netq TCP one-way × raw TCP, 64 KiB")
    assert line[2:] == ["×0.50", "**no**", f"×{busy_gbps:.2f}", "**no**", within]
    assert bench.within_busy_tolerance(0.5, busy_gbps) == within.startswith("yes")


@pytest.mark.parametrize(("busy_cpu", "within"), [
    (0.0238, "yes (+19.0 %)"), (0.0242, "**no** (+21.0 %)"), (0.0162, "yes (-19.0 %)"),
    (0.0158, "**no** (-21.0 %)")])
def test_cpu_per_message_is_a_target_quiet_and_busy(bench, results, busy_cpu, within):
    quiet = _tcp_run(results, 1.0, 0.02)          # ×2.00 raw TCP's CPU: the bound, met
    bench.attach_busy_run(quiet, _tcp_run(results, 1.0, busy_cpu, busy=2))
    line = _target_line(bench.readme_block(quiet),
                        "CPU per message (sender + receiver), netq TCP × raw TCP, 64 B")
    busy_ratio = busy_cpu / 0.01
    assert line[1:] == ["≤ ×2.0", "×2.00", "yes", f"×{busy_ratio:.2f}",
                        "yes" if busy_ratio <= 2 else "**no**", within]


def test_cpu_per_round_trip_is_measured_and_compared_with_raw(bench, results):
    quiet = _tcp_run(results, 1.0, 0.01)
    block = bench.readme_block(quiet)
    # netq 30 + 20 ms, raw 10 + 10 ms over the same round trips: ×2.50
    assert _target_line(block, "CPU per 64 B round trip (ping + echo), netq TCP × raw TCP")[1:] \
        == ["≤ ×2.0", "×2.50", "**no**"]
    assert _target_line(block, "64 B round trip p50, netq TCP × raw TCP")[1:] == \
        ["≤ ×1.5", "×2.50", "**no**"]
    assert "busy" not in block  # a quiet run alone: no busy columns
    md = bench.markdown(_with_summary(bench, quiet))
    round_trip = md[md.index("## Round trip, 64 B"):]
    assert "| CPU µs per round trip: ping / echo | CPU × raw-tcp |" in round_trip
    assert "| netq-tcp | 50.0 | 100.0 | ×2.50 | 50 – 50 | 30 / 20 | ×2.50 |" in round_trip
    assert bench._round_trip_cpu_us(_ping("raw-tcp", 0, 20.0)) is None  # older records


def test_a_round_trip_in_one_process_is_compared_with_raw_sockets_in_one_process(bench,
                                                                               results):
    quiet = _tcp_run(results, 1.0, 0.01)
    for rep in range(3):
        # raw in one process 25 µs and 15 ms of CPU (both ends) over 1000 round trips; netq 60
        # µs and 45 ms: ×2.40 and ×3.00 (against cross-process raw TCP it would be ×3.00).
        quiet["records"] += [_ping("raw-tcp-1proc", rep, 25.0, 0.015, 0.0),
                             _ping("netq-tcp-1proc", rep, 60.0, 0.045, 0.0)]
    summary = bench.summarize(quiet["records"])["latency"]
    assert summary["netq-tcp-1proc"]["ratio_to_raw_tcp"] == pytest.approx(2.4)
    assert summary["netq-tcp-1proc"]["cpu_ratio_to_raw_tcp"] == pytest.approx(3.0)
    assert summary["netq-tcp"]["ratio_to_raw_tcp"] == pytest.approx(2.5)  # still × raw-tcp
    block = bench.readme_block(quiet)
    label = ("64 B round trip p50, server and client in one process, netq TCP × raw TCP in one"
             " process")
    assert _target_line(block, label)[1:] == ["≤ ×2.0", "×2.40", "**no**"]
    assert _target_line(block, "CPU per 64 B round trip in one process, netq TCP × raw TCP in"
                        " one process")[1:] == ["≤ ×2.0", "×3.00", "**no**"]
    md = bench.markdown(_with_summary(bench, quiet))
    assert "| netq-tcp-1proc | 60.0 | 120.0 | ×2.40 | 60 – 60 | 45 (both, one process) | ×3.00 |" \
        in md
    assert bench.IN_PROCESS_NOTE in md


def test_results_with_only_busy_round_trips_still_render(bench, results, tmp_path):
    """A results file from before busy throughput was attached (``busy_latency``: the round
    trips of the --busy run) renders its busy round trips, in the Markdown and the README."""
    old = _tcp_run(results, 0.5, 0.01)
    busy = _tcp_run(results, 0.4, 0.01, busy=2)
    slower = [{**r, "ping": {**r["ping"], "p50_us": 2 * r["ping"]["p50_us"]}}
              if r["row"] == "netq-tcp" else r
              for r in busy["records"] if r["section"] == "latency"]
    old["busy_latency"] = {"busy": 2, "date": busy["meta"]["date"], "reps": 3,
                           "records": slower}
    old["summary"] = _with_summary(bench, old)["summary"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert bench.main(["--render", str(path)]) == 0
    block = bench.readme_block(old)
    assert "on a busy one (2 pure-Python busy-loop processes running, `--busy 2`" in block
    assert _target_line(block, "64 B round trip p50, netq TCP × raw TCP")[2:] == \
        ["×2.50", "**no**", "×5.00", "**no**", ""]
    assert _target_line(block, "netq TCP one-way × raw TCP, 64 B")[2:] == \
        ["×0.50", "**no**", "—", "", "—"]     # the busy run's throughput was not attached
    md = bench.markdown(old)
    assert "## Round trip on a busy machine: 2 busy-loop processes" in md
    assert "One-way throughput on a busy machine" not in md


def test_committed_results_render_with_the_targets_table(bench, results):
    block = bench.readme_block(results)
    assert "| target | bound | this run | met |" in block
    assert _target_line(block, "netq TCP one-way × raw TCP, 1 MiB")[1] == "≥ ×0.9"


def test_receiver_page_faults_per_message_are_shown_and_records_without_them_render(
        bench, tls_results):
    """The receiver's page faults per message (median over reps) get a table of their own;
    results recorded before the field existed render a dash."""
    for record in tls_results["records"]:
        if record["row"] == "netq-tls":
            record["recv"]["recv_faults_per_msg"] = 2.0 + record["rep"]  # 2, 3, 4
    summary = bench.summarize(tls_results["records"])
    assert summary["throughput"][f"netq-tls|{1 << 20}"]["recv_faults_per_msg"] == 3.0
    assert summary["throughput"][f"raw-tcp|{1 << 20}"]["recv_faults_per_msg"] is None
    md = bench.markdown({**tls_results, "summary": {**summary, "stall": {},
                                                     "many-clients": {}, "iops": {}}})
    table = md.split("## Receiver page faults per message", 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| ")}
    assert rows["| netq-tls"].endswith("| 3 |") and rows["| raw-tcp"].endswith("| — |")


def test_every_kind_of_large_part_has_its_targets_and_a_peak_is_judged_against_its_allowance(
        bench):
    """Issue 54's targets: each kind ≥ 2 × raw Unix through shared memory at 16 and 256 MiB,
    ≥ 0.9 × over the socket at 256 MiB, every receiver within 60 MiB + 1.5 messages, and Unix
    without shared memory ≥ TCP at 64 KiB, 1 MiB and 16 MiB."""
    MiB = 1 << 20
    found = {(t.row, t.size, t.metric): t for t in bench.targets([64 << 10, MiB, 16 * MiB,
                                                                  256 * MiB])}
    assert found["netq-unix-memmap-wait", 16 * MiB, "rate"].bound == 2.0
    assert found["netq-unix-noshm-bytes", 256 * MiB, "rate"].bound == 0.9
    assert ("netq-unix-noshm-bytes", 16 * MiB, "rate") not in found
    assert {size for row, size, metric in found if row == "netq-unix-noshm-numpy"} == {
        64 << 10, MiB, 16 * MiB}
    peak = found["netq-unix-noshm-ro", 16 * MiB, "recv-peak"]
    assert peak.base == "" and peak.at_most and peak.bound == 1.0
    # 84 MiB is exactly 60 MiB + 1.5 × 16 MiB: the median of 42, 84 and 126 MiB is ×1.0
    records = [_throughput("netq-unix-noshm-ro", 16 * MiB, rep, 1.0, 0.01, 0.01)
               for rep in range(3)]
    for record, mib in zip(records, (42, 84, 126), strict=True):
        record["recv"]["peak_rss_kb"] = mib * 1024
    assert peak.ratio(records) == pytest.approx(1.0) and peak.met(1.0)
    assert not peak.met(peak.ratio(records[2:]))


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
