# SPDX-License-Identifier: Apache-2.0
"""RHEL and Fedora's BLS entries, changed through grubby (the GRUBBY family)."""

from __future__ import annotations

import re

from passthrough.actions import Action, Run
from passthrough.boot.base import (
    Bootloader,
    checked_entry,
    checked_release,
)
from passthrough.boot.linefiles import arguments, options_line
from passthrough.kargs import (
    ArgChange,
    UnsafeCmdline,
    invert,
    utf8_text,
)
from passthrough.model import BootloaderKind


class Grubby(Bootloader):
    """RHEL/Fedora BLS entries, changed with grubby for every kernel."""

    name = BootloaderKind.GRUBBY
    TOUCHES = (
        "boot/loader/entries/*.conf",
        "etc/default/grub",
        "etc/kernel/cmdline",
        "boot/grub2/grubenv",
    )

    def configured(self) -> list[str]:
        entries = sorted(
            checked_entry(e)
            for e in self.root.listdir("boot/loader/entries")
            if e.endswith(".conf")
        )
        release = checked_release(self.host.kernel.release) or ""
        chosen = next(
            (e for e in entries if release and release in e), entries[0] if entries else None
        )
        if chosen is None:
            raise UnsafeCmdline("/boot/loader/entries", "no BLS entry found")
        rel = f"boot/loader/entries/{chosen}"
        text = utf8_text(self.root.read_bytes(rel), "/" + rel) or ""
        return [
            word
            for arg in arguments(text, options_line, is_options=True)
            for word in self._expanded(arg, rel)
        ]

    GRUBENV = "boot/grub2/grubenv"
    _VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")

    def _expanded(self, arg: str, rel: str) -> list[str]:
        """An ``options`` word as GRUB's blscfg expands it: ``$kernelopts`` (RHEL 8, Fedora
        30-33: the arguments live in grubenv, which grubby edits) and ``$tuned_params`` are
        variables of /boot/grub2/grubenv. One grubenv does not set is empty, as in GRUB,
        unless grub.cfg names it (it may set it there): then the line cannot be told."""
        m = self._VAR.fullmatch(arg)
        if m is None:
            if "$" in arg:
                raise UnsafeCmdline("/" + rel, f"options word {arg!r} uses a GRUB variable")
            return [arg]
        name = m[1] or m[2]
        env = self._grubenv()
        if name in env:
            return env[name].split()
        if any(name in (self.root.read(cfg) or "") for cfg in self._grub_cfgs()):
            raise UnsafeCmdline(
                "/" + rel, f"${name} is not in /{self.GRUBENV} but grub.cfg names it"
            )
        return []

    def _grubenv(self) -> dict[str, str]:
        text = utf8_text(self.root.read_bytes(self.GRUBENV), "/" + self.GRUBENV) or ""
        lines = [ln.partition("=") for ln in text.split("\n") if not ln.startswith("#")]
        return {k: v for k, eq, v in lines if eq}

    def _grub_cfgs(self) -> list[str]:
        efi = [f"boot/efi/EFI/{d}/grub.cfg" for d in self.root.listdir("boot/efi/EFI")]
        return ["boot/grub2/grub.cfg", *efi]

    def actions(self, change: ArgChange) -> list[Action]:
        argv = ["grubby", "--update-kernel=ALL"]
        if change.set:
            argv.append("--args=" + " ".join(change.set.values()))
        if change.drop:
            argv.append("--remove-args=" + " ".join(sorted(change.drop)))
        # BLS entries are generated per kernel: undo asks grubby to take our arguments out
        # again (and put back what they replaced) rather than restoring entries from a backup
        back = invert(self.configured(), change).set
        undo = ["grubby", "--update-kernel=ALL"]
        if change.set:
            undo.append("--remove-args=" + " ".join(change.set.values()))
        if back:
            undo.append("--args=" + " ".join(back.values()))
        return [
            Run(
                tuple(argv),
                "change the arguments of every BLS entry",
                touches=self.TOUCHES,
                undo_argv=tuple(undo),
            )
        ]
