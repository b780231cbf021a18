"""The README's first example runs as written: server.py and client.py as two real processes.

The two ```python blocks that start with ``# server.py`` and ``# client.py`` are taken from
README.md and run unchanged except for one textual substitution each: the README uses the
default port (51966), which may be busy on a test machine, so
``nq.new(purpose=nq.Purpose.SERVER)`` (and ``CLIENT``) gain
``options=nq.CommunicatorOptions(netloc=nq.NetworkLocation(port=<a free port>))``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from netq.lab.brokers import free_port

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(# (server|client)\.py\n.*?)^```", re.MULTILINE | re.DOTALL)


def readme_blocks() -> dict[str, str]:
    blocks = {name: code for code, name in BLOCK.findall((REPO / "README.md").read_text())}
    assert set(blocks) == {"server", "client"}, "README: no '# server.py' / '# client.py' block"
    return blocks


def on_port(code: str, purpose: str, port: int) -> str:
    call = f"nq.new(purpose=nq.Purpose.{purpose})"
    assert code.count(call) == 1, f"README's {purpose.lower()}.py no longer calls {call}"
    return code.replace(call, f"nq.new(purpose=nq.Purpose.{purpose}, options=nq."
                              f"CommunicatorOptions(netloc=nq.NetworkLocation(port={port})))")


def test_readme_server_and_client_run_as_two_processes(tmp_path):
    blocks = readme_blocks()
    port = free_port()
    for name in ("server", "client"):
        (tmp_path / f"{name}.py").write_text(on_port(blocks[name], name.upper(), port))
    # The client first: the README says either order works (it retries until the server is up).
    client = subprocess.Popen([sys.executable, "client.py"], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    server = subprocess.Popen([sys.executable, "server.py"], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        client_out, client_err = client.communicate(timeout=60)
        server_out, server_err = server.communicate(timeout=60)
    finally:
        for process in (client, server):
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert client.returncode == 0, client_err
    assert server.returncode == 0, server_err
    assert client_err == "" and server_err == ""
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    got = re.fullmatch(rf"server: got 'Hello, Server!' from client ({uuid})\n", server_out)
    assert got, server_out
    delivered = re.fullmatch(rf"client ({uuid}): delivered\n"
                             rf"client: got 'Hello, Client!' from the server {uuid}\n", client_out)
    assert delivered, client_out
    assert got[1] == delivered[1]  # the server names the client by the id the client has
