# SPDX-License-Identifier: Apache-2.0
"""The qcow2 overlay ``vm define --base-image`` (and the VM module) makes for a guest.

A file already at the overlay's path may be a guest's disk holding its data, so it is
never replaced unless the caller says so: ``refuse`` (the default) stops with nothing
changed, ``reuse`` keeps it as it is, ``overwrite`` replaces it with a fresh overlay.
A new overlay is made under a temporary name beside the path and moved into place only
after libvirt accepted the domain, so a refused definition leaves the old disk (or no
disk) where it was.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from dataclasses import dataclass
from enum import StrEnum

from passthrough.errors import EXIT_BACKEND, PassthroughError, echo_path


class ExistingDisk(StrEnum):
    """What to do when a file is already where the overlay goes."""

    REFUSE = "refuse"
    REUSE = "reuse"
    OVERWRITE = "overwrite"


class DiskRefused(PassthroughError):
    """A disk is already there and nobody said what to do with it (exit 2, nothing changed)."""


class DiskFailed(PassthroughError):
    """qemu-img could not make the overlay."""

    exit_code = EXIT_BACKEND


@dataclass
class Overlay:
    """One overlay decision: ``action`` is what happens at ``path`` (created, reused,
    overwritten); ``pending`` the new image waiting under its temporary name."""

    base: str
    path: str
    action: str
    pending: str | None = None

    def place(self) -> None:
        """Move the new image into place (the domain is defined by now)."""
        if self.pending is None:
            return
        if self.action == "overwritten":
            os.replace(self.pending, self.path)  # replaces a link itself, never its target
        else:
            try:
                os.link(self.pending, self.path)  # fails, rather than replaces, if one appeared
            except FileExistsError:
                self.discard()
                raise DiskRefused(
                    f"{echo_path(self.path)}: a file appeared there while the domain was defined; "
                    "it was left as it is"
                ) from None
            os.unlink(self.pending)
        self.pending = None

    def discard(self) -> None:
        if self.pending is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.pending)
            self.pending = None

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "base": self.base, "action": self.action}

    def text(self) -> str:
        if self.action == "reused":
            return f"disk {self.path}: kept as it was (reuse)"
        verb = "replaced by a new overlay" if self.action == "overwritten" else "a new overlay"
        return f"disk {self.path}: {verb} on {self.base}"


def decide(base: str, path: str, existing: ExistingDisk, choose: str) -> str:
    """What happens at ``path`` (created, reused, overwritten), nothing done yet; refuses
    (:class:`DiskRefused`) what may not happen. Check mode asks this alone. ``choose``
    completes the refusal: how this caller says reuse or overwrite."""
    if not os.path.lexists(path):
        return "created"
    try:
        st = os.stat(path)
    except OSError as exc:
        raise DiskRefused(
            f"{echo_path(path)}: already there but unusable ({exc.strerror})"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise DiskRefused(
            f"{echo_path(path)}: already there and not a regular file; nothing changed"
        )
    if os.path.exists(base) and os.path.samefile(base, path):
        raise DiskRefused(f"{echo_path(path)}: is the base image itself; nothing changed")
    if existing is ExistingDisk.REFUSE:
        raise DiskRefused(
            f"{echo_path(path)}: a disk is already there (a guest's data?); nothing changed: {choose}"
        )
    return "reused" if existing is ExistingDisk.REUSE else "overwritten"


def prepare(base: str, path: str, existing: ExistingDisk, choose: str) -> Overlay:
    """:func:`decide`, then a new image (if one is due) made under a temporary name."""
    action = decide(base, path, existing, choose)
    if action == "reused":
        return Overlay(base, path, action)
    pending = os.path.join(
        os.path.dirname(path) or ".", f".{os.path.basename(path)}.passthrough-tmp-{os.getpid()}"
    )
    _create(base, pending, path)
    return Overlay(base, path, action, pending)


def _create(base: str, pending: str, path: str) -> None:
    # a relative backing name is read relative to the overlay's directory: the temporary
    # name is in the same one, so the image reads the same once renamed
    r = subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, pending],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        if os.path.lexists(pending):
            os.unlink(pending)
        why = (r.stderr.strip().splitlines() or ["failed"])[-1]
        raise DiskFailed(f"qemu-img could not create the overlay {echo_path(path)}: {why}")
