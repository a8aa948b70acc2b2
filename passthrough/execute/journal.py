"""The journal of changes made to a host: typed in memory, JSON only on disk.

``ROOT/var/lib/passthrough/journal.json`` holds every transaction, apply and undo alike,
in the order they happened. A file step records the hash of what was there before and of
what apply wrote, so that undo can tell "still ours" from "changed since" (drift). Only
the first live step on a path keeps a backup: that is the original undo returns to.
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

from passthrough.errors import PassthroughError
from passthrough.execute import files
from passthrough.host.root import HostRoot
from passthrough.plan.actions import PlanRecord

STATE = "var/lib/passthrough"
JOURNAL = f"{STATE}/journal.json"
BACKUPS = f"{STATE}/backups"
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
        super().__init__(f"{path}: {why}; nothing was changed")


def sha256(data: bytes | None) -> str | None:
    return hashlib.sha256(data).hexdigest() if data is not None else None


def _inside(rel: str | None) -> str | None:
    """A path from the journal, which undo will write: relative and never climbing out
    (a journal is a file under the root, and the root may be someone else's image)."""
    if rel is None:
        return None
    if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/") or not rel:
        raise ValueError(f"path {rel!r} is not inside the root")
    return rel


@dataclass
class Step:
    n: int
    kind: StepKind
    state: StepState
    # file steps (write/remove)
    path: str | None = None
    existed: bool = False
    mode: int | None = None
    before_sha256: str | None = None  # None: the file was absent
    backup: str | None = None  # only on the first live step of a path
    written_sha256: str | None = None  # None: apply removed the file
    written: str | None = None  # what apply wrote (small text files), to find our own lines
    legacy: bool = False  # from a v1 journal: what was written is not known
    # command steps
    argv: list[str] = field(default_factory=list)
    regenerate: bool = False
    undo_argv: list[str] | None = None
    error: str | None = None

    @property
    def is_file(self) -> bool:
        return self.kind is not StepKind.RUN

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.n, "kind": self.kind.value, "state": self.state.value}
        if self.is_file:
            out.update(
                path=self.path,
                existed=self.existed,
                mode=self.mode,
                before_sha256=self.before_sha256,
                backup=self.backup,
                written_sha256=self.written_sha256,
                written=self.written,
            )
            if self.legacy:
                out["legacy"] = True
        else:
            out.update(argv=self.argv, regenerate=self.regenerate, undo_argv=self.undo_argv)
        if self.error:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Step:
        return cls(
            n=int(d["n"]),
            kind=StepKind(d["kind"]),
            state=StepState(d["state"]),
            path=_inside(d.get("path")),
            existed=bool(d.get("existed", False)),
            mode=d.get("mode"),
            before_sha256=d.get("before_sha256"),
            backup=_inside(d.get("backup")),
            written_sha256=d.get("written_sha256"),
            written=d.get("written"),
            legacy=bool(d.get("legacy", False)),
            argv=list(d.get("argv") or []),
            regenerate=bool(d.get("regenerate", False)),
            undo_argv=d.get("undo_argv"),
            error=d.get("error"),
        )


@dataclass
class Transaction:
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
    def from_json(cls, d: dict[str, Any]) -> Transaction:
        return cls(
            id=str(d["id"]),
            kind=TxKind(d.get("kind", "apply")),
            state=TxState(d["state"]),
            started=float(d.get("started", 0.0)),
            steps=[Step.from_json(s) for s in d.get("steps", [])],
            record=_record(d.get("record")),
            args_set=list(d.get("args_set") or []),
            args_dropped=list(d.get("args_dropped") or []),
            finished=d.get("finished"),
            undone=d.get("undone"),
            undid=list(d.get("undid") or []),
            restored=list(d.get("restored") or []),
        )


RECORD_KEYS = ("cards", "functions", "kernel_args", "binding", "bootloader")


def _record(d: dict[str, Any] | None) -> PlanRecord | None:
    """An apply's plan record as stored (v2: under ``record``; v1: inline in the
    transaction, next to its own keys); None where there is none (undo, an empty apply)."""
    if not d or not any(k in d for k in RECORD_KEYS):
        return None
    return PlanRecord.from_json(d)


def _from_v1(root: HostRoot, d: dict[str, Any]) -> Transaction:
    """A transaction as journal v1 wrote it: the plan's record inline, file steps with a
    ``files`` list, and command steps carrying backups of their outputs (grub.cfg, every
    initrd) — those were generated files: they are dropped here and pruned."""
    steps: list[Step] = []
    for s in d.get("steps", []):
        state = StepState(s["state"])
        if s["kind"] == "run":
            steps.append(
                Step(
                    n=int(s["n"]),
                    kind=StepKind.RUN,
                    state=state,
                    argv=list(s.get("argv") or []),
                    regenerate=bool(s.get("regenerate")),
                    undo_argv=s.get("undo_argv"),
                )
            )
            continue
        for f in s.get("files", []):
            backup = _inside(f.get("backup"))
            before = root.read_bytes(backup) if backup else None
            steps.append(
                Step(
                    n=int(s["n"]),
                    kind=StepKind(s["kind"]),
                    state=state,
                    path=_inside(f["path"]),
                    existed=bool(f["existed"]),
                    mode=f.get("mode"),
                    before_sha256=sha256(before),
                    backup=backup,
                    legacy=True,
                )
            )
    ka = d.get("kernel_args") or {}
    return Transaction(
        id=str(d["id"]),
        kind=TxKind.APPLY,
        state=TxState(d["state"]),
        started=float(d.get("started", 0.0)),
        steps=steps,
        record=_record(d),
        args_set=list(ka.get("set") or []),
        args_dropped=list(ka.get("remove") or []),
        finished=d.get("finished"),
        undone=d.get("undone"),
    )


@dataclass
class Journal:
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
        raw = root.read_bytes(JOURNAL)
        if raw is None:
            return cls(root, [])
        where = root.abs(JOURNAL)
        try:
            data = json.loads(raw)
            if data.get("version") == VERSION:
                txs = [Transaction.from_json(t) for t in data["transactions"]]
            elif data.get("schema") == "passthrough.journal/v1":
                txs = [_from_v1(root, t) for t in data["transactions"]]
            else:
                raise BadJournal(where, f"unknown journal version {data.get('version')!r}")
        except (json.JSONDecodeError, AttributeError):
            raise BadJournal(where, "the journal is not valid JSON") from None
        except (KeyError, ValueError, TypeError) as exc:
            raise BadJournal(where, f"the journal is damaged ({exc!s})") from None
        return cls(root, txs)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "transactions": [t.to_json() for t in self.transactions],
        }

    def save(self) -> None:
        # files.atomic_write looked up at each call: the kill test replaces the writer to
        # stop the process at every write, journal saves included
        files.atomic_write(
            self.root.real(JOURNAL), (json.dumps(self.to_json(), indent=2) + "\n").encode(), 0o600
        )

    def live(self) -> list[Transaction]:
        """Apply transactions not (yet entirely) undone, oldest first."""
        return [
            t for t in self.transactions if t.kind is TxKind.APPLY and t.state is not TxState.UNDONE
        ]

    def original_step(self, path: str) -> Step | None:
        """The first live step on ``path``: the one whose backup holds the original."""
        for tx in self.live():
            for s in tx.file_steps():
                if s.path == path and s.state is not StepState.UNDONE:
                    return s
        return None

    def pending(self) -> list[tuple[Transaction, Step]]:
        """Commands whose latest attempt did not succeed (failed, only listed, or cut off),
        in the order of those attempts. An undo supersedes the commands of the transactions it reverted;
        a later successful run of the same command settles an earlier one."""
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
        return [(tx, s) for tx, s in latest.values() if s.state in UNFINISHED]

    def referenced_backups(self) -> set[str]:
        return {
            s.backup
            for tx in self.live()
            for s in tx.file_steps()
            if s.backup and s.state is not StepState.UNDONE
        }
