"""The bench's raw-ssl row runs end to end: TLS with the run's certificate, counts and CRC
verified, next to netq-tls. It asserts no speed: performance is measured by
``bench/run.py``, never by a timed test."""

from __future__ import annotations

import shutil

import pytest

from bench_rows import run_bench


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("openssl") is None, reason="the bench makes its certificate "
                                                             "with openssl")
def test_raw_ssl_and_netq_tls_rows_run_and_verify(tmp_path):
    summary = run_bench(tmp_path / "tls.json", "--only", "raw-ssl,netq-tls,throughput",
                        "--sizes", "4K,1M", "--reps", "1", "--target", "0.02",
                        timeout=160)["throughput"]
    assert set(summary) == {f"{row}|{size}" for row in ("raw-ssl", "netq-tls")
                            for size in (4096, 1 << 20)}
    for row in summary.values():
        assert row["ok"], row  # every message arrived, intact (count, bytes, CRC)
        assert row["send_cpu_us_per_msg"] > 0 and row["recv_cpu_us_per_msg"] > 0
    assert summary[f"netq-tls|{1 << 20}"]["ratio_to_floor"] > 0
