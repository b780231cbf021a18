"""Where a measurement was taken: netq and Python versions, the machine, its load.

Notebooks print :func:`environment_line` first, so that a machine-dependent number is read
beside the machine that produced it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform

__all__ = ("installed_version", "environment", "environment_line")


def installed_version() -> str:
    """The version of the installed netq distribution, ``"unknown (not installed)"`` when netq
    runs from a source tree on ``sys.path`` without being installed.

    Read from the distribution's metadata rather than ``netq.__version__``: importing the netq
    package from here would point an arrow back up (netq imports the communicator, which
    imports the display), and the metadata is written from ``netq.__version__`` at install
    (pyproject.toml's dynamic version), so the two agree for a wheel and for an editable
    install alike. Asking the caller for the version instead would put it on every notebook's
    first line for no gain.
    """
    try:
        return importlib.metadata.version("netq")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def environment() -> dict[str, str]:
    """Where a measurement was taken: netq and Python versions, CPU model, cores usable by this
    process, and the load average (1 min) against them. Notebooks print it first, so that a
    machine-dependent number is read beside the machine that produced it."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        load = f"{os.getloadavg()[0]:.2f}"
    except OSError:
        load = "unknown"
    return {"netq": installed_version(), "python": platform.python_version(),
            "system": f"{platform.system()} {platform.release()}", "cpu": model,
            "cores": str(cores), "load (1 min)": load}


def environment_line() -> str:
    """:func:`environment` as one line, e.g. for a notebook's first output."""
    env = environment()
    return (f"netq {env['netq']}, Python {env['python']} on {env['system']}; "
            f"{env['cores']} cores ({env['cpu']}); load average {env['load (1 min)']} "
            f"over 1 min")
