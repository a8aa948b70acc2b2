# SPDX-License-Identifier: Apache-2.0
"""Undo's decision for each path, made before anything changes: put the original back,
take only our lines out, leave it (nothing to do, or a backup missing or damaged), or
refuse (changed in a way that cannot be taken apart). See undo.py.

The unit is the file's whole history: the path is walked back through every live step
on it, newest first. Where the file holds what a step left, that step is reversed exactly
(to what it found); where someone changed it after the step (between two of our
transactions, or after the last), the step's change comes out by the three-way merge of
takeback.py (failing that, drift.py), or the file is refused and named.
"""

from __future__ import annotations

from dataclasses import dataclass

from passthrough.boot import loaderentries
from passthrough.host.root import HostRoot
from passthrough.journal import files, newentries
from passthrough.journal.drift import Ambiguous, unpick
from passthrough.journal.files import read_file
from passthrough.journal.journal import (
    Journal,
    Step,
    StepKind,
    StepState,
    Transaction,
    TxKind,
    sha256,
)
from passthrough.journal.state import own
from passthrough.journal.takeback import take_back


@dataclass
class Decision:
    path: str
    steps: list[Step]  # the live steps on this path, oldest first
    # "restore", "unpick", "nothing", "finished", "drifted", "missing"; "stranger": a loader
    # entry no step of ours wrote that carries our words (``why``: them)
    action: str
    content: bytes | None = None  # what to write for "restore"/"unpick" (None: remove)
    why: str = ""


def _backup(root: HostRoot, step: Step) -> tuple[bytes | None, str]:
    """What ``step`` found, from its backup, only if it hashes to what the journal
    recorded; otherwise None and why."""
    if not step.backup:
        return None, "no backup recorded"
    found = files.read_own(own(root, step.backup))
    if found is None:
        return None, f"/{step.backup} is gone"
    if sha256(found) != step.before_sha256:
        return None, f"/{step.backup} does not hash to what the journal recorded"
    return found, ""


def _found(root: HostRoot, steps: list[Step], i: int) -> tuple[bytes | None, str]:
    """What step ``i`` found on the path: nothing (the file was absent), its backup, or
    what the step before it left (apply backs a file up only where that is not known:
    see apply.py); None and why where it cannot be known."""
    step = steps[i]
    if step.before_sha256 is None:
        return None, ""
    if step.backup:
        return _backup(root, step)
    prev = steps[i - 1] if i else None
    if prev is not None and prev.written is not None:
        left = prev.written.encode()
        if sha256(left) == step.before_sha256:
            return left, ""
    return None, "no backup recorded"


@dataclass
class _Walk:
    """The file walked back through our steps, newest first."""

    content: bytes | None
    merged: bool = False  # someone changed it after one of our steps: merged, not restored
    action: str = ""  # set where the walk stopped: "missing" or "drifted"
    why: str = ""


def _unstep(
    root: HostRoot, path: str, steps: list[Step], i: int, tx: Transaction, walk: _Walk
) -> None:
    """Take step ``i`` back out of ``walk.content``: exactly where the file holds what the
    step left, by a three-way merge where someone changed it since."""
    step, now = steps[i], sha256(walk.content)
    if step.state is not StepState.DONE and now == step.before_sha256:
        return  # cut off before it changed the file
    before, why = _found(root, steps, i)
    if why:
        walk.action, walk.why = "missing", why
        return
    if now == step.written_sha256:
        walk.content = before
        return
    if walk.content is None:
        if before is None:  # the step made the file: its reversal is the absence left there
            return
        walk.action, walk.why = "drifted", "deleted since apply"
        return
    if step.kind is StepKind.REMOVE or step.written is None:
        walk.action, walk.why = "drifted", "recreated since apply"
        return
    written = step.written.encode()
    # our words out of a file edited in place; failing that, our lines out of one we made
    result = take_back(path, before or b"", written, walk.content)
    if isinstance(result, Ambiguous):
        lines = unpick(path, before or b"", written, walk.content, tx.args_set, tx.args_dropped)
        if isinstance(lines, Ambiguous):
            walk.action = "drifted"
            walk.why = (result if step.existed else lines).why
            return
        result = lines
    walk.content, walk.merged = result.content, True


def _decide(
    root: HostRoot,
    path: str,
    owned: list[tuple[Transaction, Step]],
    earlier: dict[str, str | None],
) -> Decision:
    """Walk the file back through every live step on it, newest first: a step whose
    result is still there is reversed exactly; a change someone made after it (between
    two of our transactions, or after the last) is merged with its reversal, or the
    file is refused (``drifted``) and named."""
    steps = [s for _tx, s in owned]
    first = steps[0]
    current = read_file(root, path)
    now = sha256(current)
    if now == first.before_sha256:  # the original (or its absence) is there
        return Decision(path, steps, "nothing")
    if path in earlier and earlier[path] == now:
        return Decision(path, steps, "finished")  # a cut-off undo wrote it
    original: bytes | None = None
    if first.existed:
        original, why = _backup(root, first)
        if original is None:
            return Decision(path, steps, "missing", why=why)
    if any(s.legacy for s in steps):  # a v1 journal: what apply wrote is not known
        return Decision(path, steps, "restore", original)
    walk = _Walk(current)
    for i in reversed(range(len(steps))):
        _unstep(root, path, steps, i, owned[i][0], walk)
        if walk.action:
            content = original if walk.action == "drifted" else None
            return Decision(path, steps, walk.action, content, why=walk.why)
    return Decision(path, steps, "unpick" if walk.merged else "restore", walk.content)


def _earlier(journal: Journal, targets: list[Transaction]) -> dict[str, str | None]:
    """What an undo of these transactions was writing when it was cut off: path -> the
    sha256 it was writing (None: removing)."""
    ids = {t.id for t in targets}
    return {
        s.path: s.written_sha256
        for tx in journal.transactions
        if tx.kind is TxKind.UNDO and ids & set(tx.undid)
        for s in tx.file_steps()
        if s.path is not None and s.state is StepState.BEGUN
    }


def decide_all(journal: Journal, targets: list[Transaction]) -> list[Decision]:
    by_path: dict[str, list[tuple[Transaction, Step]]] = {}
    for tx in targets:
        for step in tx.file_steps():
            if step.state is not StepState.UNDONE and step.path is not None:
                by_path.setdefault(step.path, []).append((tx, step))
    earlier = _earlier(journal, targets)
    out = [_decide(journal.root, p, owned, earlier) for p, owned in by_path.items()]
    return out + _strangers(journal.root, targets)


def _strangers(root: HostRoot, targets: list[Transaction]) -> list[Decision]:
    """Loader entries written after apply (a kernel update) that carry our words: ours
    come out of them (newentries.py). No step of ours is on them: nothing to mark undone."""
    out: list[Decision] = []
    for entry in newentries.strangers(root, targets):
        if not entry.carries:
            continue
        text = (read_file(root, entry.path) or b"").decode()
        content = loaderentries.without(text, entry.carries).encode()
        out.append(Decision(entry.path, [], "stranger", content, why=" ".join(entry.carries)))
    return out
