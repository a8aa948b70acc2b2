# SPDX-License-Identifier: Apache-2.0
"""Device attributes written through the journal (a vGPU type, an mdev created).

A sysfs attribute is not a file to back up and rename over: the kernel answers a write by
doing something (creating a vGPU, an mdev) and may refuse it or say something else when it
is read back. So a ``sysfs`` step records what was written and what takes it back (the same
attribute and its old value, or another attribute: an mdev's ``remove``). In the journal:
``argv`` is the attribute, the value, then ``key=value`` words naming the device (``pf``,
``vf``, ``type_id``, ``type_name``, ``before``: what it read before); ``undo_argv`` is the
attribute and value that take it back. It is journaled as begun before the write, read back
after it, and undo writes the take-back value, newest first, before any file is restored.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from passthrough.host.root import HostRoot
from passthrough.journal.journal import Journal, Step, StepKind, StepState, Transaction
from passthrough.journal.journal_json import inside

# What a write makes the kernel do: on a real host nothing more is needed (the kernel acts
# on the write); a test root's stand-in driver hooks in here to act as the driver would.
Kernel = Callable[[HostRoot, str, str], None]


def read_attr(root: HostRoot, rel: str) -> str | None:
    text = root.read(rel)
    return None if text is None else text.strip()


def poke(root: HostRoot, rel: str, value: str, kernel: Kernel | None = None) -> str | None:
    """Write ``value`` to the attribute as ``echo value > attr`` does (a newline after it,
    the file truncated: sysfs ignores both); None, or the kernel's refusal in words."""
    path = root.real(rel)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        try:
            os.write(fd, value.encode() + b"\n")
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
    words = [f"{k}={v}" for k, v in {**(device or {}), "before": before or ""}.items()]
    back = undo_value if undo_value is not None else (before or "")
    step = Step(
        n=len(tx.steps),
        kind=StepKind.SYSFS,
        state=StepState.BEGUN,
        argv=[rel, value, *words],
        undo_argv=[undo_path or rel, back],
    )
    tx.steps.append(step)
    journal.save()  # write-ahead: a cut-off run is taken back by the next undo
    error = poke(root, rel, value, kernel)
    step.state = StepState.FAILED if error else StepState.DONE
    step.error = error
    journal.save()
    return step


def device_of(step: Step) -> dict[str, str]:
    """The ``key=value`` words of a sysfs step: the device it wrote to."""
    return dict(w.split("=", 1) for w in step.argv[2:] if "=" in w)


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
        if step.state is StepState.UNDONE:
            continue
        try:
            path, undo_path = inside(step.argv[0]), inside((step.undo_argv or [])[0])
            value = (step.undo_argv or [])[1]
        except (ValueError, IndexError):
            failed.append(f"step {step.n}: {step.argv[:1]} cannot be taken back (damaged)")
            continue
        if step.state is StepState.FAILED and path == undo_path:
            # the kernel refused the write: the attribute still reads what it did
            step.state = StepState.UNDONE
            continue
        if path != undo_path and not journal.root.exists(undo_path):
            step.state = StepState.UNDONE  # the device it would remove is gone already
            continue
        say(f"write {value!r} to /{undo_path}")
        device = {k: v for k, v in device_of(step).items() if k != "before"}
        back = write_attr(journal, undo_tx, undo_path, value, device=device, kernel=kernel)
        if back.state is StepState.FAILED:
            failed.append(back.error or f"/{undo_path}")
            continue
        step.state = StepState.UNDONE
        journal.save()
    return failed
