"""The soak as tests: a short one in every run, the CI soak when ``NETQ_SOAK_MINUTES`` is set.

``NETQ_SOAK_MINUTES=4 python3 -m pytest tests/soak -k ci_soak`` runs a 4-minute soak on TCP,
TLS, Unix sockets (shared memory through relays that pass descriptors) and MQTT with a fresh
seed (printed; ``NETQ_SOAK_SEED`` fixes it), ``-k short`` a 30-second
one on TCP. Without the variable both skip (the soak still finds open bugs now and then); the
schedule and the checker's judgement are tested in every run.
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest

from .check import Checker
from .run import make_schedule, report, run_soak

SOAK_MINUTES = float(os.environ.get("NETQ_SOAK_MINUTES") or 0)
# Per transport: quiescing, draining and closing after the last fault, and process start-up.
SETTLE = 150


def _seed() -> int:
    seed = os.environ.get("NETQ_SOAK_SEED")
    return int(seed) if seed else random.SystemRandom().randrange(2**32)


def _soak(seed: int, minutes: float, transports: tuple[str, ...]) -> None:
    print(f"soak seed {seed}")
    results = run_soak(seed, minutes, transports)
    failed = report(results)
    assert not failed, (f"soak failed; replay: python -m tests.soak --seed {seed} --minutes "
                        f"{minutes} --transports {','.join(transports)} --replay\n{failed}")
    assert sum(sum(result.faults.values()) for result in results) > 0


@pytest.mark.skipif(not SOAK_MINUTES, reason=(
    "the soak runs only when NETQ_SOAK_MINUTES is set: it finds open bugs now and then (see "
    "test_found_by_soak.py), which would make the default suite fail at random"))
@pytest.mark.timeout(30 + SETTLE)
def test_short_soak_on_tcp_finds_nothing() -> None:
    _soak(_seed(), 0.5, ("tcp",))


@pytest.mark.slow
@pytest.mark.skipif(not SOAK_MINUTES, reason="the CI soak: set NETQ_SOAK_MINUTES (4 in CI)")
@pytest.mark.timeout(SOAK_MINUTES * 60 + 4 * SETTLE)
def test_ci_soak_tcp_tls_unix_mqtt_finds_nothing() -> None:
    _soak(_seed(), SOAK_MINUTES, ("tcp", "tls", "unix", "mqtt"))


def test_the_schedule_is_a_function_of_the_seed() -> None:
    first = make_schedule(7, "mqtt", 120, 3, 0.6)
    assert first == make_schedule(7, "mqtt", 120, 3, 0.6)
    assert first != make_schedule(8, "mqtt", 120, 3, 0.6)
    kinds = {event.kind for event in first}
    assert {"reset", "blackhole", "kill_client", "broker_restart"} <= kinds
    assert "broker_restart" not in {event.kind for event in make_schedule(7, "tcp", 600, 3, 0.6)}


def _journal(directory, name, lines) -> None:
    import json

    with open(directory / name, "w") as journal:
        for line in lines:
            journal.write(json.dumps(line) + "\n")


def test_the_checker_sees_each_kind_of_violation(tmp_path) -> None:
    """A journal with a duplicate, a reordering, a corrupt item, a loss, a future resolved
    twice, an unannounced stall, a dead thread and a leak: each is reported (the checker can
    fail)."""
    _journal(tmp_path, "c0.0.jsonl", [
        ["start", 1.0, 11, 10_000_000],
        ["sent", 1.0, 0, 0, [10], "server"], ["done", 1.1, 0, None, False],
        ["sent", 1.0, 1, 0, [10], "server"], ["done", 1.1, 1, None, False],
        ["sent", 1.0, 2, 0, [10], "server"], ["done", 1.1, 2, None, False],
        ["done", 1.2, 2, "ConnectionLost", False],
        ["sent", 1.0, 3, 0, [10], "server"], ["done", 1.1, 3, None, False],
        ["block", 9.0, 2.0, 9.0],
        ["crash", 9.5, "soak-send", "Traceback ...\nAttributeError: ..."],
        ["closed", 10.0, ["netq-io"], 0],
    ])
    _journal(tmp_path, "server.0.jsonl", [
        ["start", 1.0, 12, 10_000_000],
        ["recv", 1.5, "c0", 0, 1, 0, 1, 10, True],
        ["recv", 1.5, "c0", 0, 0, 0, 1, 10, True],
        ["recv", 1.6, "c0", 0, 1, 0, 1, 10, True],
        ["recv", 1.7, "c0", 0, 2, 0, 1, 10, False],
        ["recv", 1.8, "c9", 0, 0, 0, 1, 10, True],
    ])
    checker = Checker(tmp_path, stall_warning=2.0, rss_budget=1 << 30)
    checker.poll()
    checker.final({})
    kinds = {violation.kind for violation in checker.violations}
    assert kinds == {"order", "duplicate", "corrupt", "lost", "future", "stall", "leak",
                     "unsent", "crash"}, checker.violations


def test_a_failure_report_shows_what_happened_to_the_peers_a_violation_names() -> None:
    """A CI log keeps no journals: the report carries the WARNINGs of the peers a violation
    names and every fault aimed at them, also those older than the last lines of the run."""
    from .check import Violation
    from .run import Result

    schedule = make_schedule(5, "tcp", 60, 3, 0.6)
    fired = [f"{event.at:8.2f}s {event}" for event in schedule]
    early_c1 = next(line for line in fired[:-30] if " c1 " in line)
    early_c2 = next(line for line in fired[:-30] if " c2 " in line)
    result = Result(5, "tcp", 60.0, {}, {}, [Violation(1.0, "duplicate", "c1 got ('server', 0) "
                                                       "#3.0 in incarnation 0 and again in 1")],
                    schedule, fired, [(3.2, "c1.0", "close() could not finish its goodbye"),
                                      (4.0, "c2.0", "not connected")])
    text = report([result])
    assert "c1.0: close() could not finish its goodbye" in text
    assert "c2.0" not in text and early_c2 not in text
    assert early_c1 in text and fired[-1] in text
    assert report([dataclasses.replace(result, violations=[])]) == ""
