"""``python -m tests.soak --seed S --minutes M --transports tcp,tls,... [--replay]``.

Exit status 0: no violation; 1: violations (printed with the seed and the schedule).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from .run import EXTRA_TRANSPORTS, FAULT_KINDS, TRANSPORTS, make_schedule, report, run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh one (printed)")
    parser.add_argument("--minutes", type=float, default=3.0,
                        help="in all, split evenly across the transports")
    parser.add_argument("--transports", default="tcp,tls,mqtt",
                        help=f"comma-separated, of {','.join(TRANSPORTS + EXTRA_TRANSPORTS)}; "
                        "'all': the seven of the conformance suite and mqtt-bridge")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.6,
                        help="mean seconds between faults, per transport")
    parser.add_argument("--replay", action="store_true",
                        help="print the schedule, then every fault as it fires")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the journals and child logs in this (new) directory")
    parser.add_argument("--summary", type=Path, default=None, help="write a JSON summary here")
    args = parser.parse_args(argv)
    transports = (TRANSPORTS + EXTRA_TRANSPORTS if args.transports == "all"
                  else tuple(args.transports.split(",")))
    known = TRANSPORTS + EXTRA_TRANSPORTS
    unknown = set(transports) - set(known)
    if unknown:
        parser.error(f"unknown transports {sorted(unknown)}; known: {', '.join(known)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    if args.replay:
        seconds = args.minutes * 60 / len(transports)
        for transport in transports:
            print(f"schedule for {transport}:")
            for event in make_schedule(seed, transport, seconds, args.clients, args.interval):
                print(f"  {event}")
    results = run_soak(seed, args.minutes, transports, clients=args.clients,
                       interval=args.interval, verbose=args.replay, keep=args.keep,
                       log=lambda line: print(line, flush=True))
    faults = {kind: sum(result.faults.get(kind, 0) for result in results)
              for kind in FAULT_KINDS}
    totals: dict[str, int] = {}
    for result in results:
        for key, value in result.counts.items():
            totals[key] = totals.get(key, 0) + value
    summary = {"seed": seed, "minutes": args.minutes, "transports": list(transports),
               "faults": sum(faults.values()), "faults_by_kind": faults, **totals,
               "per_transport": {result.transport: {"seconds": round(result.seconds),
                                                    "faults": result.faults, **result.counts}
                                 for result in results}}
    print(json.dumps(summary, indent=1))
    if args.summary is not None:
        args.summary.write_text(json.dumps(summary, indent=1) + "\n")
    failed = report(results)
    if failed:
        print(f"SOAK FAILED (seed {seed}; replay: python -m tests.soak --seed {seed} "
              f"--minutes {args.minutes} --transports {','.join(transports)} --replay)\n"
              + failed, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
