# SPDX-License-Identifier: Apache-2.0
"""Kernel arguments through the bootloader the host really uses — one small class each.

Each knows where its configured arguments live (``configured``) and how to change them
(``actions``); the choice comes from discovery's detection, never from a guess.
"""

from __future__ import annotations

from collections.abc import Callable

from passthrough.actions import PlanRecord
from passthrough.boot.base import (
    Bootloader,
    UnknownBootloader,
)
from passthrough.boot.grub import Grub, check_grub
from passthrough.boot.grubby import Grubby
from passthrough.boot.kernelstub import Kernelstub, check_kernelstub
from passthrough.boot.loaderentries import KernelCmdlineFile, check_loader_entries
from passthrough.boot.proxmox import Proxmox, check_proxmox
from passthrough.boot.readback import NextBoot
from passthrough.boot.rpmostree import RpmOstree
from passthrough.host.root import HostRoot
from passthrough.model import BootloaderKind, Host

__all__ = [
    "CLASSES",
    "READ_BACK",
    "Bootloader",
    "Grub",
    "Grubby",
    "KernelCmdlineFile",
    "Kernelstub",
    "Proxmox",
    "RpmOstree",
    "UnknownBootloader",
    "for_host",
]


CLASSES: dict[BootloaderKind, type[Bootloader]] = {
    BootloaderKind.GRUB: Grub,
    BootloaderKind.GRUBBY: Grubby,
    BootloaderKind.SYSTEMD_BOOT: KernelCmdlineFile,
    BootloaderKind.PROXMOX: Proxmox,
    BootloaderKind.KERNELSTUB: Kernelstub,
    BootloaderKind.RPM_OSTREE: RpmOstree,
}


# What each family's next boot reads, checked after apply's regeneration (journal/nextboot.py
# walks it); a family missing here (grubby, rpm-ostree, NixOS) is named as not read.
READ_BACK: dict[BootloaderKind, Callable[[HostRoot, PlanRecord, NextBoot], None]] = {
    BootloaderKind.GRUB: check_grub,
    BootloaderKind.SYSTEMD_BOOT: check_loader_entries,
    BootloaderKind.PROXMOX: check_proxmox,
    BootloaderKind.KERNELSTUB: check_kernelstub,
}


def for_host(root: HostRoot, host: Host) -> Bootloader | None:
    cls = CLASSES.get(host.boot.bootloader)
    return cls(root, host) if cls else None
