"""Undo: return every source file apply edited to its original, then regenerate.

The world moves on between apply and undo: a kernel update adds a boot entry and an
initramfs, an admin adds a line to a file we edited. So:

- a file that still holds exactly what apply wrote is put back from its backup (or
  removed, when apply created it);
- a file changed since loses only our own lines where that is unambiguous (drift.py);
  otherwise undo stops before changing anything and names each such file (``--force``
  puts our backup back anyway, losing the later changes, and says so);
- generated outputs (grub.cfg, initramfs images, BLS entries) are never put back: the
  plan's own tools run again, for every kernel installed now. Where commands cannot run,
  they are listed and stay pending (``passthrough status``);
- a missing backup does not stop the rest: the others are restored, the missing one is
  named (exit 3), and running undo again finishes once it is back (or ``--force`` leaves
  that file as it is).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from passthrough.errors import EXIT_HOST_STEP, PassthroughError
from passthrough.execute.apply import (
    Runner,
    _default_runner,
    locked,
    prune_backups,
    run_command,
)
from passthrough.execute.drift import Ambiguous, unpick
from passthrough.execute.files import atomic_write, read_file, remove
from passthrough.execute.journal import (
    JOURNAL,
    Journal,
    Step,
    StepKind,
    StepState,
    Transaction,
    TxKind,
    TxState,
    sha256,
)
from passthrough.host.root import HostRoot


class DriftRefused(PassthroughError):
    """Files changed since apply in a way undo cannot take apart: nothing was changed."""

    def __init__(self, drifted: dict[str, str]) -> None:
        names = ", ".join(f"/{p} ({why})" for p, why in drifted.items())
        super().__init__(
            f"changed since apply, nothing undone: {names}; check them, then "
            "`passthrough undo --force` puts our backups back and loses those changes"
        )
        self.drifted = drifted


class UndoIncomplete(PassthroughError):
    exit_code = EXIT_HOST_STEP

    def __init__(self, missing: list[str], failed: list[str]) -> None:
        parts = []
        if missing:
            parts.append(
                "backup missing for "
                + ", ".join("/" + p for p in missing)
                + " (left as it is; the rest is restored): put the backup back and run "
                "`passthrough undo` again, or `passthrough undo --force` to leave it"
            )
        if failed:
            parts.append(
                "files restored but "
                + "; ".join(failed)
                + ": `passthrough status` shows it pending, `passthrough apply` or "
                "`passthrough undo` runs it again"
            )
        super().__init__("; ".join(parts))
        self.missing = missing
        self.failed = failed


@dataclass
class UndoResult:
    restored: list[str] = field(default_factory=list)  # back to the original bytes
    unpicked: list[str] = field(default_factory=list)  # changed since: only our lines removed
    forced: list[str] = field(default_factory=list)  # changed since: later changes lost
    commands: list[Step] = field(default_factory=list)  # regenerations and inverse commands

    @property
    def changed(self) -> list[str]:
        return self.restored + self.unpicked + self.forced

    @property
    def listed(self) -> list[list[str]]:
        """Commands that could only be listed: to run inside the root."""
        return [s.argv or [] for s in self.commands if s.state is StepState.LISTED]

    def to_json(self) -> dict[str, Any]:
        return {
            "restored": ["/" + p for p in self.restored],
            "unpicked": ["/" + p for p in self.unpicked],
            "forced": ["/" + p for p in self.forced],
            "commands": [s.to_json() for s in self.commands],
            "commands_not_run": self.listed,
        }


# -- deciding, per path, before anything changes ----------------------------------------


@dataclass
class Decision:
    path: str
    steps: list[Step]  # the live steps on this path, oldest first
    action: str  # "restore", "unpick", "nothing", "drifted", "missing"
    content: bytes | None = None  # what to write for "restore"/"unpick" (None: remove)
    why: str = ""


def _ours(steps: list[Step]) -> set[str | None]:
    """The hashes the file may have if nobody touched it since apply."""
    last = steps[-1]
    if last.state is StepState.DONE:
        return {last.written_sha256}
    return {last.written_sha256, last.before_sha256}  # begun/failed: before or after


def _decide(root: HostRoot, path: str, steps: list[Step], txs: list[Transaction]) -> Decision:
    first, last = steps[0], steps[-1]
    current = read_file(root, path)
    now = sha256(current)
    original: bytes | None = None
    if first.existed:
        original = read_file(root, first.backup) if first.backup else None
        if original is None:
            if now == first.before_sha256:
                return Decision(path, steps, "nothing")
            return Decision(path, steps, "missing", why=first.backup or "no backup recorded")
    if now == first.before_sha256 and (current is not None) == first.existed:
        return Decision(path, steps, "nothing")
    if last.legacy or now in _ours(steps):
        return Decision(path, steps, "restore", original)
    if current is None:
        return Decision(path, steps, "drifted", original, why="deleted since apply")
    if last.kind is StepKind.REMOVE or last.written is None:
        return Decision(path, steps, "drifted", original, why="recreated since apply")
    args_set = [a for tx in txs for a in tx.args_set]
    args_dropped = [a for tx in txs for a in tx.args_dropped]
    result = unpick(path, original or b"", last.written.encode(), current, args_set, args_dropped)
    if isinstance(result, Ambiguous):
        return Decision(path, steps, "drifted", original, why=result.why)
    return Decision(path, steps, "unpick", result.content)


def _decisions(journal: Journal, targets: list[Transaction]) -> list[Decision]:
    by_path: dict[str, list[Step]] = {}
    for tx in targets:
        for step in tx.file_steps():
            if step.state is not StepState.UNDONE and step.path is not None:
                by_path.setdefault(step.path, []).append(step)
    return [_decide(journal.root, p, steps, targets) for p, steps in by_path.items()]


def _commands(targets: list[Transaction]) -> list[Step]:
    """Inverse commands (newest first), then each regeneration once, in plan order."""
    inverse: list[list[str]] = []
    regenerate: list[list[str]] = []
    for tx in reversed(targets):
        for step in reversed(tx.steps):
            if step.kind is StepKind.RUN and step.undo_argv and step.undo_argv not in inverse:
                inverse.append(step.undo_argv)
    for tx in targets:
        for step in tx.steps:
            if step.kind is StepKind.RUN and step.regenerate and step.argv not in regenerate:
                regenerate.append(step.argv)
    argvs = inverse + regenerate
    return [
        Step(n=i, kind=StepKind.RUN, state=StepState.BEGUN, argv=a, regenerate=a in regenerate)
        for i, a in enumerate(argvs)
    ]


# -- doing it ---------------------------------------------------------------------------


def _put(root: HostRoot, d: Decision) -> None:
    if d.content is None:
        remove(root.real(d.path, follow_final=False))
    else:
        first = d.steps[0]
        atomic_write(root.real(d.path), d.content, first.mode if first.existed else None)


def undo(
    root: HostRoot,
    runner: Runner = _default_runner,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
) -> UndoResult:
    """Undo every apply not yet undone (see the module's docstring). Raises DriftRefused
    (nothing changed) or UndoIncomplete (the rest done, exit 3)."""
    say = progress or (lambda _m: None)
    result = UndoResult()
    if not root.exists(JOURNAL):
        return result  # never applied here: nothing to undo, and nothing to write (no lock)
    Journal.load(root)  # a damaged journal is refused before even the lock file is made
    with locked(root):
        journal = Journal.load(root)
        targets = journal.live()
        if not targets:
            return _rerun_pending(journal, runner, say, result)
        decisions = _decisions(journal, targets)
        drifted = {d.path: d.why for d in decisions if d.action == "drifted"}
        if drifted and not force:
            raise DriftRefused(drifted)
        for t in targets:
            t.state = TxState.UNDOING
        tx = journal.begin(TxKind.UNDO, undid=[t.id for t in targets])
        missing: list[str] = []
        for d in reversed(decisions):  # newest paths first, as they were made
            if d.action == "missing":
                if not force:
                    say(f"backup missing: /{d.path} left as it is ({d.why})")
                    missing.append(d.path)
                    continue
                say(f"--force: /{d.path} left as it is (its backup {d.why} is gone)")
            elif d.action == "drifted":
                lost = (
                    "removed since apply"
                    if not os.path.lexists(root.real(d.path, follow_final=False))
                    else "edited"
                )
                say(f"--force: restore /{d.path} from backup; what was {lost} since apply is lost")
                _put(root, d)
                result.forced.append(d.path)
            elif d.action == "unpick":
                say(f"remove our lines from /{d.path} (changed since apply: the rest is kept)")
                _put(root, d)
                result.unpicked.append(d.path)
            elif d.action == "restore":
                say(f"restore /{d.path}")
                _put(root, d)
                result.restored.append(d.path)
            for step in d.steps:
                step.state = StepState.UNDONE
            tx.restored.append(d.path)
            journal.save()
        failed = _run_all(journal, tx, _commands(targets), runner, say, result)
        if missing:
            tx.state = TxState.FAILED
        else:
            for t in targets:
                t.state = TxState.UNDONE
                t.undone = time.time()
            tx.state = TxState.FAILED if failed else TxState.COMPLETE
        tx.finished = time.time()
        journal.save()
        prune_backups(journal)
        if missing or failed:
            raise UndoIncomplete(missing, failed)
        return result


def _run_all(
    journal: Journal,
    tx: Transaction,
    steps: list[Step],
    runner: Runner,
    say: Callable[[str], None],
    result: UndoResult,
) -> list[str]:
    """Every command runs even if one fails: each regenerates something different."""
    failed: list[str] = []
    for step in steps:
        tx.steps.append(step)
        journal.save()
        error = run_command(journal.root, step, runner, say)
        if error is not None:
            failed.append(str(error))
        result.commands.append(step)
        journal.save()
    return failed


def _rerun_pending(
    journal: Journal, runner: Runner, say: Callable[[str], None], result: UndoResult
) -> UndoResult:
    """Nothing left to undo, but a regeneration an earlier undo could not finish: again."""
    from passthrough.execute.apply import command_mode

    pending = [s for _tx, s in journal.pending() if s.regenerate]
    if not pending or command_mode(journal.root) == "list":
        return result
    tx = journal.begin(TxKind.UNDO)
    steps = [
        Step(n=i, kind=StepKind.RUN, state=StepState.BEGUN, argv=s.argv, regenerate=True)
        for i, s in enumerate(pending)
    ]
    failed = _run_all(journal, tx, steps, runner, say, result)
    tx.state = TxState.FAILED if failed else TxState.COMPLETE
    tx.finished = time.time()
    journal.save()
    if failed:
        raise UndoIncomplete([], failed)
    return result
