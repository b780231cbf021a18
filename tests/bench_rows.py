"""Running ``bench/run.py`` from a test: the rows' end-to-end checks share this runner.

They assert that rows complete and verify what they moved, never a speed: performance is
measured by ``bench/run.py`` itself, whose figures are in the README.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_bench(results: Path, *args: str, timeout: float) -> dict:
    """Run ``bench/run.py ARGS --json RESULTS`` from the repository; its ``summary``.

    Fails the test (with the tail of its output) when the run does not exit cleanly.
    """
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), *args, "--json", str(results)],
        capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(results.read_text())["summary"]
