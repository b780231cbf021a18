"""widgets/sampler.py: what one sampler costs, for 8 peers at 2 Hz (the target: well under
1 % of a core). Measured with time.thread_time() on the sampler thread, which includes
statistics(), both widgets' updates and the JSON encoding of every comm message (the
recorded frontend encodes them as a kernel session would)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from netq.widgets import Monitor

from netq_testing import wait_for
from widget_testing import Traffic

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("NETQ_TEST_ARTIFACTS", REPO / "test-artifacts"))
PEERS = 8
SECONDS = 6.0


def test_sampler_costs_well_under_one_percent_of_a_core_for_8_peers(frontend):
    with Traffic(clients=PEERS, pause=0.01) as traffic:
        wait_for(lambda: len(traffic.server.peers) == PEERS, message="8 peers")
        monitor = Monitor(traffic.server, interval=0.5, start=True)  # 2 Hz
        sampler = monitor.sampler
        time.sleep(SECONDS)  # the interval measured: CPU seconds over ticks, both counted
        ticks, cpu = sampler.ticks, sampler.cpu_seconds
        fraction = sampler.cpu_fraction()
        shown = len(monitor.stats.peers)
        monitor.stop()
        sampler.thread.join(5)
    per_tick_ms = 1000 * cpu / max(ticks, 1)
    messages = len(frontend.messages)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "sampler-cpu.json").write_text(json.dumps({
        "peers": shown, "hz": 2, "ticks": ticks, "cpu_seconds": cpu,
        "cpu_per_tick_ms": per_tick_ms, "core_fraction": fraction,
        "comm_messages": messages}, indent=2) + "\n")
    print(f"\nsampler: {shown} peers, {ticks} ticks at 2 Hz, {per_tick_ms:.2f} ms CPU per tick, "
          f"{100 * fraction:.3f} % of a core")
    assert shown == PEERS and ticks >= 10
    assert fraction < 0.01, f"sampler used {100 * fraction:.2f} % of a core"
