"""Every notebook passes under nbval while two busy loops compete with it for the CPU.

The notebooks' asserts are claims about timing-dependent behaviour (frames on a wire, credit,
reconnects, rates). On a quiet machine a fragile assert (a frame found by position, a margin
on wall time) passes by luck; beside two processes spinning ``while True: pass`` on a 2-core
machine, the kernel's threads lose their core at arbitrary points, and such an assert fails.
A slow CPU must make a notebook slower, never wrong.

The notebooks run in a child ``python -m pytest --nbval-lax --nbval-current-env notebooks/``
(as CI runs them), in its own session so that a timeout takes its kernels down with it; the
busy loops are killed by PID whatever happens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BUSY_LOOPS = 2
# Many times what the notebooks take together beside the busy loops, for slower CI machines
# that other jobs share; a hung cell fails sooner, through pyproject.toml's per-item timeout,
# which the child inherits.
RUN_TIMEOUT = 600


def per_notebook(junit: Path) -> str:
    """One line per notebook: cells passed, failed, skipped, and seconds, from nbval's report."""
    if not junit.exists():
        return "(no report)"
    tally = defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0})
    for case in ET.parse(junit).iter("testcase"):
        row = tally[case.get("classname", "") or case.get("file", "")]
        row["seconds"] += float(case.get("time", 0))
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        row[outcome] += 1
    return "\n".join(f"  {name}: {row['passed']} passed, {row['failed']} failed, "
                     f"{row['skipped']} skipped, {row['seconds']:.1f} s"
                     for name, row in sorted(tally.items()))


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL ``process`` and whatever it started in its session (nbval's kernels)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(30)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_every_notebook_passes_beside_two_busy_loops(tmp_path):
    junit = tmp_path / "nbval.xml"
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(BUSY_LOOPS)]
    try:
        started = time.monotonic()
        run = subprocess.Popen(
            [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
             "notebooks/", "-p", "no:cacheprovider", "-q", "-rfE", f"--junitxml={junit}"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        try:
            output, _ = run.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill_group(run)
            output, _ = run.communicate()
            raise AssertionError(f"the notebooks did not finish within {RUN_TIMEOUT} s "
                                 f"beside {BUSY_LOOPS} busy loops:\n{output[-6000:]}") from None
        except BaseException:
            _kill_group(run)
            run.communicate()
            raise
        elapsed = time.monotonic() - started
    finally:
        for spinner in spinners:
            os.kill(spinner.pid, signal.SIGKILL)
            spinner.wait(30)
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    table = per_notebook(junit)
    print(f"notebooks beside {BUSY_LOOPS} busy loops: {summary} (wall {elapsed:.0f} s)\n{table}")
    assert run.returncode == 0, (f"nbval failed beside {BUSY_LOOPS} busy loops "
                                 f"(exit {run.returncode}):\n{table}\n{output[-6000:]}")
