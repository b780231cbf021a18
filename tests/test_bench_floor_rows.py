"""The bench's round-trip floors (``py-lead``, also with both ends in one process, and
``py-contract`` with acknowledgements, futures and credit) and ``multiprocessing.connection``
rows run end to end: one way at 64 B and 4 KiB
(every message arrives, intact) and as a 64 B round trip. They assert no speed: performance is
measured by ``bench/run.py``, never by a timed test."""

from __future__ import annotations

import os
import socket

import pytest

from bench_rows import run_bench


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_lead_floor_and_multiprocessing_connection_rows_run_and_verify(tmp_path):
    summary = run_bench(tmp_path / "floor.json", "--only",
                        "py-lead,py-lead-1proc,py-contract,mp-connection,throughput,latency",
                        "--sizes",
                        "64,4K",
                        "--reps", "1", "--target", "0.02", timeout=160)
    throughput = summary["throughput"]
    assert set(throughput) == {"mp-connection|64", "mp-connection|4096"}
    for row in throughput.values():
        assert row["ok"], row  # every message arrived, intact (count, bytes, CRC)
        assert row["send_cpu_us_per_msg"] > 0 and row["recv_cpu_us_per_msg"] > 0
    latency = summary["latency"]
    assert set(latency) == {"py-lead", "py-lead-1proc", "py-contract", "mp-connection"}
    for name, row in latency.items():
        assert row["p50_us"] > 0 and row["ping_cpu_us"] > 0, row
        # One process: its CPU is both ends', reported as the ping side's.
        assert (row["echo_cpu_us"] == 0) == name.endswith("-1proc"), row
    table = (tmp_path / "floor.md").read_text()
    assert "py-lead" in table and "py-contract" in table and "mp-connection" in table
    assert "py-lead-1proc" in table


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(not hasattr(os, "memfd_create") or not hasattr(socket, "send_fds"),
                    reason="the shared-memory floor needs memfd_create and SCM_RIGHTS (Linux)")
def test_shared_memory_floor_rows_run_and_verify(tmp_path):
    """The one-copy floor of issue 54's rows, as a stream and put-wait-put, beside raw Unix."""
    summary = run_bench(tmp_path / "shm.json", "--only",
                        "shm-copy-floor,shm-copy-floor-wait,raw-unix,throughput", "--sizes", "1M",
                        "--reps", "1", "--target", "0.02", timeout=160)
    throughput = summary["throughput"]
    assert set(throughput) == {"shm-copy-floor|1048576", "shm-copy-floor-wait|1048576",
                               "raw-unix|1048576"}
    for row in throughput.values():
        assert row["ok"], row  # every message arrived, intact (count, bytes, CRC of the last)
    table = (tmp_path / "shm.md").read_text()
    assert "shm-copy-floor-wait" in table and "raw-unix" in table
