"""The fuzz harness (fuzz/fuzz_frames.py) in its plain-Python smoke mode, plus hand-picked inputs.

The long, coverage-guided run needs atheris: ``python3 fuzz/fuzz_frames.py CORPUS
-max_total_time=120``. Here the same checks run over deterministic generated inputs.
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HARNESS = ROOT / "fuzz" / "fuzz_frames.py"


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("netq_fuzz_frames", HARNESS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.setup(instrument=False)
    return module


def test_smoke(harness):
    stats = harness.smoke(400, seed=12345)
    assert stats["inputs"] == 400
    # The generator reaches every outcome: delivered messages, failures, peer ERRORs.
    assert stats["messages"] > 0 and stats["failed"] > 0 and stats["error_received"] > 0


def test_smoke_command_line():
    result = subprocess.run([sys.executable, str(HARNESS), "--smoke", "50", "--seed", "3"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "smoke:" in result.stdout


def test_allocation_hook_is_restored(harness):
    from netq import _buffers

    before = (_buffers.allocate_readonly, _buffers.allocate_writable)
    harness.smoke(20, seed=1)
    assert (_buffers.allocate_readonly, _buffers.allocate_writable) == before


@pytest.mark.parametrize("mode", range(8))
def test_valid_streams_are_accepted(harness, mode):
    import random

    from netq.protocol.events import ConnectionFailed

    rng = random.Random(mode)
    for _ in range(10):
        stream = harness.valid_stream(rng, mode)
        conn = harness.new_receiver(mode)
        events = conn.receive_data(stream)
        assert not any(isinstance(e, ConnectionFailed) for e in events), events
        harness.TestOneInput(bytes((mode, 1)) + stream)


@pytest.mark.parametrize("stream", [
    b"",
    b"\x00",
    b"\xff" * 64,
    bytes(16),
    # DATA header with a 4 GiB length, then a 1 TiB descriptor.
    bytes([4, 3, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]) + bytes([1] + [0] * 7),
    bytes([4, 3, 0, 0, 24, 0, 0, 0, 1] + [0] * 7) + (1 << 40).to_bytes(8, "little")
    + (1).to_bytes(4, "little") + bytes(4) + (1 << 40).to_bytes(8, "little"),
    # 1025 parts.
    bytes([4, 3, 0, 0, 0x18, 0x20, 0, 0, 1] + [0] * 7) + bytes(8)
    + (1025).to_bytes(4, "little") + bytes(4),
    # PING flood.
    bytes([8] + [0] * 15) * 500,
], ids=["empty", "one-byte", "ff", "zeros", "4gib", "1tib", "1025-parts", "pings"])
@pytest.mark.parametrize("mode", [0, 1, 5])
def test_hostile_inputs(harness, mode, stream):
    for step in (0, 1, 5, 255):
        harness.TestOneInput(bytes((mode, step)) + stream)
