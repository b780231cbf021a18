"""The bench's py-queue row (the plain-Python floor of a put()/get() queue) runs end to end
next to netq-tcp, which is then also compared with it. It asserts no speed: performance is
measured by ``bench/run.py``, never by a timed test."""

from __future__ import annotations

import pytest

from bench_rows import run_bench


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_py_queue_row_runs_verifies_and_is_netq_tcps_floor(tmp_path):
    summary = run_bench(tmp_path / "floor.json", "--only", "py-queue,netq-tcp,throughput",
                        "--sizes", "64,4K,64K", "--reps", "1", "--target", "0.02",
                        timeout=160)["throughput"]
    sizes = (64, 4096, 65536)
    assert set(summary) == {f"{row}|{size}" for row in ("py-queue", "netq-tcp") for size in sizes}
    for row in summary.values():
        assert row["ok"], row  # every message arrived, intact (count, bytes, CRC)
        assert row["send_cpu_us_per_msg"] > 0 and row["recv_cpu_us_per_msg"] > 0
    for size in sizes:
        assert summary[f"netq-tcp|{size}"]["ratio_to_floor"] > 0
    assert "py-queue" in (tmp_path / "floor.md").read_text()
