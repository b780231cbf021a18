"""bench/hotpath.py's command line: a row it does not know is refused by name, with the rows
it knows, instead of being measured as something else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HOTPATH = Path(__file__).resolve().parent.parent / "bench" / "hotpath.py"


@pytest.mark.timeout(60)
def test_an_unknown_row_is_refused_with_the_rows_it_knows():
    done = subprocess.run([sys.executable, str(HOTPATH), "--rows", "netq-tcp,raw-grpc",
                           "--kinds", "rtt", "--count", "10"],
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unknown row(s) raw-grpc" in done.stderr and "netq-grpc" in done.stderr
    assert "## rtt" not in done.stdout  # nothing was measured
