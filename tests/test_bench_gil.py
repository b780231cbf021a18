"""bench/gil.py end to end, small: every row it prints is measured by a receiver and a sender
process of its own, and a kind it does not know is refused by name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

GIL = Path(__file__).resolve().parent.parent / "bench" / "gil.py"


@pytest.mark.timeout(120)
def test_each_kind_gets_a_row_of_latencies():
    done = subprocess.run([sys.executable, str(GIL), "--protocols", "tcp,unix", "--sizes", "1K",
                           "--work-ms", "1", "--count", "5"],
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if re.match(r"\| (tcp|unix) \|", line)]
    assert len(rows) == 6, done.stdout  # two protocols x three kinds
    for row in rows:
        p50, p90, most = (float(cell) for cell in row.strip("|").split("|")[3:])
        assert 0 < p50 <= p90 <= most, row


@pytest.mark.timeout(60)
def test_an_unknown_kind_is_refused_with_the_kinds_it_knows():
    done = subprocess.run([sys.executable, str(GIL), "--kinds", "python,numpy"],
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unknown kind(s) numpy" in done.stderr and "python-0.5ms" in done.stderr
    assert "| tcp |" not in done.stdout  # nothing was measured
