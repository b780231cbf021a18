#!/usr/bin/env python3
"""Find or create the Python 3.13 virtualenv that runs upstream net-queue 2.6.4.

net-queue needs Python >= 3.13 (PEP 695 generics, ``copy.replace``), so its rows run in a
venv of their own, by default ``/tmp/nq313`` (``NETQ_BENCH_NQ_VENV`` overrides it).

    python3 bench/netqueue_env.py            # create if missing, print the interpreter path
    python3 bench/netqueue_env.py --check    # only report, never install

Stdlib only.  ``ensure()`` never raises: it returns ``(python_path, None)`` or
``(None, reason)`` so that the benchmark can skip the net-queue rows with one clear note.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

NETQUEUE_VERSION = "2.6.4"
DEFAULT_VENV = os.environ.get("NETQ_BENCH_NQ_VENV", "/tmp/nq313")
# The versions that produced shared/ANCHORS.md (net-queue's own pins: bidict~=0.23,
# sabctools~=9.3, grpcio~=1.80, paho-mqtt~=2.1, streamview~=3.0; numpy for iops).
PINNED = [f"net-queue=={NETQUEUE_VERSION}", "numpy==2.5.5", "grpcio==1.85.1", "paho-mqtt==2.2.0",
          "streamview==3.0.1", "sabctools==9.7.2", "bidict==0.24.1"]
UNPINNED = [f"net-queue=={NETQUEUE_VERSION}", "numpy"]
PROBE = ("import sys, importlib.metadata as m, net_queue, numpy; "
         "print('%d.%d.%d' % sys.version_info[:3], m.version('net-queue'), numpy.__version__)")


def _version_of(python: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:3])"],
                             capture_output=True, text=True, timeout=30)
        return tuple(int(x) for x in out.stdout.split()) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def find_python313() -> str | None:
    """A CPython >= 3.13: $NETQ_BENCH_PY313, ~/.pyenv/versions/3.13*, then python3.13 on PATH."""
    candidates = [os.environ.get("NETQ_BENCH_PY313")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.13*/bin/python")),
                         reverse=True)
    candidates.append(shutil.which("python3.13"))
    for c in candidates:
        if c and os.path.exists(c) and (_version_of(c) or (0,)) >= (3, 13):
            return c
    return None


def probe(venv: str = DEFAULT_VENV) -> dict | None:
    """{'python', 'python_version', 'net_queue', 'numpy'} if the venv works, else None."""
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        return None
    try:
        out = subprocess.run([py, "-c", PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    pyver, nqver, npver = out.stdout.split()
    if nqver != NETQUEUE_VERSION:
        return None
    return {"python": py, "python_version": pyver, "net_queue": nqver, "numpy": npver}


def _pip(py: str, packages: list[str], log) -> str | None:
    cmd = [py, "-m", "pip", "install", "-q", *packages]
    log("netqueue_env: " + " ".join(cmd))
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return "pip install timed out after 900 s"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        return lines[-1] if lines else f"pip exited {out.returncode}"
    return None


def ensure(venv: str = DEFAULT_VENV, install: bool = True,
           log=None) -> tuple[str | None, str | None]:
    """Return (venv python, None) when net-queue is usable, else (None, reason)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if probe(venv):
        return os.path.join(venv, "bin", "python"), None
    if not install:
        return None, f"no working net-queue {NETQUEUE_VERSION} venv at {venv}"
    base = find_python313()
    if base is None:
        return None, ("no Python 3.13 found (looked at $NETQ_BENCH_PY313, ~/.pyenv/versions/3.13*, "
                      "python3.13 on PATH)")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        log(f"netqueue_env: creating {venv} with {base}")
        try:
            out = subprocess.run([base, "-m", "venv", venv], capture_output=True, text=True,
                                 timeout=300)
        except subprocess.TimeoutExpired:
            return None, "python3.13 -m venv timed out"
        if out.returncode != 0:
            return None, f"python3.13 -m venv failed: {out.stderr.strip()[-300:]}"
    err = _pip(py, PINNED, log)
    if err:
        log(f"netqueue_env: pinned install failed ({err}); trying unpinned")
        err = _pip(py, UNPINNED, log)
        if err:
            return None, f"pip install net-queue=={NETQUEUE_VERSION} failed: {err}"
    if not probe(venv):
        return None, f"net-queue {NETQUEUE_VERSION} installed in {venv} but does not import"
    return py, None


def main() -> int:
    check = "--check" in sys.argv[1:]
    py, reason = ensure(install=not check)
    if py is None:
        print(f"net-queue unavailable: {reason}")
        return 1
    print(py, probe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
