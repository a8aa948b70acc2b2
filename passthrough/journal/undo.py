# SPDX-License-Identifier: Apache-2.0
"""Undo: return every source file apply edited to its original, then regenerate.

The world moves on between apply and undo: a kernel update adds a boot entry and an
initramfs, an admin adds a line to a file we edited. So:

- each file is walked back through every apply that changed it, newest first
  (undo_decide.py): one that still holds exactly what apply wrote is put back from its
  backup (or removed, when apply created it);
- a file changed since (after the last apply or between two) loses only our own words
  and lines where that is unambiguous (takeback.py, drift.py);
  otherwise undo stops before changing anything and names each such file (``--force``
  puts our backup back anyway, losing the later changes, and says so);
- generated outputs (grub.cfg, initramfs images, BLS entries) are never put back: the
  plan's own tools run again, for every kernel installed now. Where commands cannot run,
  they are listed and stay pending (``passthrough status``);
- a missing backup does not stop the rest: the others are restored, the missing one is
  named (exit 3), and running undo again finishes once it is back (or ``--force`` leaves
  that file as it is). A backup that does not hash to what the journal recorded is
  treated the same way: never restored, named;
- every write is journaled before it happens, so an undo cut off (a kill, a full disk)
  is finished by the next one, which recognises what the cut-off one wrote;
- directories apply made (an empty ``etc/default/grub.d``) are removed when empty.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from passthrough.errors import EXIT_HOST_STEP, PassthroughError
from passthrough.host.root import HostRoot
from passthrough.journal import devices, files
from passthrough.journal.apply import (
    Runner,
    _default_runner,
    prune_backups,
    run_command,
    session,
    why,
)
from passthrough.journal.files import Attrs, atomic_write, remove
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
from passthrough.journal.state import STATE, own
from passthrough.journal.undo_decide import Decision, decide_all


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

    def __init__(self, missing: dict[str, str], failed: list[str]) -> None:
        parts = []
        if missing:
            parts.append(
                "backup missing or damaged for "
                + ", ".join(f"/{p} ({why})" for p, why in missing.items())
                + " (left as it is; the rest is restored): put the original backup back and "
                "run `passthrough undo` again, or `passthrough undo --force` to leave it"
            )
        if failed:
            parts.append(
                "files restored but "
                + "; ".join(failed)
                + ": `passthrough status` shows it pending, `passthrough apply` or "
                "`passthrough undo` runs it again"
            )
        super().__init__("; ".join(parts))
        self.missing = list(missing)
        self.failed = failed


class UndoStopped(PassthroughError):
    """A write failed (a full disk): what was done is journaled, the next undo finishes."""

    exit_code = EXIT_HOST_STEP

    def __init__(self, why: str, changed: bool = True) -> None:
        where = (
            "undo stopped part-way (`passthrough status` shows where)"
            if changed
            else "undo stopped before it put anything back (nothing on the host changed)"
        )
        super().__init__(f"{why}; {where}: make room, then run `passthrough undo` again")


@dataclass
class UndoResult:
    restored: list[str] = field(default_factory=list)  # back to the original bytes
    unpicked: list[str] = field(default_factory=list)  # changed since: only our lines removed
    forced: list[str] = field(default_factory=list)  # changed since: later changes lost
    removed: list[str] = field(default_factory=list)  # of restored: apply created it, now gone
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
            "removed": ["/" + p for p in self.removed],
            "unpicked": ["/" + p for p in self.unpicked],
            "forced": ["/" + p for p in self.forced],
            "commands": [s.to_json() for s in self.commands],
            "commands_not_run": self.listed,
        }


def _commands(targets: list[Transaction]) -> list[Step]:
    """Inverse commands (newest first), then each regeneration once, in plan order."""
    inverse: list[list[str]] = []
    regenerate: list[list[str]] = []
    for tx in reversed(targets):
        for step in reversed(tx.steps):
            if step.state is StepState.UNDONE or step.kind is not StepKind.RUN:
                continue
            if step.undo_argv and step.undo_argv not in inverse:
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


def _attrs(root: HostRoot, d: Decision) -> Attrs | None:
    """What the file is written with: the original's mode, owner and group (as apply
    recorded them) and extended attributes (carried by the file, or by the backup when the
    file is gone); None (those of the file there now) for our lines taken out of it."""
    if d.action in ("unpick", "stranger") or not d.steps[0].existed:
        return None
    first = d.steps[0]
    current = files.attrs_of(root.real(d.path))
    if current is not None:
        xattrs = current.xattrs
    else:
        xattrs = files.xattrs_of(own(root, first.backup)) if first.backup else {}
    mode = first.mode if first.mode is not None else (current.mode if current else 0o644)
    return Attrs(mode, first.uid, first.gid, xattrs)


def _put(journal: Journal, tx: Transaction, d: Decision) -> None:
    """Journal what is about to be written (so that a cut-off undo is recognised), write it."""
    root = journal.root
    step = Step(
        n=len(tx.steps),
        kind=StepKind.REMOVE if d.content is None else StepKind.WRITE,
        state=StepState.BEGUN,
        path=d.path,
        written_sha256=sha256(d.content),
    )
    tx.steps.append(step)
    journal.save()
    if d.content is None:
        remove(root.real(d.path, follow_final=False))
    else:
        atomic_write(root.real(d.path), d.content, attrs=_attrs(root, d))
    step.state = StepState.DONE


def _say_force(root: HostRoot, d: Decision, say: Callable[[str], None]) -> None:
    gone = not os.path.lexists(root.real(d.path, follow_final=False))
    lost = "removed since apply" if gone else "edited"
    say(f"--force: restore /{d.path} from backup; what was {lost} since apply is lost")


def _files(
    journal: Journal,
    tx: Transaction,
    decisions: list[Decision],
    result: UndoResult,
    say: Callable[[str], None],
    force: bool,
) -> dict[str, str]:
    """Every path back (newest first, as they were made); the missing backups, by path."""
    root = journal.root
    missing: dict[str, str] = {}
    for d in reversed(decisions):
        if d.action == "missing":
            if not force:
                say(f"backup missing or damaged: /{d.path} left as it is ({d.why})")
                missing[d.path] = d.why
                continue
            say(f"--force: /{d.path} left as it is ({d.why})")
        elif d.action == "finished":
            say(f"/{d.path}: already put back by an undo that was cut off")
            result.restored.append(d.path)
        elif d.action != "nothing":
            if d.action == "drifted":
                _say_force(root, d, say)
            elif d.action == "unpick":
                say(
                    f"take out what apply added to /{d.path} (changed since apply: the rest is kept)"
                )
            elif d.action == "stranger":
                say(
                    f"take out {d.why} from /{d.path} (a loader entry written after apply, "
                    "by a kernel update: the rest is kept)"
                )
            else:
                say(f"restore /{d.path}" if d.content is not None else f"remove /{d.path}")
                if d.content is None:
                    result.removed.append(d.path)
            _put(journal, tx, d)
            lists = {"drifted": result.forced, "unpick": result.unpicked}
            lists["stranger"] = result.unpicked
            lists.get(d.action, result.restored).append(d.path)
        for step in d.steps:
            step.state = StepState.UNDONE
        tx.restored.append(d.path)
        journal.save()
    return missing


def _remove_dirs(root: HostRoot, targets: list[Transaction], say: Callable[[str], None]) -> None:
    """The directories apply made, deepest first, where they are empty again."""
    made = {d for tx in targets for s in tx.file_steps() for d in s.made_dirs}
    for rel in sorted(made, key=lambda d: d.count("/"), reverse=True):
        # resolved inside the root: a journal naming a path through a link must not make
        # the kernel follow it out of the root; the last component is never followed
        if not files.remove_dir(root.real(rel, follow_final=False)):
            say(f"/{rel} is kept: apply made it, but it is not empty now")


def undo(
    root: HostRoot,
    runner: Runner = _default_runner,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
    only: Callable[[Transaction], bool] | None = None,
    kernel: devices.Kernel | None = None,
) -> UndoResult:
    """Undo every apply not yet undone (see the module's docstring), or those ``only``
    picks. Raises DriftRefused (nothing changed), UndoIncomplete or UndoStopped (exit 3:
    the next undo finishes). ``kernel``: a test root's stand-in for the device driver."""
    say = progress or (lambda _m: None)
    result = UndoResult()
    if not os.path.lexists(own(root, STATE)):
        return result  # never applied here: nothing to undo, and nothing to write (no lock)
    with session(root) as journal:
        targets = [t for t in journal.live() if only is None or only(t)]
        decisions = decide_all(journal, targets)
        drifted = {d.path: d.why for d in decisions if d.action == "drifted"}
        if drifted and not force:
            raise DriftRefused(drifted)
        try:
            if not targets:
                return _rerun_pending(journal, runner, say, result)
            return _undo(journal, targets, decisions, runner, say, force, result, kernel)
        except OSError as exc:
            changed = result.restored or result.unpicked or result.forced
            raise UndoStopped(why(exc), changed=bool(changed)) from None


def _undo(
    journal: Journal,
    targets: list[Transaction],
    decisions: list[Decision],
    runner: Runner,
    say: Callable[[str], None],
    force: bool,
    result: UndoResult,
    kernel: devices.Kernel | None = None,
) -> UndoResult:
    for t in targets:
        t.state = TxState.UNDOING
    tx = journal.begin(TxKind.UNDO, undid=[t.id for t in targets])
    failed = devices.take_back(journal, tx, targets, say, kernel)  # vGPUs before their VFs
    missing = _files(journal, tx, decisions, result, say, force)
    _remove_dirs(journal.root, targets, say)
    failed += _run_all(journal, tx, _commands(targets), runner, say, result)
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
    from passthrough.journal.apply import command_mode

    pending = [s for _tx, s in journal.pending(regenerations=True)]
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
        raise UndoIncomplete({}, failed)
    return result
