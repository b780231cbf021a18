"""binder/: what Binder builds from this repository, checked without Docker.

* the files themselves: a fully pinned ``requirements.txt`` that agrees with pyproject's
  extras, ``runtime.txt``, ``apt.txt``, an executable ``postBuild`` and ``start``;
* ``jupyter-repo2docker --no-build --no-run --debug`` prints the Dockerfile Binder would build:
  every binder file must be in it (Python 3.11, the pinned requirements, mosquitto from apt,
  postBuild run, start as the entrypoint);
* ``binder/start`` runs a loopback mosquitto, exports ``NETQ_MQTT_BROKER`` and becomes the
  command;
* the slow one: a fresh venv built from ``binder/requirements.txt`` plus ``postBuild`` runs
  every notebook through ``binder/start`` under nbval, the way a Binder session would, and the
  MQTT notebook really used the broker ``start`` ran.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import psutil
import pytest

from transports.mqtt_testing import mosquitto_missing

REPO = Path(__file__).resolve().parent.parent
BINDER = REPO / "binder"
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;#]+)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def binder_pins() -> dict[str, str]:
    pins = {}
    for line in (BINDER / "requirements.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"binder/requirements.txt: {line!r} is not pinned with =="
        pins[canonical(match["name"])] = match["version"]
    return pins


def pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for requirements in project["optional-dependencies"].values():
        for requirement in requirements:
            match = PIN.match(requirement)
            if match:
                pins[canonical(match["name"])] = match["version"]
    return pins


def stop_broker(directory: Path) -> None:
    pid_file = directory / "mosquitto.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        psutil.wait_procs([psutil.Process(pid)], timeout=5)


# ============================================================================ the files


def test_requirements_are_fully_pinned_and_agree_with_pyproject():
    pins = binder_pins()
    for needed in ("ipykernel", "jupyterlab-widgets", "jupyterlab", "ipywidgets", "bokeh",
                   "anywidget", "paho-mqtt", "grpcio", "nbval"):
        assert needed in pins, f"binder/requirements.txt lacks {needed}"
    ours = pyproject_pins()
    disagree = {name: (version, ours[name]) for name, version in pins.items()
                if name in ours and ours[name] != version}
    assert not disagree, f"binder pins differ from pyproject.toml (binder, pyproject): {disagree}"


def test_runtime_apt_postbuild_start():
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"
    assert "mosquitto" in (BINDER / "apt.txt").read_text().split()
    for script in ("postBuild", "start"):
        path = BINDER / script
        assert os.access(path, os.X_OK), f"binder/{script} is not executable"
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env bash\n")
        assert "set -euo pipefail" in text
    assert "pip install --no-deps -e ." in (BINDER / "postBuild").read_text()
    assert (BINDER / "start").read_text().rstrip().endswith('exec "$@"')


def test_repo2docker_picks_up_every_binder_file():
    repo2docker = shutil.which("jupyter-repo2docker")
    if repo2docker is None:
        pytest.skip("jupyter-repo2docker is not installed (it is in the dev extra)")
    result = subprocess.run([repo2docker, "--no-build", "--no-run", "--debug", str(REPO)],
                            capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    expected = [
        "Building conda environment for python=3.11",  # runtime.txt
        'pip install --no-cache-dir -r "binder/requirements.txt"',
        "apt-get install --yes --no-install-recommends mosquitto",  # apt.txt
        "RUN ./binder/postBuild",
        'ENV R2D_ENTRYPOINT="${REPO_DIR}/binder/start"',
    ]
    missing = [line for line in expected if line not in output]
    assert not missing, f"repo2docker ignored {missing}:\n{output[-3000:]}"


def test_start_runs_a_loopback_broker_then_becomes_the_command(tmp_path):
    if (missing := mosquitto_missing()) is not None:
        pytest.skip(missing)
    directory = tmp_path / "broker"
    probe = ("import os, socket; host, port = os.environ['NETQ_MQTT_BROKER'].split(':'); "
             "socket.create_connection((host, int(port)), timeout=5).close(); "
             "print(os.getpid(), os.environ['NETQ_MQTT_BROKER'])")
    try:
        result = subprocess.run(
            [str(BINDER / "start"), sys.executable, "-c", probe], capture_output=True,
            text=True, timeout=60, env={**os.environ, "NETQ_BROKER_DIR": str(directory)})
        assert result.returncode == 0, result.stderr
        _pid, address = result.stdout.split()
        assert address.startswith("127.0.0.1:")
        assert f"mosquitto on {address}" in result.stderr
        pid = int((directory / "mosquitto.pid").read_text())
        assert psutil.pid_exists(pid)
        log = (directory / "mosquitto.log").read_text(errors="replace")
        assert "running" in log, log
        # No warning about running as root: started by root, the broker drops to its own user.
        assert "not be run as root" not in result.stderr + log, result.stderr + log
        if os.geteuid() == 0:
            assert psutil.Process(pid).username() != "root"
    finally:
        stop_broker(directory)


# ============================================================================ a fresh venv


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_fresh_venv_from_binder_runs_every_notebook_through_start(tmp_path):
    """What Binder does, minus Docker: install the pins, run postBuild, start a session."""
    if (missing := mosquitto_missing()) is not None:
        pytest.skip(missing)
    notebooks = sorted((REPO / "notebooks").glob("*.ipynb"))
    assert notebooks, "no notebooks to run"
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{environment / 'bin'}{os.pathsep}{env['PATH']}"  # python3 is the venv's
    env["NETQ_BROKER_DIR"] = str(tmp_path / "broker")

    def run(command, timeout):
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=timeout)
        assert result.returncode == 0, (f"{command} failed:\n{result.stdout[-4000:]}\n"
                                        f"{result.stderr[-4000:]}")
        return result

    run([str(python), "-m", "pip", "install", "-q", "-r", str(BINDER / "requirements.txt")], 900)
    run([str(BINDER / "postBuild")], 300)
    # Only the pins and netq: nothing from this interpreter leaks into the venv.
    where = run([str(python), "-c", "import netq, paho, sys; print(netq.__file__, sys.prefix)"],
                60).stdout.split()
    assert where[0] == str(REPO / "netq" / "__init__.py") and where[1] == str(environment)
    try:
        result = run([str(BINDER / "start"), str(python), "-m", "pytest", "-q",
                      "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env",
                      *map(str, notebooks)], 1500)
        assert re.search(r"\d+ passed", result.stdout), result.stdout[-2000:]
        assert "failed" not in result.stdout.splitlines()[-1], result.stdout[-2000:]
        # The MQTT notebook talked to the broker binder/start ran (netq.lab.brokers.broker()).
        log = (tmp_path / "broker" / "mosquitto.log").read_text(errors="replace")
        assert "New client connected" in log, log[-2000:]
    finally:
        stop_broker(tmp_path / "broker")
