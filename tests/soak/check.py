"""The soak's invariants, judged from the peers' journals (see :mod:`tests.soak.peer`) and the
runner's own event log, continuously (:meth:`Checker.poll`) and at the end (:meth:`Checker.final`).

What is checked, each as it is stated in docs/guarantees.md:

* intact: every received item has the exact bytes its sender made (crc32 and content);
* nothing received that was not sent: every received item matches a put in its sender's journal
  (same sequence number, part and size);
* exactly once and in order per peer while a session lives: for one receiving process and one
  sending process, items arrive in strictly increasing (sequence, part) order, a put_many()
  batch whole and contiguous; the same item twice in one process is a violation; in two
  processes of the same name only when the first one vanished: SIGKILLed, or closed with a
  timeout that ran out (its goodbye never reached the peer, which resends what it had not seen
  acknowledged to the next process with that id: at least once across a process restart);
* nothing lost: a put whose future resolved without error was received by every peer it was
  addressed to, unless that peer's process was killed or closed after the put (its queue died
  with it, as documented);
* every future resolves exactly once (never twice; every one of a process that was not killed
  resolves), delivered or with ``ConnectionLost`` / ``ResourceClosed``;
* budgets: each process's RSS stays within its budget over its first sample;
* nothing outlives close(): no ``netq-`` thread, no extra descriptor;
* no thread of a peer process dies of an exception (its puts would look lost);
* every put() that blocked longer than ``stall_warning`` (+ slack) was announced by a WARNING on
  the ``netq`` logger within that time.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from pathlib import Path

ALLOWED_ERRORS = frozenset({"ConnectionLost", "ResourceClosed", "raised"})
# What put() itself may raise (no future made): the addressed peer left since the sender
# looked at comm.peers (ConnectionLost; UnknownPeer once its id is forgotten), or the
# communicator is being closed (ResourceClosed). MessageTooLarge, raised or in a future, is
# judged with the put's size.
RAISED_ERRORS = frozenset({"UnknownPeer", "ConnectionLost", "ResourceClosed"})
# How a process ended that leaves its peer holding its session, as for a process that vanished:
# SIGKILL, or close(timeout=) that ran out before its goodbye got through (a cut link).
VANISHED = frozenset({"kill", "gave_up"})
STALL_SLACK = 2.0  # seconds past stall_warning before a silent blocked put() is a violation


@dataclasses.dataclass
class Violation:
    t: float
    kind: str
    text: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.text}"


class Checker:
    """Reads ``<name>.<incarnation>.jsonl`` journals in ``directory`` as they grow."""

    def __init__(self, directory: Path, *, stall_warning: float, rss_budget: int,
                 message_limit: int | None = None) -> None:
        self.directory = Path(directory)
        self.stall_warning = stall_warning
        self.rss_budget = rss_budget
        self.message_limit = message_limit  # SerializationOptions.message_size of every peer
        self.offsets: dict[Path, int] = {}
        self.sent: dict[tuple, dict[int, tuple]] = collections.defaultdict(dict)
        self.done: dict[tuple, dict[int, list]] = collections.defaultdict(dict)
        self.last: dict[tuple, tuple] = {}  # (receiver, sender) -> last (seq, part, parts)
        self.seen: dict[str, dict[tuple, list]] = collections.defaultdict(dict)
        self.pending_recv: list[tuple] = []
        self.rss: dict[tuple, list[int]] = {}
        self.blocks: dict[tuple, list[tuple]] = collections.defaultdict(list)
        self.warns: dict[tuple, list[float]] = collections.defaultdict(list)
        self.warn_texts: list[tuple[float, tuple, str]] = []  # (when, process, text)
        self.closed: dict[tuple, tuple] = {}
        self.ended: dict[tuple, tuple[str, float]] = {}  # process -> (how, when)
        self.violations: list[Violation] = []
        self.checks = 0
        self.received_items = 0
        self.received_bytes = 0

    # ------------------------------------------------------------------ input

    def process_ended(self, name: str, incarnation: int, how: str, t: float) -> None:
        """The runner killed (``kill``) or closed (``close``; ``gave_up``: close(timeout=) ran
        out) that process at ``t``."""
        self.ended[(name, incarnation)] = (how, t)

    def _violate(self, t: float, kind: str, text: str) -> None:
        self.violations.append(Violation(t, kind, text))

    def _read(self) -> list[tuple[tuple, list]]:
        lines = []
        for path in sorted(self.directory.glob("*.jsonl")):
            name, incarnation = path.name[:-len(".jsonl")].rsplit(".", 1)
            process = (name, int(incarnation))
            offset = self.offsets.get(path, 0)
            with open(path, "rb") as journal:
                journal.seek(offset)
                data = journal.read()
            complete = data.rfind(b"\n") + 1  # a SIGKILL may leave half a line: wait for it
            self.offsets[path] = offset + complete
            for raw in data[:complete].splitlines():
                try:
                    lines.append((process, json.loads(raw)))
                except ValueError:
                    self._violate(0.0, "journal", f"{path.name}: unreadable line {raw[:80]!r}")
        return lines

    def poll(self) -> list[Violation]:
        """Take in what the journals gained; the new violations."""
        before = len(self.violations)
        lines = self._read()
        receipts = []
        for process, line in lines:
            kind, t = line[0], line[1]
            if kind == "sent":
                seq, parts, sizes, target = line[2:6]
                self.sent[process][seq] = (parts, sizes, target, t)
            elif kind == "done":
                error, raised = line[3], line[4]
                if raised and error in RAISED_ERRORS:
                    error = "raised"
                self.done[process].setdefault(line[2], []).append((t, error))
            elif kind == "recv":
                receipts.append((process, line))
            elif kind == "rss":
                self.rss.setdefault(process, []).append(line[2])
            elif kind == "start":
                self.rss.setdefault(process, []).append(line[3])
            elif kind == "block":
                self.blocks[process].append((line[2], line[3]))
            elif kind == "warn":
                self.warns[process].append(t)
                self.warn_texts.append((t, process, line[2]))
            elif kind == "closed":
                self.closed[process] = (line[2], line[3])
            elif kind == "crash":
                self._violate(t, "crash", f"{process}: thread {line[2]} died: {line[3]}")
            elif kind == "recv_error":
                self._violate(t, "get", f"{process}: get() raised {line[2]}: {line[3]}")
        for process, line in self.pending_recv + receipts:
            self._receipt(process, line, final=False)
        self.pending_recv = [entry for entry in self.pending_recv + receipts
                             if entry[1][-1] == "pending"]
        return self.violations[before:]

    def _receipt(self, receiver: tuple, line: list, *, final: bool) -> None:
        t, sender, incarnation, seq, part, parts, size, intact = line[1:9]
        source = (sender, incarnation)
        sent = self.sent.get(source, {}).get(seq)
        if sent is None:
            if final:
                self._violate(t, "unsent", f"{receiver} received {source} #{seq}.{part}, "
                              "which its sender never put")
            elif len(line) == 9:
                line.append("pending")
            return
        if len(line) == 10:
            line.pop()  # it was pending; judged now
        self.checks += 4
        self.received_items += 1
        self.received_bytes += size
        if not intact:
            self._violate(t, "corrupt", f"{receiver} got {source} #{seq}.{part}: bytes differ")
        sent_parts, sizes, _, _ = sent
        if max(1, sent_parts) != parts or part >= len(sizes) or sizes[part] != size:
            self._violate(t, "unsent", f"{receiver} got {source} #{seq}.{part} of {parts}, "
                          f"{size} B; sent: {sent_parts} parts, sizes {sizes}")
        key = (receiver, source)
        last = self.last.get(key)
        if last is not None:
            last_seq, last_part, last_parts = last
            if part > 0 and (last_seq, last_part) != (seq, part - 1):
                self._violate(t, "order", f"{receiver}: {source} batch #{seq} part {part} "
                              f"after #{last_seq}.{last_part}")
            elif part == 0 and (seq <= last_seq or last_part != last_parts - 1):
                self._violate(t, "order", f"{receiver}: {source} #{seq} after "
                              f"#{last_seq}.{last_part} of {last_parts}")
        self.last[key] = (seq, part, parts)
        holders = self.seen[receiver[0]].setdefault((source, seq, part), [])
        for earlier in holders:
            if earlier == receiver[1]:
                self._violate(t, "duplicate", f"{receiver} got {source} #{seq}.{part} twice")
            elif self.ended.get((receiver[0], earlier), ("", 0))[0] not in VANISHED:
                self._violate(t, "duplicate", f"{receiver[0]} got {source} #{seq}.{part} in "
                              f"incarnation {earlier} (not killed) and again in {receiver[1]}")
        holders.append(receiver[1])

    # ------------------------------------------------------------------ the end

    def final(self, restarts: dict[str, list[float]]) -> list[Violation]:
        """Everything the run is judged on once every process has ended. ``restarts``: per
        peer name, when each of its processes ended (kill, close or server restart)."""
        before = len(self.violations)
        self.poll()
        for process, line in self.pending_recv:
            self._receipt(process, line, final=True)
        self.pending_recv = []
        self._final_futures()
        self._final_losses(restarts)
        self._final_budgets()
        self._final_stalls()
        return self.violations[before:]

    def _final_futures(self) -> None:
        for process, sent in self.sent.items():
            killed = self.ended.get(process, ("", 0))[0] == "kill"
            done = self.done.get(process, {})
            for seq in sent:
                outcomes = done.get(seq, [])
                self.checks += 1
                if len(outcomes) > 1:
                    self._violate(outcomes[1][0], "future", f"{process} #{seq} resolved "
                                  f"{len(outcomes)} times: {outcomes}")
                elif not outcomes and not killed:
                    self._violate(sent[seq][3], "future", f"{process} #{seq} never resolved")
                oversize = (self.message_limit is not None
                            and sum(sent[seq][1]) > self.message_limit)
                for _, error in outcomes:
                    if error == "MessageTooLarge" and oversize:
                        continue  # a put_many() batch over the limit: the documented error
                    if error is not None and not ALLOWED_ERRORS.issuperset(error.split("+")):
                        self._violate(sent[seq][3], "future",
                                      f"{process} #{seq} failed with {error}")
            for seq in done.keys() - sent.keys():
                self._violate(0.0, "future", f"{process} resolved #{seq}, never put")

    def _final_losses(self, restarts: dict[str, list[float]]) -> None:
        received = {name: {(source, seq) for (source, seq, _part) in items}
                    for name, items in self.seen.items()}
        for source, sent in self.sent.items():
            done = self.done.get(source, {})
            for seq, (parts, _sizes, target, t) in sent.items():
                outcomes = done.get(seq, [])
                if not outcomes or outcomes[0][1] is not None:
                    continue
                names = ["server"] if target == "server" else [n for n in target.split(",") if n]
                for name in names:
                    self.checks += 1
                    if (source, seq) in received.get(name, ()):
                        continue
                    if any(ended >= t for ended in restarts.get(name, ())):
                        continue  # acknowledged, then lost with that process (documented)
                    self._violate(t, "lost", f"{source} #{seq} ({parts} parts) resolved as "
                                  f"delivered to {name}, which never received it")

    def _final_budgets(self) -> None:
        for process, samples in self.rss.items():
            self.checks += 1
            growth = max(samples) - samples[0]
            if growth > self.rss_budget:
                self._violate(0.0, "memory", f"{process}: RSS grew {growth / 2**20:.0f} MiB "
                              f"(budget {self.rss_budget / 2**20:.0f} MiB)")
        for process, (threads, fds) in self.closed.items():
            self.checks += 1
            if threads or fds > 0:
                self._violate(0.0, "leak", f"{process} after close(): threads {threads}, "
                              f"{fds} more descriptors")

    def _final_stalls(self) -> None:
        for process, blocks in self.blocks.items():
            for started, ended in blocks:
                if ended - started < self.stall_warning + STALL_SLACK:
                    continue
                self.checks += 1
                announced = any(started + self.stall_warning - 0.5 <= t <= ended + 1
                                for t in self.warns.get(process, ()))
                if not announced:
                    self._violate(started, "stall", f"{process}: put() blocked "
                                  f"{ended - started:.1f} s with no WARNING")

    def counts(self) -> dict:
        sent_items = sum(max(1, parts) for sent in self.sent.values()
                         for parts, *_ in sent.values())
        sent_bytes = sum(sum(sizes) for sent in self.sent.values()
                         for _, sizes, *_ in sent.values())
        return {"puts": sum(len(sent) for sent in self.sent.values()), "items": sent_items,
                "bytes": sent_bytes, "received_items": self.received_items,
                "received_bytes": self.received_bytes, "checks": self.checks,
                "violations": len(self.violations)}


def journal_path(directory: Path, name: str, incarnation: int) -> str:
    return os.fspath(Path(directory) / f"{name}.{incarnation}.jsonl")


def recheck(directory: Path, **settings) -> Checker:
    """Judge a kept run again (``--keep DIR``: ``DIR/<transport>``) from its journals and its
    runner.log: ``python -m tests.soak.check DIR/tcp``."""
    directory = Path(directory)
    checker = Checker(directory / "journals", **settings)
    restarts: dict[str, list[float]] = collections.defaultdict(list)
    with open(directory / "runner.log") as log:
        for line in log:
            record = json.loads(line)
            if record[0] == "ended":
                _, name, incarnation, how, t = record
                checker.process_ended(name, incarnation, how, t)
                restarts[name].append(t)
    checker.poll()
    checker.final(restarts)
    return checker


if __name__ == "__main__":
    import sys

    from .run import MESSAGE_LIMIT, RSS_BUDGET, STALL_WARNING

    for path in sys.argv[1:]:
        judged = recheck(Path(path), stall_warning=STALL_WARNING, rss_budget=RSS_BUDGET,
                         message_limit=MESSAGE_LIMIT)
        print(path, json.dumps(judged.counts()))
        for violation in judged.violations:
            print(f"  {violation}")
