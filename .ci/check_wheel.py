"""Check an installed netq wheel the way a new user meets it (run by .ci/run in a clean venv).

Run with the clean venv's python from outside the repository, so that only the installed wheel
can be imported:

    python check_wheel.py /path/to/README.md

The venv has the wheel alone, without extras: the core must work with the standard library
only. It checks that netq comes from site-packages with the version and licence of the
metadata; that the wheel holds every subpackage (pyproject.toml lists them explicitly, and a
new one can be missed) and each one imports, or fails only for want of its extra's library;
that ``python -m netq --version`` works; and that the README's server.py/client.py example runs
as two processes over TCP (on a free port instead of 51966).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import socket
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

BLOCK = re.compile(r"^```python\n(# (server|client)\.py\n.*?)^```", re.MULTILINE | re.DOTALL)
TIMEOUT = 60  # seconds for each example process
# subpackage -> the top-level module of its extra's library (pyproject.toml's extras)
NEEDS_EXTRA = {"netq.transports.mqtt": "paho", "netq.transports.grpc": "grpc",
               "netq.widgets": "anywidget"}


def check(condition: bool, message: str) -> None:
    if not condition:
        sys.exit(f"check_wheel: FAILED: {message}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    readme = Path(sys.argv[1]).read_text()
    import netq

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    location = Path(netq.__file__).resolve()
    check(location.is_relative_to(site), f"netq imported from {location}, not from {site}")
    version = importlib.metadata.version("netq")
    check(netq.__version__ == version, f"netq.__version__ {netq.__version__} != {version}")
    metadata = importlib.metadata.metadata("netq")
    check(metadata.get("License-Expression") == "MIT", "License-Expression is not MIT")
    files = [str(f) for f in importlib.metadata.files("netq") or []]
    check(any(f.endswith("licenses/LICENSE") for f in files), "no LICENSE in the wheel")

    names = sorted(f.parent.as_posix().replace("/", ".") for f in
                   importlib.metadata.files("netq") or [] if f.name == "__init__.py")
    for expected in ("netq", "netq.protocol", "netq.transports", "netq.lab", *NEEDS_EXTRA):
        check(expected in names, f"subpackage {expected} is missing from the wheel")
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as error:  # a ModuleNotFoundError, or netq's own saying which extra
            cause = error if isinstance(error, ModuleNotFoundError) else error.__cause__
            missing = (getattr(cause, "name", None) or "").split(".")[0]
            check(NEEDS_EXTRA.get(name) == missing, f"import {name}: {error!r}")
            print(f"check_wheel: {name} needs its extra: {error}")
    print(f"check_wheel: netq {version} from {location.parent}; wheel packages: {', '.join(names)}")

    result = subprocess.run([sys.executable, "-m", "netq", "--version"], capture_output=True,
                            text=True, timeout=TIMEOUT)
    check(result.returncode == 0 and result.stdout.startswith(f"netq {version} "),
          f"python -m netq --version: {result.stdout!r} {result.stderr!r}")

    blocks = {name: code for code, name in BLOCK.findall(readme)}
    check(set(blocks) == {"server", "client"}, "README: no '# server.py' / '# client.py' block")
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        for name in ("server", "client"):
            call = f"nq.new(purpose=nq.Purpose.{name.upper()})"
            check(blocks[name].count(call) == 1, f"README's {name}.py no longer calls {call}")
            code = blocks[name].replace(call, call[:-1] + ", options=nq.CommunicatorOptions("
                                        f"netloc=nq.NetworkLocation(port={port})))")
            Path(folder, f"{name}.py").write_text(code)
        processes = {name: subprocess.Popen([sys.executable, f"{name}.py"], cwd=folder,
                                            text=True, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE)
                     for name in ("client", "server")}
        outputs = {}
        try:
            for name, process in processes.items():
                outputs[name] = process.communicate(timeout=TIMEOUT)
        finally:
            for process in processes.values():
                if process.poll() is None:
                    process.kill()
                    process.communicate()
    for name, process in processes.items():
        out, err = outputs[name]
        check(process.returncode == 0 and err == "", f"{name}.py failed: {err}")
        print(f"check_wheel: README {name}.py: {out.strip()}")
    check("server: got 'Hello, Server!' from client" in outputs["server"][0], "server output")
    check("client: got 'Hello, Client!' from the server" in outputs["client"][0],
          "client output")
    print("check_wheel: ok")


if __name__ == "__main__":
    main()
