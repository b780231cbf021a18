"""Idle links: what N connected, idle clients cost one default TCP server (issue 21).

    python3 bench/idle.py                         # 10 000 clients in 40 processes, one run
    python3 bench/idle.py --clients 2000          # smaller (the CI test's size)
    python3 bench/idle.py --clients 500 --processes 2 --json out.json

One run is bench/storm.py's first half (its child processes, its server, its checks): a
default TCP server in a child process; ``--processes`` child processes, started one after the
other (each once the previous one's clients are all connected: this measures what idle links
cost, not a connection storm, which bench/storm.py does), each create their share of the
clients at once, each client puts one message; once the server has all of them every client
is connected and idle, and the server broadcasts one message that every client must get.
The client processes run at a lower priority (``--nice``, default 10): they stand for other
machines.
It reports:

* the server's resident memory (RSS, from /proc) growth per client, in KiB, once all are
  connected and idle, and after the broadcast (the target: at most :data:`TARGET_KIB` KiB per
  client at 10 000 clients);
* seconds until every client was connected (its first put acknowledged), from the creation of
  the first client;
* seconds until the broadcast was acknowledged by every client;
* WARNINGs the server logged that its receive budget is full (idle peers must not cause one).

Each client takes a socket on the server and about four descriptors in its own process: the
run raises RLIMIT_NOFILE to the hard limit (children do the same) and says so when that limit
caps the number of clients.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import storm  # noqa: E402 - bench/storm.py, next to this file

KiB = 1024
# bench/run.py's idle row. 250 clients per process, as bench/storm.py: a process that creates
# 1250 spends minutes starting their I/O threads on a loaded 2-core machine (each start waits
# for the GIL behind the others' heartbeat wake-ups).
BENCH_CLIENTS, BENCH_PROCESSES = 10_000, 40
TARGET_KIB = 32  # server RSS per idle client the issue asks for at 10 000 clients
SERVER_SPARE_FDS = 64  # the server's own descriptors: listener, selector, wake pipe, logs
CLIENT_FDS = 4  # per client communicator: socket, selector, wake pipe (two ends)
BUDGET_WARNING = "receive budget has been full"
# The bench's client processes run at a lower priority: they stand for other machines, and
# 10 000 idle clients' heartbeat timers in one small machine's processes take CPU the server
# needs. (Not lower still: other work on a shared machine would then starve the clients.)
CLIENT_NICE = 10


def fd_capacity() -> tuple[int, int]:
    """Raise this process's RLIMIT_NOFILE to its hard limit; (limit, clients it allows)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft, max(0, soft - SERVER_SPARE_FDS)


def plan(clients: int, processes: int) -> tuple[int, int, str]:
    """(clients, processes, note): the number of clients the descriptor limit allows, and
    enough processes that each one's share of clients fits the same limit."""
    limit, allowed = fd_capacity()
    note = ""
    if clients > allowed:
        note = (f"capped at {allowed} clients by RLIMIT_NOFILE (hard limit {limit}: one "
                f"socket per client on the server); asked for {clients}")
        clients = allowed
    per_process = max(1, (limit - SERVER_SPARE_FDS) // CLIENT_FDS)
    processes = max(processes, -(-clients // per_process))
    return clients, processes, note


def _per_client_kib(result: dict, key: str) -> float | None:
    start, end = result.get("server_rss_start"), result.get(key)
    if start is None or end is None or not result["clients"]:
        return None
    return (end - start) / result["clients"] / KiB


def run_idle(clients: int = BENCH_CLIENTS, processes: int = BENCH_PROCESSES,
             timeout: float = 300.0, log_dir: Path | None = None,
             client_nice: int = CLIENT_NICE) -> dict:
    """One run; a dict of what it measured (``ok``: every client connected and got the
    broadcast, nothing lost, no budget WARNING; the RSS target is reported, not required)."""
    asked = clients
    clients, processes, note = plan(clients, processes)
    log_dir = Path(tempfile.mkdtemp(prefix="netq-idle-")) if log_dir is None else log_dir
    result = storm.run_storm(clients, processes, restart=False, timeout=timeout,
                             log_dir=log_dir, stagger=True, client_nice=client_nice)
    result["asked"] = asked
    result["fd_note"] = note
    result["rss_per_client_kib"] = _per_client_kib(result, "server_rss_connected")
    result["rss_per_client_kib_broadcast"] = _per_client_kib(result, "server_rss_broadcast")
    server_log = log_dir / "server.log"
    text = server_log.read_text(errors="replace") if server_log.exists() else ""
    result["budget_warnings"] = text.count(BUDGET_WARNING)
    result["ok"] = bool(result["ok"]) and result["budget_warnings"] == 0
    per_client = result["rss_per_client_kib"]
    result["within_target"] = per_client is not None and per_client <= TARGET_KIB
    return result


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def summary(result: dict) -> str:
    text = (f"{result.get('connected', 0)}/{result['clients']} idle clients: server RSS "
            f"+{_fmt(result.get('rss_per_client_kib'), '.1f')} KiB per client connected, "
            f"+{_fmt(result.get('rss_per_client_kib_broadcast'), '.1f')} KiB after the "
            f"broadcast (target <= {TARGET_KIB}); all connected in "
            f"{_fmt(result.get('all_connected_s'))} s; broadcast acknowledged by all in "
            f"{_fmt(result.get('broadcast_s'))} s; lost {result.get('lost')}; budget WARNINGs "
            f"{result.get('budget_warnings')}")
    if result.get("fd_note"):
        text += f"; {result['fd_note']}"
    return text + ("" if result["ok"] else f"; FAILED (logs: {result['logs']})")


# ============================================================================ bench/run.py row

def rows(Row):
    """bench/run.py's "idle" section: one row, netq over TCP with default options."""
    return [Row("netq-tcp", "", "netq-tcp", "netq")]


def rep(run, ctx, rep_index: int) -> None:
    # Once per run, in the first rep: it takes minutes, and what it measures (server memory
    # per idle link) is a size, not a rate that the machine's load moves from rep to rep.
    if rep_index > 0:
        return
    for row in rows(run.Row):
        if not ctx.usable("idle", row):
            continue
        record = run.measure(ctx, "idle", row.name, rep_index, lambda: run_idle(
            BENCH_CLIENTS, BENCH_PROCESSES, timeout=max(300.0, ctx.timeout)))
        if not record.get("failed"):
            run.log(f"idle         {row.name:<15} rep {rep_index}  {summary(record)}")


def summarize(run, records: list[dict]) -> dict:
    good = [r for r in records if r["section"] == "idle" and not r.get("failed")]
    out = {}
    for name in dict.fromkeys(r["row"] for r in good):
        rs = [r for r in good if r["row"] == name]
        out[name] = {
            "row": name, "reps": len(rs), "ok": all(r["ok"] for r in rs),
            "clients": min(r["clients"] for r in rs), "processes": rs[0]["processes"],
            "connected": min(r["connected"] for r in rs),
            "fd_note": next((r["fd_note"] for r in rs if r.get("fd_note")), ""),
            "rss_per_client_kib": run.median([r["rss_per_client_kib"] for r in rs]),
            "rss_per_client_kib_max": max(r["rss_per_client_kib"] for r in rs),
            "all_connected_s": run.median([r["all_connected_s"] for r in rs]),
            "broadcast_s": run.median([r["broadcast_s"] for r in rs]),
            "lost": sum(r["lost"] for r in rs),
            "budget_warnings": sum(r["budget_warnings"] for r in rs)}
    return out


def markdown(run, summary_: dict | None, failed_keys: set) -> list[str]:
    failed = [k[1] for k in failed_keys if k[0] == "idle"]
    if not summary_ and not failed:
        return []
    table = []
    notes = []
    for name, v in (summary_ or {}).items():
        table.append([name, f"{v['connected']} / {v['clients']}",
                      f"{v['rss_per_client_kib']:.1f} (max {v['rss_per_client_kib_max']:.1f})",
                      f"{v['all_connected_s']:.2f}", f"{v['broadcast_s']:.2f}", str(v["lost"]),
                      str(v["budget_warnings"]), "yes" if v["ok"] else "**NO**"])
        if v["fd_note"]:
            notes.append(f"{name}: {v['fd_note']}")
    table += [[name, "FAILED"] + [""] * 6 for name in failed if name not in (summary_ or {})]
    first = next(iter((summary_ or {}).values()), None)
    clients, processes = ((first["clients"], first["processes"]) if first
                          else (BENCH_CLIENTS, BENCH_PROCESSES))
    return ([f"## Idle links: {clients} idle clients in {processes} processes on "
             f"one default TCP server (bench/idle.py; target <= {TARGET_KIB} KiB per client; "
             f"measured once per run, in the first rep)",
             ""]
            + run.md_table(["row", "connected", "server RSS per client (KiB)",
                            "all connected after (s)", "broadcast acknowledged by all (s)",
                            "messages lost", "budget WARNINGs", "verified"], table)
            + ([""] + notes if notes else []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=BENCH_CLIENTS)
    parser.add_argument("--processes", type=int, default=BENCH_PROCESSES)
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds each wait of the run may take before it fails")
    parser.add_argument("--nice", type=int, default=CLIENT_NICE,
                        help="niceness of the client processes (0: as the server)")
    parser.add_argument("--json", help="write the run's results to this file")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    result = run_idle(args.clients, args.processes, args.timeout, client_nice=args.nice)
    result["load_before"] = load
    print(f"(load {load:.1f}, {os.cpu_count()} cores): {summary(result)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
