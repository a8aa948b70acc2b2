# SPDX-License-Identifier: Apache-2.0
"""Executing a Plan: lock, backups, a journal written before every step, atomic writes.

State lives under ``ROOT/var/lib/passthrough``: ``journal.json`` (see journal.py) and
``backups/<transaction>/<n>`` (the original bytes of source files we edit; generated
outputs are never backed up). A step is journaled as ``begun`` (with its backup already
on disk) before it touches anything, and ``done`` after. Whatever the moment ``apply`` is
killed, each file is entirely old or entirely new (temp file + fsync + rename); undo
(undo.py) returns each file to its original when it still holds what apply wrote.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from passthrough.actions import Action, Plan, PlanRecord, RemoveFile, Run, WriteFile
from passthrough.errors import EXIT_HOST_STEP, PassthroughError
from passthrough.host.root import HostRoot
from passthrough.journal import files
from passthrough.journal.applied import last_applied as last_applied
from passthrough.journal.files import Attrs, read_file, remove
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
from passthrough.journal.sandbox import chroot_argv, sandbox_profile, sandbox_works
from passthrough.journal.state import BACKUPS, ensure_dir, own
from passthrough.journal.state import LOCK as LOCK
from passthrough.journal.state import Busy as Busy
from passthrough.journal.state import full_os as _full_os
from passthrough.journal.state import locked as locked

log = logging.getLogger(__name__)  # -v/-vv (cli/common.py verbosity)


class ApplyError(PassthroughError):
    exit_code = EXIT_HOST_STEP


@contextmanager
def session(root: HostRoot) -> Iterator[Journal]:
    """The journal, checked before anything is made (a damaged one changes nothing); then
    our state directory, its lock, and the temporary files a killed run left, removed."""
    Journal.load(root)
    own(root, BACKUPS)  # a link planted there is refused before anything is made
    with locked(root):
        journal = Journal.load(root)
        journal.remove_temps()
        if journal.settle():
            journal.save()
        yield journal


def why(exc: OSError) -> str:
    return f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror or exc)


def saved(journal: Journal) -> str | None:
    """Save the journal; what went wrong, if it could not be saved (a full disk)."""
    try:
        journal.save()
    except OSError as exc:
        return why(exc)
    return None


# -- running commands --------------------------------------------------------------------


CommandMode = Literal["host", "chroot", "list"]


def command_mode(root: HostRoot) -> CommandMode:
    """ "host" on the live root, "chroot" for a full OS tree when we may chroot, else "list"."""
    if root.is_live:
        return "host"
    if _full_os(root) and os.geteuid() == 0 and sandbox_works():
        return "chroot"
    return "list"


def why_listed(root: HostRoot) -> str:
    """Why a root's commands are listed for the admin instead of run, in a few words."""
    if not _full_os(root):
        return "--root is not a full OS tree"
    if os.geteuid() != 0:
        return "not run as root"
    if not sandbox_works():
        return "this kernel refuses the user, mount and PID namespaces of the sandbox"
    return "they cannot run in the sandbox"


Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _default_runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def only_listed(root: HostRoot, argv: tuple[str, ...]) -> bool:
    """Whether a command is listed for the admin rather than run."""
    mode = command_mode(root)
    return mode == "list" or (mode == "chroot" and sandbox_profile(argv) is None)


def _execute(root: HostRoot, argv: tuple[str, ...], runner: Runner) -> StepState:
    if only_listed(root, argv):
        return StepState.LISTED
    mode = command_mode(root)
    full = list(argv) if mode == "host" else chroot_argv(root.path, argv)
    try:
        result = runner(full)
    except FileNotFoundError:
        raise ApplyError(f"{argv[0]}: command not found") from None
    log.info("ran %s: exit %d", shlex.join(full), result.returncode)
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text:
            log.debug("%s of %s:\n%s", name, argv[0], text.rstrip("\n"))
    if result.returncode != 0:
        tail = (result.stderr or result.stdout or "").strip().splitlines()[-1:] or [""]
        raise ApplyError(f"`{shlex.join(argv)}` failed with exit {result.returncode}: {tail[0]}")
    return StepState.DONE


def run_command(
    root: HostRoot, step: Step, runner: Runner, say: Callable[[str], None]
) -> ApplyError | None:
    """Run (or list) one command step, recording its outcome on the step."""
    verb = "list (not run)" if only_listed(root, tuple(step.argv)) else "run"
    say(f"{verb} {shlex.join(step.argv)}")
    try:
        step.state = _execute(root, tuple(step.argv), runner)
        step.error = None
    except ApplyError as exc:
        step.state = StepState.FAILED
        step.error = str(exc)
        return exc
    return None


# -- backups -----------------------------------------------------------------------------


def prune_backups(journal: Journal) -> list[str]:
    """Delete every backup no live transaction needs (undone ones, generated outputs an
    older journal kept, leftovers of a killed run). Returns what was removed. Only inside
    our backups directory: its links are removed, never followed."""
    root = journal.root
    top = own(root, BACKUPS)
    keep = {os.path.relpath(own(root, b), top) for b in journal.referenced_backups()}
    removed: list[str] = []
    if not os.path.isdir(top):
        return removed
    for dirpath, dirnames, names, dirfd in os.fwalk(top, topdown=False, follow_symlinks=False):
        here = os.path.relpath(dirpath, top)
        for name in names:
            rel = os.path.normpath(os.path.join(here, name))
            if rel not in keep:
                files.fault_point("unlink", os.path.join(dirpath, name))
                os.unlink(name, dir_fd=dirfd)
                removed.append(f"{BACKUPS}/{rel}")
        for name in dirnames:  # (a link to a directory is listed here: removed, not walked)
            if os.path.islink(os.path.join(dirpath, name)):
                files.fault_point("unlink", os.path.join(dirpath, name))
                os.unlink(name, dir_fd=dirfd)
                removed.append(f"{BACKUPS}/{os.path.normpath(os.path.join(here, name))}")
                continue
            try:
                files.fault_point("rmdir", os.path.join(dirpath, name))
                os.rmdir(name, dir_fd=dirfd)
            except OSError:
                pass  # not empty: a backup still needed
    return removed


def _file_step(journal: Journal, tx: Transaction, n: int, action: WriteFile | RemoveFile) -> Step:
    root = journal.root
    rel = action.path
    path = root.real(rel)
    before = read_file(root, rel)
    attrs = files.attrs_of(path) if before is not None else None
    step = Step(
        n=n,
        kind=StepKind.WRITE if isinstance(action, WriteFile) else StepKind.REMOVE,
        state=StepState.BEGUN,
        path=rel,
        existed=before is not None,
        mode=attrs.mode if attrs else None,
        uid=attrs.uid if attrs else None,
        gid=attrs.gid if attrs else None,
        before_sha256=sha256(before),
    )
    if isinstance(action, WriteFile):
        step.written_sha256 = sha256(action.content)
        try:
            step.written = action.content.decode() if len(action.content) < 65536 else None
        except UnicodeDecodeError:
            step.written = None
        made = files.missing_dirs(os.path.dirname(path))
        step.made_dirs = [os.path.relpath(d, root.path) for d in made]
    # undo walks the path back through every step on it, so each needs what it found:
    # kept where the step before it (if any) did not leave exactly that (someone changed
    # the file between two of our transactions, or it is the first)
    prev = journal.last_step(rel)
    known = prev is not None and prev.written is not None and prev.written_sha256 == sha256(before)
    if before is not None and not known:
        step.backup = f"{BACKUPS}/{tx.id}/{n}-{rel.replace('/', '_')}"
    return step


def _change(
    root: HostRoot, step: Step, action: WriteFile | RemoveFile, say: Callable[[str], None]
) -> None:
    """One file step, journaled as begun: its backup first (0600, the original's extended
    attributes carried), then the change itself."""
    path = root.real(action.path)
    if step.backup:
        before = read_file(root, action.path)
        if sha256(before) != step.before_sha256 or before is None:
            raise ApplyError(f"/{action.path} changed while apply ran; nothing of it was changed")
        ensure_dir(root, os.path.dirname(step.backup))
        backup = Attrs(0o600, xattrs=files.xattrs_of(path))
        files.atomic_write(own(root, step.backup), before, attrs=backup)
    if isinstance(action, WriteFile):
        say(f"write /{action.path}")
        files.make_dirs([root.real(d, follow_final=False) for d in step.made_dirs])
        files.atomic_write(path, action.content, action.mode)
    else:
        say(f"remove /{action.path}")
        remove(root.real(action.path, follow_final=False))


# -- apply -------------------------------------------------------------------------------


def _pending_reruns(journal: Journal, plan: Plan) -> list[Run]:
    """Regeneration commands left pending by an earlier run (failed, cut off): re-run them
    when commands can run here, unless the plan runs them anyway."""
    if command_mode(journal.root) == "list":
        return []
    planned = {a.argv for a in plan.actions if isinstance(a, Run)}
    out: list[Run] = []
    for tx, step in journal.pending(regenerations=True):
        argv = tuple(step.argv)
        if argv not in planned:
            planned.add(argv)
            out.append(Run(argv, f"pending since transaction {tx.id}", regenerate=True))
    return out


def _step(
    journal: Journal,
    tx: Transaction,
    n: int,
    action: Action,
    runner: Runner,
    say: Callable[[str], None],
) -> str | None:
    """Journal one step as begun, do it, record its outcome; what failed, if anything."""
    root = journal.root
    try:
        if isinstance(action, WriteFile | RemoveFile):
            step = _file_step(journal, tx, n, action)
        else:
            step = Step(
                n=n,
                kind=StepKind.RUN,
                state=StepState.BEGUN,
                argv=list(action.argv),
                regenerate=action.regenerate,
                undo_argv=list(action.undo_argv) if action.undo_argv else None,
            )
    except OSError as exc:
        return why(exc)
    tx.steps.append(step)
    failed = saved(journal)  # recorded before anything changes: write-ahead
    if failed is not None:
        tx.steps.pop()
        return failed
    try:
        if isinstance(action, WriteFile | RemoveFile):
            _change(root, step, action, say)
            step.state = StepState.DONE
        else:
            error = run_command(root, step, runner, say)
            if error is not None:
                return str(error)
    except (OSError, ApplyError) as exc:
        step.state = StepState.FAILED
        step.error = why(exc) if isinstance(exc, OSError) else str(exc)
        return step.error
    return saved(journal)


def apply(
    root: HostRoot,
    plan: Plan,
    record: PlanRecord,
    runner: Runner = _default_runner,
    progress: Callable[[str], None] | None = None,
) -> Transaction | None:
    """Execute ``plan`` (and any regeneration left pending); returns the transaction, or
    None when there was nothing to do. Stops at the first failure (ApplyError)."""
    say = progress or (lambda _m: None)
    for action in plan.actions:  # a FIFO or a huge file: refused before anything is made
        if isinstance(action, WriteFile | RemoveFile):
            files.regular_or_absent(root, action.path)
    with session(root) as journal:
        actions: list[Action] = [*plan.actions, *_pending_reruns(journal, plan)]
        if not actions:
            return None
        tx = journal.begin(
            TxKind.APPLY,
            record=record,
            args_set=list(plan.kernel_args.set.values()),
            args_dropped=sorted(plan.kernel_args.drop),
        )
        for n, action in enumerate(actions):
            failure = _step(journal, tx, n, action, runner, say)
            if failure is not None:
                tx.state = TxState.FAILED
                unrecorded = saved(journal)
                note = f" (the journal could not record it: {unrecorded})" if unrecorded else ""
                raise ApplyError(
                    f"{failure}; the host is partly changed{note}: run `passthrough undo`"
                )
        tx.state = TxState.COMPLETE
        tx.finished = time.time()
        unrecorded = saved(journal)
        if unrecorded:
            raise ApplyError(
                f"every step is done but the journal could not record it ({unrecorded}): "
                "make room, then run `passthrough apply` again"
            )
        prune_backups(journal)
        return tx


def listed(tx: Transaction | None) -> list[list[str]]:
    """The commands a transaction could only list (not a full OS tree, or not root)."""
    return [s.argv or [] for s in (tx.steps if tx else []) if s.state is StepState.LISTED]


def apply_json(tx: Transaction | None, plan: Plan, owed: list[list[str]]) -> dict[str, Any]:
    """``apply --json``: what this run did, and the commands still owed by earlier ones."""
    return {
        "changed": tx is not None,
        "reboot_required": plan.reboot,
        "transaction": tx.id if tx else None,
        "steps": [shown_step(s.to_json()) for s in (tx.steps if tx else [])],
        "commands_not_run": listed(tx),
        "pending": owed,
        "warnings": list(plan.warnings),
    }


def shown_step(step: dict[str, Any]) -> dict[str, Any]:
    """A journal step as output shows it: paths as a person names them inside the root
    (``/etc/…``, as plan, undo and status print them), not as the journal keeps them."""
    out = dict(step)
    for key in ("path", "backup"):
        if isinstance(out.get(key), str):
            out[key] = "/" + out[key]
    if isinstance(out.get("made_dirs"), list):
        out["made_dirs"] = ["/" + d for d in out["made_dirs"]]
    return out
