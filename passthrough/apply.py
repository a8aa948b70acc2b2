"""Executing a Plan: lock, backups, a journal written before every step, atomic writes.

State lives under ``ROOT/var/lib/passthrough``: ``journal.json`` (every transaction and
step) and ``backups/<transaction>/<n>`` (the original bytes). A step is journaled as
``begun`` (with its backup already on disk) before it touches anything, and ``done``
after. Whatever the moment ``apply`` is killed, each file is entirely old or entirely new
(temp file + fsync + rename), and ``undo`` puts back the original bytes.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from passthrough.errors import EXIT_HOST_STEP, PassthroughError
from passthrough.host.root import HostRoot
from passthrough.plan.actions import Plan, RemoveFile, WriteFile

STATE = "var/lib/passthrough"
JOURNAL = f"{STATE}/journal.json"
LOCK = f"{STATE}/lock"


class ApplyError(PassthroughError):
    exit_code = EXIT_HOST_STEP


class Busy(PassthroughError):
    def __init__(self, path: str) -> None:
        super().__init__(
            f"another apply or undo is running (lock held on {path}); try again when it ends"
        )


# -- small, careful file primitives --------------------------------------------------------


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, mode: int | None = None) -> None:
    """Write ``path`` so that a crash leaves either the old or the new content."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    tmp = os.path.join(directory, f".{os.path.basename(path)}.passthrough-tmp")
    # A fresh file, never whatever sits at that name (a link planted there would carry
    # the write out of the root): remove it, then create exclusively, links not followed.
    _remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(directory)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except (FileNotFoundError, NotADirectoryError):
        return  # already absent
    _fsync_dir(os.path.dirname(path))


# -- the journal -------------------------------------------------------------------------


@dataclass
class Journal:
    root: HostRoot
    data: dict[str, Any]

    @classmethod
    def load(cls, root: HostRoot) -> Journal:
        raw = root.read_bytes(JOURNAL)
        if raw is None:
            return cls(root, {"schema": "passthrough.journal/v1", "transactions": []})
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            raise PassthroughError(
                f"{root.abs(JOURNAL)}: the journal is not valid JSON; nothing was changed"
            ) from None
        return cls(root, data)

    def save(self) -> None:
        atomic_write(
            self.root.real(JOURNAL), (json.dumps(self.data, indent=2) + "\n").encode(), 0o600
        )

    @property
    def transactions(self) -> list[dict[str, Any]]:
        tx: list[dict[str, Any]] = self.data["transactions"]
        return tx


@contextmanager
def locked(root: HostRoot) -> Iterator[None]:
    path = root.real(LOCK)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(path) from None
        yield
    finally:
        os.close(fd)


# -- running commands --------------------------------------------------------------------


def command_mode(root: HostRoot) -> str:
    """ "host" on the live root, "chroot" for a full OS tree when we may chroot, else "list"."""
    if root.is_live:
        return "host"
    full_os = root.exists("usr/bin/env") and (root.exists("bin/sh") or root.exists("usr/bin/sh"))
    if full_os and os.geteuid() == 0:
        return "chroot"
    return "list"


Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _default_runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


# A private mount namespace: the kernel's /proc, /sys and /dev are visible inside the
# tree while the command runs (grub-probe and mkinitramfs need them), and the mounts
# vanish with the process, even if it is killed.
CHROOT_SCRIPT = (
    'for d in proc sys dev; do mount --rbind "/$d" "$0/$d" || exit 125; done; exec chroot "$0" "$@"'
)


def chroot_argv(root_path: str, argv: tuple[str, ...]) -> list[str]:
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        CHROOT_SCRIPT,
        root_path,
        *argv,
    ]


def _execute(root: HostRoot, argv: tuple[str, ...], runner: Runner) -> str:
    mode = command_mode(root)
    if mode == "list":
        return "listed"
    full = list(argv) if mode == "host" else chroot_argv(root.path, argv)
    try:
        result = runner(full)
    except FileNotFoundError:
        raise ApplyError(f"{argv[0]}: command not found") from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout or "").strip().splitlines()[-1:] or [""]
        raise ApplyError(f"`{' '.join(argv)}` failed with exit {result.returncode}: {tail[0]}")
    return "done"


# -- apply and undo ----------------------------------------------------------------------


def _backup(root: HostRoot, tx_dir: str, n: int, rel: str) -> dict[str, Any]:
    path = root.real(rel)
    entry: dict[str, Any] = {"path": rel, "existed": os.path.lexists(path)}
    if entry["existed"]:
        backup = f"{tx_dir}/{n}-{rel.replace('/', '_')}"
        with open(path, "rb") as src:
            atomic_write(root.real(backup), src.read(), 0o600)
        entry["backup"] = backup
        entry["mode"] = os.stat(path).st_mode & 0o7777
    return entry


def _read_backup(root: HostRoot, rel: str) -> bytes | None:
    """A backup's bytes, whatever its size (an initramfs is tens of MiB)."""
    try:
        with open(root.real(rel), "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _touched(root: HostRoot, patterns: tuple[str, ...]) -> list[str]:
    return [rel for pattern in patterns for rel in root.glob(pattern)]


def apply(
    root: HostRoot,
    plan: Plan,
    record: dict[str, Any],
    runner: Runner = _default_runner,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Execute ``plan``; returns the transaction. Stops at the first failure (ApplyError)."""
    say = progress or (lambda _m: None)
    with locked(root):
        journal = Journal.load(root)
        if plan.empty:
            return {"id": None, "state": "nothing-to-do", "steps": []}
        tx_id = time.strftime("%Y%m%dT%H%M%S") + f"-{len(journal.transactions)}"
        tx_dir = f"{STATE}/backups/{tx_id}"
        tx: dict[str, Any] = {
            "id": tx_id,
            "started": time.time(),
            "state": "running",
            "steps": [],
            **record,
        }
        journal.transactions.append(tx)
        journal.save()
        for n, action in enumerate(plan.actions):
            step: dict[str, Any] = {"n": n, "state": "begun"}
            if isinstance(action, WriteFile | RemoveFile):
                step.update(
                    kind="write" if isinstance(action, WriteFile) else "remove",
                    files=[_backup(root, tx_dir, n, action.path)],
                )
            else:
                files = _touched(root, action.touches)
                step.update(
                    kind="run",
                    argv=list(action.argv),
                    regenerate=action.regenerate,
                    undo_argv=list(action.undo_argv) if action.undo_argv else None,
                    files=[_backup(root, tx_dir, n, f) for f in files],
                    # its outputs are backed up: undo restores them instead of rerunning it
                    outputs_backed_up=bool(action.touches) and bool(files),
                )
            tx["steps"].append(step)
            journal.save()  # the backup exists and the step is recorded before anything changes
            try:
                if isinstance(action, WriteFile):
                    say(f"write /{action.path}")
                    atomic_write(root.real(action.path), action.content, action.mode)
                    step["state"] = "done"
                elif isinstance(action, RemoveFile):
                    say(f"remove /{action.path}")
                    _remove(root.real(action.path, follow_final=False))
                    step["state"] = "done"
                else:
                    verb = "list (not run)" if command_mode(root) == "list" else "run"
                    say(f"{verb} {' '.join(action.argv)}")
                    step["state"] = _execute(root, action.argv, runner)
            except (OSError, ApplyError) as exc:
                step["state"] = "failed"
                tx["state"] = "failed"
                journal.save()
                if isinstance(exc, ApplyError):
                    raise ApplyError(
                        f"{exc}; the host is partly changed: run `passthrough undo`"
                    ) from None
                raise ApplyError(
                    f"{exc.filename or ''}: {exc.strerror}; the host is partly changed: run `passthrough undo`"
                ) from None
            journal.save()
        tx["state"] = "complete"
        tx["finished"] = time.time()
        journal.save()
        return tx


def undo(
    root: HostRoot, runner: Runner = _default_runner, progress: Callable[[str], None] | None = None
) -> list[str]:
    """Restore every file changed by every transaction not yet undone, newest first, then
    rerun the regeneration commands. Returns the restored paths."""
    say = progress or (lambda _m: None)
    if not root.exists(JOURNAL):
        return []  # nothing was ever applied here: leave the root exactly as it is
    with locked(root):
        journal = Journal.load(root)
        pending = [tx for tx in journal.transactions if tx.get("state") != "undone"]
        if not pending:
            return []
        restored: list[str] = []
        regenerate: list[list[str]] = []
        inverse: list[list[str]] = []
        for tx in reversed(pending):
            for step in reversed(tx["steps"]):
                if step["state"] not in ("begun", "done", "failed", "listed"):
                    continue
                if step.get("undo_argv") and step["state"] == "done":
                    inverse.append(step["undo_argv"])
                for entry in step["files"]:
                    path = root.real(entry["path"], follow_final=entry["existed"])
                    if entry["existed"]:
                        data = _read_backup(root, entry["backup"])
                        if data is None:
                            raise ApplyError(
                                f"backup {root.abs(entry['backup'])} is missing; cannot restore /{entry['path']}"
                            )
                        atomic_write(path, data, entry.get("mode"))
                    else:
                        _remove(path)
                    if entry["path"] not in restored:
                        restored.append(entry["path"])
                        say(f"restore /{entry['path']}")
                if (
                    step.get("regenerate")
                    and not step.get("outputs_backed_up")
                    and step["argv"] not in regenerate
                ):
                    regenerate.append(step["argv"])
            tx["state"] = "undoing"
        journal.save()
        mode = command_mode(root)
        for argv in inverse + list(reversed(regenerate)):
            say(f"{'list (not run)' if mode == 'list' else 'run'} {' '.join(argv)}")
            _execute(root, tuple(argv), runner)
        for tx in pending:
            tx["state"] = "undone"
            tx["undone"] = time.time()
        journal.save()
        return restored


def last_applied(root: HostRoot) -> dict[str, Any] | None:
    for tx in reversed(Journal.load(root).transactions):
        if tx.get("state") == "complete":
            found: dict[str, Any] = tx
            return found
    return None
