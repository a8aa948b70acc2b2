# SPDX-License-Identifier: Apache-2.0
"""rpm-ostree (Fedora CoreOS, Silverblue): kernel arguments through ``rpm-ostree kargs``."""

from __future__ import annotations

from passthrough.actions import Action, Run
from passthrough.boot.base import (
    Bootloader,
)
from passthrough.kargs import (
    ArgChange,
    invert,
)
from passthrough.model import BootloaderKind


class RpmOstree(Bootloader):
    """Image-based Fedora: kernel arguments belong to the deployment (rpm-ostree kargs)."""

    name = BootloaderKind.RPM_OSTREE

    def configured(self) -> list[str]:
        return list(self.host.kernel.cmdline)

    def actions(self, change: ArgChange) -> list[Action]:
        present = invert(self.configured(), change).set  # what undo puts back
        argv = ["rpm-ostree", "kargs"]
        undo = ["rpm-ostree", "kargs"]
        for key, arg in change.set.items():
            if key in present:
                argv.append(f"--replace={arg}")
                undo.append(f"--replace={present[key]}")
            else:
                argv.append(f"--append-if-missing={arg}")
                undo.append(f"--delete-if-present={arg}")
        for key in sorted(change.drop):
            if key in present:
                argv.append(f"--delete-if-present={present[key]}")
                undo.append(f"--append-if-missing={present[key]}")
        return [
            Run(tuple(argv), "stage a deployment with the new arguments", undo_argv=tuple(undo))
        ]
