# SPDX-License-Identifier: Apache-2.0
"""What a snapshot of a virtual machine records beyond discovery: what ``guest check``
reads, read once through the recorder (nothing is run), so that it answers the same on the
snapshot. What ``plan`` reads is recorded by ``plan/record.py``, handed to ``capture``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from passthrough.host.root import HostRoot


def record_guest_check(recorder: HostRoot) -> None:
    """Inside a virtual machine, also what ``passthrough guest check`` reads (subsystem IDs,
    the driver's /proc files, /dev/nvidia*, runtime and Kubernetes configuration), so that
    ``guest check --root`` on the snapshot judges the hardware as it does on the guest. The
    checks run through the recorder with no command and no compute: only files are read."""
    from passthrough.guest.check import run_guest_checks
    from passthrough.guest.root import GuestRoot

    class Recorded(GuestRoot):
        """The guest check's reader, reading through the recorder (contained, recorded)."""

        def __init__(self) -> None:
            super().__init__(recorder.path)
            self.is_live = False  # a capture: nothing is run or probed

        def exists(self, rel: str) -> bool:
            return recorder.exists(rel)

        def isdir(self, rel: str) -> bool:
            return recorder.isdir(rel)

        def listdir(self, rel: str) -> list[str]:
            return recorder.listdir(rel)

        def read(self, rel: str) -> str | None:
            return recorder.read(rel)

        def link_name(self, rel: str) -> str | None:
            return recorder.link_name(rel)

        def real(self, rel: str, follow_final: bool = True) -> str:
            return recorder.real(rel, follow_final)

    run_guest_checks(Recorded(), lambda _argv: None, compute=False)
