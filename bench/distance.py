"""bench/run.py's "distance" section: one-way 1 MiB throughput through a shaped link.

The seed sizes netq's windows for "the bandwidth-delay product of a typical connection";
loopback has no delay, so the throughput section cannot show whether netq fills a long fat
pipe. Here the receiver worker binds as usual, a relay process (``python -m netq.lab.relay``, its
own process so it shares no interpreter lock with the workers) listens in front of it with
``DELAY`` each way (a 50 ms round trip) and a ``RATE`` cap per direction, and the sender
worker connects to the relay. The same rows as the throughput section (``raw-tcp``,
``netq-tcp``; the existing workers, unchanged), in the same rep, through the same link
settings: netq's GB/s over raw TCP's is the figure of merit (the issue's target: >= 0.8x).

Needs nothing beyond netq itself (the relay is stdlib Python).
"""

from __future__ import annotations

import sys
from functools import partial

KiB, MiB = 1 << 10, 1 << 20
DELAY = 0.025  # s each way: a 50 ms round trip
RATE = 150e6  # bytes/s each way
SIZE = MiB
COUNT = 200  # messages after the warm-up: ~1.4 s at the cap, plus the window's opening


def rows(Row):
    return [Row("raw-tcp", "raw.py", "raw-tcp"),
            Row("netq-tcp", "netq_peer.py", "netq-tcp", "netq")]


def through_relay(run, ctx, row) -> dict:
    """One measurement: receiver, relay, sender; the relay's counters come back too."""
    with run.Session(ctx, max(60.0, ctx.timeout * 2)) as s:
        rx = s.spawn("receiver", row, role="recv", size=SIZE, count=COUNT)
        addr = rx.expect("READY", s.deadline)["addr"]
        relay = s.run("relay", [ctx.python["main"], "-m", "netq.lab.relay", "--upstream", addr,
                                "--delay", str(DELAY), "--rate", str(RATE)])
        relayed = relay.expect("READY", s.deadline)
        tx = s.spawn("sender", row, role="send", size=SIZE, count=COUNT, addr=relayed["addr"])
        rx.tell(f"PEERS {tx.pid}")
        recv = rx.expect("RESULT", s.deadline)
        send = tx.expect("RESULT", s.deadline)
        tx.release()
        s.collect(rx, tx)
        relay.release()
        stats = relay.expect("RESULT", s.deadline)
        s.collect(relay)
    return {"ok": recv["ok"], "count": COUNT, "recv": recv, "send": send, "relay": stats,
            "relay_buffer": relayed.get("limit"), "delay_s": DELAY, "rate": RATE}


def rep(run, ctx, rep_index: int) -> None:
    for row in rows(run.Row):
        if not ctx.usable("distance", row):
            continue
        rec = run.measure(ctx, "distance", row.name, rep_index,
                          partial(through_relay, run, ctx, row), SIZE)
        if not rec.get("failed"):
            r = rec["recv"]
            run.log(f"distance     {row.name:<15} {run.human(SIZE):>7} rep {rep_index}  "
                    f"{r['gb_per_s'] * 1e3:7.1f} MB/s through {DELAY * 2e3:.0f} ms RTT, "
                    f"{RATE / 1e6:.0f} MB/s cap  ok={r['ok']}")


def summarize(run, records: list[dict]) -> dict:
    good = [r for r in records if r["section"] == "distance" and not r.get("failed")]
    raw = {r["rep"]: r["recv"]["gb_per_s"] for r in good if r["row"] == "raw-tcp" and r["ok"]}
    out = {}
    for name in dict.fromkeys(r["row"] for r in good):
        rs = [r for r in good if r["row"] == name]
        mbps = [r["recv"]["gb_per_s"] * 1e3 for r in rs]
        out[name] = {
            "row": name, "reps": len(rs), "ok": all(r["ok"] for r in rs),
            "mb_per_s": run.median(mbps), "mb_per_s_min": min(mbps), "mb_per_s_max": max(mbps),
            "ratio_to_raw_tcp": run.median([r["recv"]["gb_per_s"] / raw[r["rep"]] for r in rs
                                            if r["rep"] in raw]),
            "of_cap": run.median([r["recv"]["gb_per_s"] * 1e9 / RATE for r in rs]),
            "send_peak_mib": run.median([r["send"]["peak_rss_kb"] / KiB for r in rs]),
            "recv_peak_mib": run.median([r["recv"]["peak_rss_kb"] / KiB for r in rs])}
    return out


def markdown(run, summary: dict | None, failed_keys: set) -> list[str]:
    failed = [k[1] for k in failed_keys if k[0] == "distance"]
    if not summary and not failed:
        return []
    table = []
    for name, v in (summary or {}).items():
        spread = f"{v['mb_per_s_min']:.0f} – {v['mb_per_s_max']:.0f}" if v["reps"] > 1 else "1 rep"
        table.append([name, f"{v['mb_per_s']:.0f}", spread, f"{v['of_cap']:.2f}",
                      f"×{run.fmt(v['ratio_to_raw_tcp'], '.2f')}",
                      f"{v['send_peak_mib']:.0f} / {v['recv_peak_mib']:.0f}",
                      "yes" if v["ok"] else "**NO**"])
    table += [[name, "FAILED"] + [""] * 5 for name in failed if name not in (summary or {})]
    return ([f"## Distance: one-way {run.human(SIZE)} messages through a relay with "
             f"{DELAY * 1e3:.0f} ms each way ({DELAY * 2e3:.0f} ms round trip) and "
             f"{RATE / 1e6:.0f} MB/s per direction (bench/distance.py)", ""]
            + run.md_table(["row", "MB/s", "spread", "of the cap", "× raw TCP (same rep)",
                            "peak RSS s / r (MiB)", "counts verified"], table))


if __name__ == "__main__":
    sys.exit("run it through bench/run.py --only distance")
