"""The bench's distance row runs end to end (issue: it runs in CI, not only on a bench box).

This checks that the row completes and verifies its counts, and that a ratio to raw TCP is
reported; it asserts no speed. Performance is measured by ``bench/run.py``, whose figures are
in the README, never by a timed test.
"""

from __future__ import annotations

import pytest

from bench_rows import run_bench


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_distance_row_runs_and_verifies_its_counts(tmp_path):
    summary = run_bench(tmp_path / "distance.json", "--only", "distance", "--reps", "1",
                        timeout=220)["distance"]
    assert set(summary) == {"raw-tcp", "netq-tcp"}
    for row in summary.values():
        assert row["ok"], row  # every message arrived, in order, intact
        assert row["mb_per_s"] > 0
    assert summary["netq-tcp"]["ratio_to_raw_tcp"] > 0
