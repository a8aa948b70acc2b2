# SPDX-License-Identifier: Apache-2.0
"""`passthrough status`: what the journal says was done to this host, and what is left.

Per transaction: its id, time and state, the files and kernel arguments it changed, and
for each file whether it still holds what apply wrote (drift). Then every command that is
pending because it failed, was cut off, or could only be listed.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import asdict, field
from typing import Any

from passthrough.host.root import HostRoot
from passthrough.journal.files import read_file, temp_of
from passthrough.journal.journal import (
    Journal,
    Step,
    StepKind,
    StepState,
    Transaction,
    TxKind,
    TxState,
    sha256,
)
from passthrough.journal.newentries import StrangeEntry, strangers
from passthrough.records import frozen


@frozen
class FileStatus:
    path: str
    change: str  # created, modified, removed
    # as-written, not-written (the step never wrote), changed-since, deleted-since,
    # recreated-since, unknown, undone, superseded; cut-off (an undo's write that a kill
    # or a full disk interrupted: the next undo finishes it)
    drift: str


def _found_by(transactions: list[Transaction], ids: list[str]) -> dict[str, str | None]:
    """What the earliest of these transactions to touch each path found there: its sha256
    (None: the file was absent)."""
    first: dict[str, str | None] = {}
    for tx in transactions:
        if tx.id in ids:
            for s in tx.file_steps():
                if s.path is not None and s.path not in first:
                    first[s.path] = s.before_sha256 if s.existed else None
    return first


def _undone_as(path: str, wrote: dict[str, str | None], found: dict[str, str | None]) -> str:
    """How an undo left ``path``: removed, restored (the bytes the applies found), or
    "ours out" (our lines taken out, an edit made since apply kept). A path the undo did
    not write was already as the applies found it."""
    if path not in wrote:
        return "removed" if found.get(path) is None else "restored"
    if wrote[path] is None:
        return "removed"
    return "restored" if wrote[path] == found.get(path) else "ours out"


@frozen
class TxStatus:
    id: str
    kind: str
    state: str
    started: str
    files: list[FileStatus] = field(default_factory=list)
    args_set: list[str] = field(default_factory=list)
    args_dropped: list[str] = field(default_factory=list)
    undid: list[str] = field(default_factory=list)


@frozen
class PendingCommand:
    argv: list[str]
    state: str  # listed, failed, begun
    transaction: str
    regenerate: bool
    error: str | None


@frozen
class Status:
    root: str
    transactions: list[TxStatus]
    pending: list[PendingCommand]
    # temporary files of ours a killed run left (/etc/.X.passthrough-tmp): the next apply
    # or undo removes them
    temporary_files: list[str] = field(default_factory=list)
    # loader entries our journal does not know (a kernel update's) that carry or lack ours
    new_entries: list[StrangeEntry] = field(default_factory=list)

    @property
    def drifted(self) -> list[str]:
        return [
            f.path
            for t in self.transactions
            for f in t.files
            if f.drift
            not in ("as-written", "not-written", "undone", "superseded", "unknown", "cut-off")
        ]


def _drift(root: HostRoot, step: Step) -> str:
    if step.state is StepState.UNDONE:
        return "undone"
    if step.legacy:
        return "unknown"
    now = sha256(read_file(root, step.path or ""))
    if now == step.written_sha256:
        return "as-written"
    if step.state is not StepState.DONE and now == step.before_sha256:
        return "not-written"  # cut off before it wrote: nothing of ours is there
    if now is None:
        return "deleted-since"
    return "recreated-since" if step.written_sha256 is None else "changed-since"


def status(root: HostRoot) -> Status:
    journal = Journal.load(root)
    last: dict[str, Step] = {}
    for tx in journal.live():
        for s in tx.file_steps():
            if s.path is not None and s.state is not StepState.UNDONE:
                last[s.path] = s
    out: list[TxStatus] = []
    for tx in journal.transactions:
        files: list[FileStatus] = []
        for s in tx.file_steps():
            change = (
                "removed" if s.kind is StepKind.REMOVE else ("modified" if s.existed else "created")
            )
            live = tx.state is not TxState.UNDONE and s.state is not StepState.UNDONE
            if live and s.path is not None and last.get(s.path) is not s:
                drift = "superseded"
            else:
                drift = _drift(root, s) if live else "undone"
            files.append(FileStatus(s.path or "", change, drift))
        if tx.kind is TxKind.UNDO:
            found = _found_by(journal.transactions, tx.undid)
            wrote = {s.path or "": s.written_sha256 for s in tx.file_steps()}
            files = [FileStatus(p, _undone_as(p, wrote, found), "undone") for p in tx.restored]
            # a write this undo journaled and never saw through: the next undo finishes it
            files += [
                FileStatus(s.path or "", "restoring", "cut-off")
                for s in tx.file_steps()
                if s.state is StepState.BEGUN and s.path not in tx.restored
            ]
        out.append(
            TxStatus(
                id=tx.id,
                kind=tx.kind.value,
                state=tx.state.value,
                started=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(tx.started)),
                files=files,
                args_set=tx.args_set,
                args_dropped=tx.args_dropped,
                undid=tx.undid,
            )
        )
    pending = [
        PendingCommand(s.argv, s.state.value, tx.id, s.regenerate, s.error)
        for tx, s in journal.pending()
    ]
    temps = {temp_of(p) for p in journal.written_through_temps()}
    left = sorted("/" + os.path.relpath(t, root.path) for t in temps if os.path.lexists(t))
    return Status(root.path, out, pending, left, strangers(root, journal.live()))


def status_json(st: Status) -> dict[str, Any]:
    return {
        "schema": "passthrough.status/v1",
        "root": st.root,
        "transactions": [
            {**asdict(t), "files": [{**asdict(f), "path": "/" + f.path} for f in t.files]}
            for t in st.transactions
        ],
        "drifted": ["/" + p for p in st.drifted],
        "pending": [asdict(p) for p in st.pending],
        "temporary_files": st.temporary_files,
        "new_entries": [{**asdict(e), "path": "/" + e.path} for e in st.new_entries],
    }


def _temps_text(st: Status) -> list[str]:
    if not st.temporary_files:
        return []
    return [
        "Temporary files left by a cut-off run (the next `passthrough apply` or "
        "`passthrough undo` removes them): " + ", ".join(st.temporary_files)
    ]


def _entries_text(st: Status) -> list[str]:
    """The loader entries written after apply, each with what it carries or lacks."""
    lines: list[str] = []
    for e in st.new_entries:
        if e.carries:
            lines.append(
                f"Loader entry /{e.path} carries our {' '.join(e.carries)} but our journal "
                "did not write it (a kernel update copied them): `passthrough undo` takes "
                "them out of it too"
            )
        if e.lacks:
            lines.append(
                f"Loader entry /{e.path} lacks {' '.join(e.lacks)} (written after apply, by "
                "a kernel update): booting it gives no passthrough; `passthrough apply` adds "
                "them"
            )
    return lines


def status_text(st: Status) -> str:
    if not st.transactions:
        return "\n".join(["Nothing has been applied to this host (no journal).", *_temps_text(st)])
    lines: list[str] = []
    for t in st.transactions:
        what = f" (undoes {', '.join(t.undid)})" if t.undid else ""
        if t.state == "running":  # killed, or out of disk space, unless it runs right now
            what += " — cut off unless still running: `passthrough undo` takes it from here"
        lines.append(f"{t.id}  {t.started}  {t.kind} {t.state}{what}")
        for f in t.files:
            lines.append(f"  {f.change:<9} /{f.path}  [{f.drift}]")
        if t.args_set or t.args_dropped:
            args = " ".join([*(f"+{a}" for a in t.args_set), *(f"-{a}" for a in t.args_dropped)])
            # a transaction cut off part-way may not have written the file that carries them
            planned = " (planned; see the files above)" if t.state in ("running", "failed") else ""
            lines.append(f"  kernel args{planned} {args}")
    strange = _entries_text(st)
    if strange:
        lines += ["", *strange]
    if st.drifted:
        lines.append("")
        lines.append(
            "Changed since apply: "
            + ", ".join("/" + p for p in st.drifted)
            + " — undo removes only our lines where it can tell them apart, else refuses "
            "(--force puts our backup back)."
        )
    lines.append("")
    if st.pending:
        lines.append(
            "Pending commands (failed, cut off or only listed: run them; where commands can "
            "run, `passthrough apply` re-runs a pending regeneration):"
        )
        for p in st.pending:
            why = f": {p.error}" if p.error else ""
            lines.append(f"  {shlex.join(p.argv)}  [{p.state} in {p.transaction}{why}]")
    else:
        lines.append("No command pending.")
    return "\n".join(lines + _temps_text(st))
