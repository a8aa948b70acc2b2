# SPDX-License-Identifier: Apache-2.0
"""Pop!_OS's kernelstub: its configuration is the edit, its loader entries are the next boot."""

from __future__ import annotations

import json

from passthrough.actions import Action, PlanRecord, Run
from passthrough.boot import loaderentries
from passthrough.boot.base import (
    Bootloader,
)
from passthrough.boot.loaderentries import check_entries
from passthrough.boot.readback import NextBoot, lacking
from passthrough.host.root import HostRoot
from passthrough.kargs import (
    ArgChange,
    UnsafeCmdline,
    key_of,
)
from passthrough.model import BootloaderKind

KERNELSTUB = "etc/kernelstub/configuration"


# the entries kernelstub writes, named after the OS: Pop_OS-current.conf, Pop_OS-oldkern.conf
KERNELSTUB_ENTRIES = ("*-current.conf", "*-oldkern.conf")


def check_kernelstub(root: HostRoot, record: PlanRecord, out: NextBoot) -> None:
    """kernelstub's configuration (``user.kernel_options``, what ``kernelstub -a`` saved)
    and the loader entries it wrote from it on its ESP (``user.esp_path``)."""
    text = root.read(KERNELSTUB)
    try:
        user = json.loads(text or "")["user"]
        options, esp = user["kernel_options"], user.get("esp_path", "/boot/efi")
        if not isinstance(options, list) or not isinstance(esp, str):
            raise TypeError
    except (ValueError, KeyError, TypeError, AttributeError):
        out.unchecked.append(f"/{KERNELSTUB} (absent or not kernelstub's JSON)")
        return
    if gone := lacking([str(o) for o in options], record):
        out.missing.append(f"/{KERNELSTUB} (user kernel_options): {' '.join(gone)}")
    out.checked.append("/" + KERNELSTUB)
    mount = esp.strip("/")
    entries = [
        loaderentries.Entry(path, mount, root.read(path) or "")
        for pattern in KERNELSTUB_ENTRIES
        for path in sorted(root.glob(f"{mount}/loader/entries/{pattern}"))
    ]
    if not entries:
        out.unchecked.append(f"kernelstub's loader entries (none in {esp}/loader/entries)")
    check_entries(root, entries, record, out)


class Kernelstub(Bootloader):
    """Pop!_OS: kernelstub keeps the options in /etc/kernelstub/configuration."""

    name = BootloaderKind.KERNELSTUB
    CONFIG = "etc/kernelstub/configuration"

    def configured(self) -> list[str]:
        try:
            data = json.loads(self.root.read(self.CONFIG) or "{}")
            # kernelstub copies "default" where there is no "user" section
            opts = data.get("user", data.get("default", {})).get("kernel_options", [])
        except (json.JSONDecodeError, AttributeError, RecursionError):
            # RecursionError: nested past what json can read (about 1,000 levels)
            raise UnsafeCmdline("/" + self.CONFIG, "is not the JSON kernelstub writes") from None
        if isinstance(opts, str):
            # an old configuration (config_rev < 3) or an OEM's holds one string: kernelstub
            # splits it at blanks, and joins again a quoted option split there
            if '"' in opts:
                raise UnsafeCmdline("/" + self.CONFIG, "kernel_options is a string with quotes")
            return opts.split()
        return [str(o) for o in opts]

    def actions(self, change: ArgChange) -> list[Action]:
        current = self.configured()
        out: list[Action] = []
        stale = [a for a in current if key_of(a) in change.drop or key_of(a) in change.set]
        if stale:
            out.append(
                Run(
                    ("kernelstub", *[x for a in stale for x in ("-d", a)]),
                    "remove replaced arguments",
                    touches=(self.CONFIG, "boot/efi/loader/entries/*.conf"),
                )
            )
        if change.set:
            out.append(
                Run(
                    ("kernelstub", *[x for a in change.set.values() for x in ("-a", a)]),
                    "add arguments",
                    touches=(self.CONFIG, "boot/efi/loader/entries/*.conf"),
                    # kernelstub rewrites its loader entry: undo asks it, never a backup
                    undo_argv=(
                        "kernelstub",
                        *[x for a in change.set.values() for x in ("-d", a)],
                        *[x for a in stale for x in ("-a", a)],
                    ),
                )
            )
        return out
