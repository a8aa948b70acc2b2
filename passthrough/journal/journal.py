# SPDX-License-Identifier: Apache-2.0
"""The journal of changes made to a host: typed in memory, JSON only on disk.

``ROOT/var/lib/passthrough/journal.json`` holds every transaction, apply and undo alike,
in the order they happened. A file step records the hash of what was there before and of
what apply wrote, so that undo can tell "still ours" from "changed since" (drift), and
what it wrote as text (small text files) so that undo can merge a change made since. A
step keeps a backup of the file as it found it unless the step before it on that path left
exactly that: undo walks the file back through every step, newest first, and needs what
each found (the first step's is the original).
Generated outputs (grub.cfg, initramfs images, BLS entries) are never backed up; the
commands that made them are recorded, and re-run rather than restored.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from passthrough.actions import PlanRecord
from passthrough.errors import PassthroughError
from passthrough.host.root import HostRoot
from passthrough.journal import files
from passthrough.journal.journal_json import Fields, loads, record
from passthrough.journal.state import BACKUPS as BACKUPS
from passthrough.journal.state import JOURNAL as JOURNAL
from passthrough.journal.state import JOURNAL_LIMIT, own
from passthrough.journal.state import STATE as STATE

SCHEMA = "passthrough.journal/v2"
VERSION = 2


class TxKind(Enum):
    APPLY = "apply"
    UNDO = "undo"


class TxState(Enum):
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    UNDOING = "undoing"  # an undo began and has not finished (a backup was missing, say)
    UNDONE = "undone"


class StepKind(Enum):
    WRITE = "write"
    REMOVE = "remove"
    RUN = "run"
    SYSFS = "sysfs"  # a device attribute written: argv and undo_argv say how (devices.py)


class StepState(Enum):
    BEGUN = "begun"  # journaled before it touched anything: it may or may not have happened
    DONE = "done"
    FAILED = "failed"
    LISTED = "listed"  # a command shown, not run (a root where commands cannot run)
    UNDONE = "undone"  # a file step whose path undo has dealt with


# A command in one of these states has not (knowingly) succeeded: it stays pending.
UNFINISHED = frozenset({StepState.BEGUN, StepState.FAILED, StepState.LISTED})


class BadJournal(PassthroughError):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(
            f"{path}: {why}; nothing was changed: put back a good copy of the journal, or "
            f"move it aside and check by hand the files it names (their originals are under "
            f"{path.rsplit('/', 1)[0]}/backups)"
        )
        self.path = path


def sha256(data: bytes | None) -> str | None:
    return hashlib.sha256(data).hexdigest() if data is not None else None


@dataclass
class Step:
    """One journaled step of a transaction and its state."""

    n: int
    kind: StepKind
    state: StepState
    # file steps (write/remove)
    path: str | None = None
    existed: bool = False
    mode: int | None = None  # the original's mode, owner and group, which undo puts back
    uid: int | None = None
    gid: int | None = None
    before_sha256: str | None = None  # None: the file was absent
    backup: str | None = None  # what it found, unless the step before it left that
    written_sha256: str | None = None  # None: apply removed the file
    written: str | None = None  # what apply wrote (small text files), to find our own lines
    made_dirs: list[str] = field(default_factory=list)  # made for this file: undo removes them
    legacy: bool = False  # from a v1 journal: what was written is not known
    # command steps
    argv: list[str] = field(default_factory=list)
    regenerate: bool = False
    undo_argv: list[str] | None = None
    error: str | None = None

    @property
    def is_file(self) -> bool:
        return self.kind in (StepKind.WRITE, StepKind.REMOVE)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.n, "kind": self.kind.value, "state": self.state.value}
        if self.is_file:
            out.update(
                path=self.path,
                existed=self.existed,
                mode=self.mode,
                uid=self.uid,
                gid=self.gid,
                before_sha256=self.before_sha256,
                backup=self.backup,
                written_sha256=self.written_sha256,
                written=self.written,
            )
            if self.made_dirs:
                out["made_dirs"] = self.made_dirs
            if self.legacy:
                out["legacy"] = True
        else:
            out.update(argv=self.argv, regenerate=self.regenerate, undo_argv=self.undo_argv)
        if self.error:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, f: Fields) -> Step:
        backup = f.path("backup")
        if backup is not None and not backup.startswith(BACKUPS + "/"):
            raise ValueError(f"backup {backup[:80]!r} is not in {BACKUPS}")
        return cls(
            n=f.integer("n"),
            kind=StepKind(f.text("kind")),
            state=StepState(f.text("state")),
            path=f.path("path"),
            existed=f.flag("existed"),
            mode=f.opt_integer("mode", hi=0o7777),
            uid=f.opt_integer("uid"),
            gid=f.opt_integer("gid"),
            before_sha256=f.sha("before_sha256"),
            backup=backup,
            written_sha256=f.sha("written_sha256"),
            written=f.opt_text("written"),
            made_dirs=f.paths("made_dirs"),
            legacy=f.flag("legacy"),
            argv=f.texts("argv"),
            regenerate=f.flag("regenerate"),
            undo_argv=f.opt_texts("undo_argv"),
            error=f.opt_text("error"),
        )


@dataclass
class Transaction:
    """One apply or undo as the journal keeps it, step by step."""

    id: str
    kind: TxKind
    state: TxState
    started: float
    steps: list[Step] = field(default_factory=list)
    # apply: what verify needs of the plan (cards, functions, kernel_args, binding, ...)
    record: PlanRecord | None = None
    # apply: the kernel arguments this transaction added and the keys it dropped
    args_set: list[str] = field(default_factory=list)
    args_dropped: list[str] = field(default_factory=list)
    finished: float | None = None
    undone: float | None = None
    undid: list[str] = field(default_factory=list)  # undo: the apply transactions reverted
    restored: list[str] = field(default_factory=list)  # undo: paths put back or cleaned

    def file_steps(self) -> list[Step]:
        return [s for s in self.steps if s.is_file]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "state": self.state.value,
            "started": self.started,
            "finished": self.finished,
            "undone": self.undone,
            "record": self.record.to_json() if self.record else {},
            "args_set": self.args_set,
            "args_dropped": self.args_dropped,
            "undid": self.undid,
            "restored": self.restored,
            "steps": [s.to_json() for s in self.steps],
        }

    @classmethod
    def from_json(cls, f: Fields) -> Transaction:
        return cls(
            id=f.ident("id"),
            kind=TxKind(f.text("kind", "apply")),
            state=TxState(f.text("state")),
            started=f.number("started", 0.0),
            steps=[Step.from_json(s) for s in f.objects("steps")],
            record=_record(f.obj("record")),
            args_set=f.texts("args_set"),
            args_dropped=f.texts("args_dropped"),
            finished=f.opt_number("finished"),
            undone=f.opt_number("undone"),
            undid=f.texts("undid"),
            restored=f.paths("restored"),
        )


RECORD_KEYS = ("cards", "functions", "kernel_args", "binding", "bootloader")


def _record(f: Fields) -> PlanRecord | None:
    """An apply's plan record as stored (v2: under ``record``; v1: inline in the
    transaction, next to its own keys); None where there is none (undo, an empty apply)."""
    if not any(k in f.d for k in RECORD_KEYS):
        return None
    return record(f)


def _from_v1(root: HostRoot, t: Fields) -> Transaction:
    """A transaction as journal v1 wrote it: the plan's record inline, file steps with a
    ``files`` list, and command steps carrying backups of their outputs (grub.cfg, every
    initrd) — those were generated files: they are dropped here and pruned."""
    steps: list[Step] = []
    for s in t.objects("steps"):
        n, state = s.integer("n"), StepState(s.text("state"))
        if s.text("kind") == "run":
            steps.append(
                Step(
                    n=n,
                    kind=StepKind.RUN,
                    state=state,
                    argv=s.texts("argv"),
                    regenerate=s.flag("regenerate"),
                    undo_argv=s.opt_texts("undo_argv"),
                )
            )
            continue
        for f in s.objects("files"):
            backup = f.path("backup")
            before = files.read_own(own(root, backup)) if backup else None
            steps.append(
                Step(
                    n=n,
                    kind=StepKind(s.text("kind")),
                    state=state,
                    path=f.path("path") or "",
                    existed=f.flag("existed"),
                    mode=f.opt_integer("mode", hi=0o7777),
                    before_sha256=sha256(before),
                    backup=backup,
                    legacy=True,
                )
            )
    ka = t.obj("kernel_args")
    return Transaction(
        id=t.ident("id"),
        kind=TxKind.APPLY,
        state=TxState(t.text("state")),
        started=t.number("started", 0.0),
        steps=steps,
        record=_record(t),
        args_set=ka.texts("set"),
        args_dropped=ka.texts("remove"),
        finished=t.opt_number("finished"),
        undone=t.opt_number("undone"),
    )


def parse(root: HostRoot, raw: bytes) -> list[Transaction]:
    """The transactions of a journal's bytes; ValueError naming the first problem."""
    top = Fields(loads(raw), "the journal")
    if top.d.get("version") == VERSION:
        return [Transaction.from_json(t) for t in top.objects("transactions")]
    if top.d.get("schema") == "passthrough.journal/v1":
        return [_from_v1(root, t) for t in top.objects("transactions")]
    raise ValueError(f"unknown journal version {str(top.d.get('version'))[:20]!r}")


@dataclass
class Journal:
    """A root's journal: every apply and undo made there, in order."""

    root: HostRoot
    transactions: list[Transaction]

    def begin(self, kind: TxKind, **fields: Any) -> Transaction:
        """A new running transaction, journaled (saved) before any of its steps."""
        tx = Transaction(
            id=time.strftime("%Y%m%dT%H%M%S") + f"-{len(self.transactions)}",
            kind=kind,
            state=TxState.RUNNING,
            started=time.time(),
            **fields,
        )
        self.transactions.append(tx)
        self.save()
        return tx

    @classmethod
    def load(cls, root: HostRoot) -> Journal:
        """The journal, every field checked (BadJournal, exit 2, before anything is done)."""
        where = own(root, JOURNAL)
        try:
            raw = files.read_own(where, JOURNAL_LIMIT)
        except OSError as exc:
            raise BadJournal(where, f"cannot be read ({exc.strerror})") from None
        if raw is None:
            return cls(root, [])
        try:
            return cls(root, parse(root, raw))
        except ValueError as exc:  # JSON, types, ranges, enums, paths (UnicodeError too)
            raise BadJournal(where, f"the journal is damaged ({str(exc)[:200]})") from None
        except OSError as exc:
            raise BadJournal(where, f"a backup it names cannot be read ({exc.strerror})") from None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "transactions": [t.to_json() for t in self.transactions],
        }

    def save(self) -> None:
        # files.atomic_write looked up at each call: the kill test replaces the writer to
        # stop the process at every write, journal saves included
        data = (json.dumps(self.to_json(), indent=2) + "\n").encode()
        files.atomic_write(own(self.root, JOURNAL), data, 0o600, keep=False)

    def live(self) -> list[Transaction]:
        """Apply transactions not (yet entirely) undone, oldest first."""
        return [
            t for t in self.transactions if t.kind is TxKind.APPLY and t.state is not TxState.UNDONE
        ]

    def last_step(self, path: str) -> Step | None:
        """The newest live step on ``path`` (None: no live transaction changed it)."""
        found = None
        for tx in self.live():
            for s in tx.file_steps():
                if s.path == path and s.state is not StepState.UNDONE:
                    found = s
        return found

    def pending(self, regenerations: bool = False) -> list[tuple[Transaction, Step]]:
        """Commands whose latest attempt failed, was listed or cut off, in that order (an undo
        supersedes what it reverted); ``regenerations``: only those, which apply re-runs."""
        latest: dict[tuple[str, ...], tuple[Transaction, Step]] = {}
        for tx in self.transactions:
            if tx.kind is TxKind.UNDO:
                for key, (owner, step) in list(latest.items()):
                    if owner.id in tx.undid and not step.regenerate:
                        del latest[key]
            for step in tx.steps:
                if step.kind is StepKind.RUN and step.state is not StepState.UNDONE:
                    latest.pop(tuple(step.argv), None)  # in the order of their latest attempt
                    latest[tuple(step.argv)] = (tx, step)
        wanted = [(tx, s) for tx, s in latest.values() if s.state in UNFINISHED]
        return [(tx, s) for tx, s in wanted if s.regenerate or not regenerations]

    def referenced_backups(self) -> set[str]:
        return {
            s.backup
            for tx in self.live()
            for s in tx.file_steps()
            if s.backup and s.state is not StepState.UNDONE
        }

    def written_through_temps(self) -> list[str]:
        """Every file a run of ours writes through a temporary file (the journal, the paths
        its steps name, their backups): where a killed run may have left one."""
        root = self.root
        out = [own(root, JOURNAL)]
        for tx in self.transactions:
            for s in tx.file_steps():
                out += [root.real(s.path)] if s.path else []
                out += [own(root, s.backup)] if s.backup else []
        return out

    def remove_temps(self) -> None:
        for path in self.written_through_temps():
            files.remove_temp(path)

    def settle(self) -> bool:
        """Steps cut off (or failed) before they changed their file: nothing of theirs is
        on the host, and none keeps the original for a later step (its backup may never
        have been written). Marked undone; True when there was one."""
        found = False
        for tx in self.live():
            for s in tx.file_steps():
                if s.state not in (StepState.BEGUN, StepState.FAILED) or s.path is None:
                    continue
                if sha256(files.read_file(self.root, s.path)) == s.before_sha256:
                    s.state = StepState.UNDONE
                    s.error = "cut off before it changed the file"
                    found = True
        return found
