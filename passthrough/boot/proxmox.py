# SPDX-License-Identifier: Apache-2.0
"""Proxmox VE's proxmox-boot-tool: /etc/kernel/cmdline synced to every ESP it keeps."""

from __future__ import annotations

from passthrough.actions import Action, PlanRecord, Run, WriteFile
from passthrough.boot import loaderentries
from passthrough.boot.linefiles import edit_lines
from passthrough.boot.loaderentries import KernelCmdlineFile, check_entries
from passthrough.boot.readback import NextBoot
from passthrough.host.root import HostRoot
from passthrough.kargs import (
    ArgChange,
    UnsafeCmdline,
)
from passthrough.model import BootloaderKind

PROXMOX_UUIDS = "etc/kernel/proxmox-boot-uuids"


# where proxmox-boot-tool mounts each ESP it syncs, in a mount namespace of its own: after
# a refresh it is unmounted again, and the ESP is read only where it is mounted there
ESPMOUNTS = "var/tmp/espmounts"


def check_proxmox(root: HostRoot, record: PlanRecord, out: NextBoot) -> None:
    """Each ESP proxmox-boot-tool keeps in sync (/etc/kernel/proxmox-boot-uuids): its
    loader entries where it is mounted, and named as not read where it is not."""
    text = root.read(PROXMOX_UUIDS)
    esps = [line.split() for line in (text or "").split("\n") if line.strip()]
    if not esps:
        out.unchecked.append(f"the ESPs (no /{PROXMOX_UUIDS})")
        return
    for words in esps:
        uuid, mode = words[0], (words[1:] or ["systemd-boot"])[0]
        folder = f"{ESPMOUNTS}/{uuid}/loader/entries"
        if mode == "grub":
            out.unchecked.append(f"ESP {uuid} (synced for GRUB: its grub.cfg is the root's)")
        elif not root.isdir(folder):
            out.unchecked.append(
                f"ESP {uuid} (not mounted at /{ESPMOUNTS}/{uuid}: its loader entries were not read)"
            )
        else:
            paths = sorted(root.glob(f"{folder}/*.conf"))
            mount = f"{ESPMOUNTS}/{uuid}"
            check_entries(
                root,
                [loaderentries.Entry(p, mount, root.read(p) or "") for p in paths],
                record,
                out,
            )
            if not paths:
                out.unchecked.append(f"ESP {uuid} (mounted, no loader entries)")


class Proxmox(KernelCmdlineFile):
    """proxmox-boot-tool copies the **first line** of /etc/kernel/cmdline, as it is (a ``#``
    is no comment there), into the ``options`` of each ESP's entries, and stops where that
    line has no ``root=``: a second line is read by nothing."""

    name = BootloaderKind.PROXMOX

    def _first_line(self) -> tuple[str, str] | None:
        """The first line and the rest (from its newline on), or None without the file."""
        text = self._read(self.PATH)
        if text is None:
            return None
        first, newline, rest = text.partition("\n")
        if "root=" not in first:
            raise UnsafeCmdline(
                "/" + self.PATH,
                "proxmox-boot-tool reads only its first line, which has no root= (it stops "
                "there); put your whole command line on the first line",
            )
        return first, newline + rest

    def configured(self) -> list[str]:
        split = self._first_line()
        return split[0].split() if split is not None else super().configured()

    def actions(self, change: ArgChange) -> list[Action]:
        split = self._first_line()
        if split is None:
            return super().actions(change)
        first, rest = split
        new = edit_lines(first, change, lambda _line: True, "") + rest
        return [
            WriteFile(self.PATH, new.encode(), "kernel arguments for the next boot"),
            self.regenerate(),
        ]

    def regenerate(self) -> Run:
        return Run(
            ("proxmox-boot-tool", "refresh"),
            "copy kernels and the command line to the ESPs",
            regenerate=True,
        )
