# SPDX-License-Identifier: Apache-2.0
"""Undo's decision for each path, made before anything changes: put the original back,
take only our lines out, leave it (nothing to do, or a backup missing or damaged), or
refuse (changed since apply in a way that cannot be taken apart). See undo.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from passthrough.execute import files, newentries
from passthrough.execute.drift import Ambiguous, unpick
from passthrough.execute.files import read_file
from passthrough.execute.journal import (
    Journal,
    Step,
    StepKind,
    StepState,
    Transaction,
    TxKind,
    sha256,
)
from passthrough.execute.state import own
from passthrough.execute.takeback import take_back
from passthrough.host.root import HostRoot


@dataclass
class Decision:
    path: str
    steps: list[Step]  # the live steps on this path, oldest first
    # "restore", "unpick", "nothing", "finished", "drifted", "missing"; "stranger": a loader
    # entry no step of ours wrote that carries our words (``why``: them)
    action: str
    content: bytes | None = None  # what to write for "restore"/"unpick" (None: remove)
    why: str = ""


def _ours(steps: list[Step]) -> set[str | None]:
    """The hashes the file may have if nobody touched it since apply."""
    last = steps[-1]
    if last.state is StepState.DONE:
        return {last.written_sha256}
    return {last.written_sha256, last.before_sha256}  # begun/failed: before or after


def _backup(root: HostRoot, first: Step) -> tuple[bytes | None, str]:
    """The original from the first step's backup, only if it hashes to what the journal
    recorded; otherwise None and why."""
    if not first.backup:
        return None, "no backup recorded"
    original = files.read_own(own(root, first.backup))
    if original is None:
        return None, f"/{first.backup} is gone"
    if sha256(original) != first.before_sha256:
        return None, f"/{first.backup} does not hash to what the journal recorded"
    return original, ""


def _decide(
    root: HostRoot,
    path: str,
    steps: list[Step],
    txs: list[Transaction],
    earlier: dict[str, str | None],
) -> Decision:
    first, last = steps[0], steps[-1]
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
    if last.legacy or now in _ours(steps):
        return Decision(path, steps, "restore", original)
    if current is None:
        return Decision(path, steps, "drifted", original, why="deleted since apply")
    if last.kind is StepKind.REMOVE or last.written is None:
        return Decision(path, steps, "drifted", original, why="recreated since apply")
    args_set = [a for tx in txs for a in tx.args_set]
    args_dropped = [a for tx in txs for a in tx.args_dropped]
    written = last.written.encode()
    # our words out of a file edited in place; failing that, our lines out of one we made
    result = take_back(path, original or b"", written, current)
    if isinstance(result, Ambiguous):
        lines = unpick(path, original or b"", written, current, args_set, args_dropped)
        if isinstance(lines, Ambiguous):
            why = (result if first.existed else lines).why
            return Decision(path, steps, "drifted", original, why=why)
        result = lines
    return Decision(path, steps, "unpick", result.content)


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
    by_path: dict[str, list[Step]] = {}
    for tx in targets:
        for step in tx.file_steps():
            if step.state is not StepState.UNDONE and step.path is not None:
                by_path.setdefault(step.path, []).append(step)
    earlier = _earlier(journal, targets)
    out = [_decide(journal.root, p, steps, targets, earlier) for p, steps in by_path.items()]
    return out + _strangers(journal.root, targets)


def _strangers(root: HostRoot, targets: list[Transaction]) -> list[Decision]:
    """Loader entries written after apply (a kernel update) that carry our words: ours
    come out of them (newentries.py). No step of ours is on them: nothing to mark undone."""
    out: list[Decision] = []
    for entry in newentries.strangers(root, targets):
        if not entry.carries:
            continue
        text = (read_file(root, entry.path) or b"").decode()
        content = newentries.without(text, entry.carries).encode()
        out.append(Decision(entry.path, [], "stranger", content, why=" ".join(entry.carries)))
    return out
