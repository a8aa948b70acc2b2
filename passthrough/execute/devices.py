# SPDX-License-Identifier: Apache-2.0
"""Device attributes written through the journal (a vGPU type, an mdev created).

A sysfs attribute is not a file to back up and rename over: the kernel answers a write by
doing something (creating a vGPU, an mdev) and may refuse it or say something else when it
is read back. So a ``sysfs`` step records what the attribute read before, what was written,
and what takes it back (the same attribute and its old value, or another attribute: an
mdev's ``remove``). It is journaled as begun before the write, read back after it, and undo
writes the take-back value, newest first, before any file is restored.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from passthrough.execute.journal import Journal, Step, StepKind, StepState, Transaction
from passthrough.host.root import HostRoot

# What a write makes the kernel do: on a real host nothing more is needed (the kernel acts
# on the write); a test root's stand-in driver hooks in here to act as the driver would.
Kernel = Callable[[HostRoot, str, str], None]


def read_attr(root: HostRoot, rel: str) -> str | None:
    text = root.read(rel)
    return None if text is None else text.strip()


def poke(root: HostRoot, rel: str, value: str, kernel: Kernel | None = None) -> str | None:
    """Write ``value`` to the attribute; None, or the kernel's refusal in words."""
    path = root.real(rel)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        return f"writing {value!r} to /{rel}: {exc.strerror}"
    if kernel is not None:
        kernel(root, rel, value)
    return None


def write_attr(
    journal: Journal,
    tx: Transaction,
    rel: str,
    value: str,
    *,
    undo_path: str | None = None,
    undo_value: str | None = None,
    device: dict[str, str] | None = None,
    kernel: Kernel | None = None,
) -> Step:
    """One journaled attribute write; the step comes back DONE or FAILED (its error set)."""
    root = journal.root
    before = read_attr(root, rel)
    step = Step(
        n=len(tx.steps),
        kind=StepKind.SYSFS,
        state=StepState.BEGUN,
        path=rel,
        written=value,
        before=before,
        undo_path=undo_path or rel,
        undo_value=undo_value if undo_value is not None else (before or ""),
        device=dict(device or {}),
    )
    tx.steps.append(step)
    journal.save()  # write-ahead: a cut-off run is taken back by the next undo
    error = poke(root, rel, value, kernel)
    step.state = StepState.FAILED if error else StepState.DONE
    step.error = error
    journal.save()
    return step


def take_back(
    journal: Journal,
    undo_tx: Transaction,
    targets: list[Transaction],
    say: Callable[[str], None],
    kernel: Kernel | None = None,
) -> list[str]:
    """Every live sysfs step of ``targets`` written back, newest first; what failed."""
    failed: list[str] = []
    steps = [s for tx in targets for s in tx.steps if s.kind is StepKind.SYSFS]
    for step in reversed(steps):
        if step.state is StepState.UNDONE or step.undo_path is None:
            continue
        if step.state is StepState.FAILED and step.path == step.undo_path:
            # the kernel refused the write: the attribute still reads what it did
            step.state = StepState.UNDONE
            continue
        value = step.undo_value or ""
        if step.path != step.undo_path and not journal.root.exists(step.undo_path):
            step.state = StepState.UNDONE  # the device it would remove is gone already
            continue
        say(f"write {value!r} to /{step.undo_path}")
        back = write_attr(
            journal, undo_tx, step.undo_path, value, device=step.device, kernel=kernel
        )
        if back.state is StepState.FAILED:
            failed.append(back.error or f"/{step.undo_path}")
            continue
        step.state = StepState.UNDONE
        journal.save()
    return failed
