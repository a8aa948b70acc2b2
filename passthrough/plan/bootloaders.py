# SPDX-License-Identifier: Apache-2.0
"""Kernel arguments through the bootloader the host really uses — one small class each.

Each knows where its configured arguments live (``configured``) and how to change them
(``actions``); the choice comes from discovery's detection, never from a guess.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import NoReturn

from passthrough.host.root import HostRoot
from passthrough.model import BootloaderKind, Host
from passthrough.plan import loaderentries
from passthrough.plan.actions import Action, Run, WriteFile
from passthrough.plan.bootloader_base import (
    Bootloader,
    TargetOf,
    UnknownBootloader,
    checked_entry,
    checked_release,
)
from passthrough.plan.grub import Grub
from passthrough.plan.kargs import (
    ArgChange,
    UnsafeCmdline,
    invert,
    key_of,
    needed,
    union,
    utf8_text,
)
from passthrough.plan.linefiles import arguments, cmdline_arg_line, edit_lines, options_line

__all__ = ["Bootloader", "Grub", "UnknownBootloader", "for_host"]


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


class KernelCmdlineFile(Bootloader):
    """systemd-boot / Proxmox: /etc/kernel/cmdline, then the tool that copies it to the ESP;
    without that file, the loader entries themselves (every one that can boot)."""

    name = BootloaderKind.SYSTEMD_BOOT
    PATH = "etc/kernel/cmdline"

    def configured(self) -> list[str]:
        text = self._read(self.PATH)
        if text is not None:
            return arguments(text, cmdline_arg_line, is_options=False)
        entries = loaderentries.bootable(self.root)
        return entries[0].arguments() if entries else []

    def change_for(
        self, configured: list[str], target_of: TargetOf
    ) -> tuple[ArgChange, list[Action], list[str]]:
        """Without /etc/kernel/cmdline each bootable entry gets what it lacks of its own
        target (an entry may differ from the default one: a fallback written apart)."""
        if self._read(self.PATH) is not None:
            return super().change_for(configured, target_of)
        if not loaderentries.bootable(self.root):
            if needed(configured, target_of(configured)).is_empty():
                return ArgChange(), [], []
            self._no_entry()
        writes = self._entry_writes(lambda e: needed(e.arguments(), target_of(e.arguments())))
        change = union([c for c, _w in writes])
        return change, [w for _c, w in writes], self._unbootable_notes()

    def _entry_writes(
        self, change_of: Callable[[loaderentries.Entry], ArgChange]
    ) -> list[tuple[ArgChange, WriteFile]]:
        """One exact line edit per bootable entry that needs one, the default entry first."""
        entries = loaderentries.bootable(self.root)
        if not entries:
            self._no_entry()
        default = loaderentries.default_entry(self.root, entries)
        out: list[tuple[ArgChange, WriteFile]] = []
        for entry in entries:
            change = change_of(entry)
            if change.is_empty():
                continue
            new = edit_lines(entry.text, change, options_line, "options ")
            why = "kernel arguments in the loader entry"
            if entry == default:
                why += " that boots by default"
            out.append((change, WriteFile(entry.path, new.encode(), why)))
        return out

    def _no_entry(self) -> NoReturn:
        raise UnsafeCmdline(
            "/etc/kernel/cmdline",
            "missing, and no loader entry whose `linux` kernel is installed on its partition",
        )

    def _unbootable_notes(self) -> list[str]:
        return [
            f"/{e.path}: its kernel {e.kernel} is not on the partition; left unchanged"
            for e in loaderentries.all_entries(self.root)
            if e.kernel is not None and not loaderentries.installed(self.root, e)
        ]

    def _read(self, rel: str) -> str | None:
        return utf8_text(self.root.read_bytes(rel), "/" + rel)

    def regenerate(self) -> Run:
        release = checked_release(self.host.kernel.release) or "$(uname -r)"
        return Run(
            ("kernel-install", "add", release, *self._images(release)),
            "install the kernel with the new command line",
            touches=(),
            regenerate=True,
        )

    def _images(self, release: str) -> tuple[str, ...]:
        """The kernel image and the initramfs for kernel-install. Where the kernel package
        keeps the image in /usr/lib/modules (Arch, Fedora), kernel-install's own plugins
        make the initramfs. Debian and Ubuntu keep both in /boot (vmlinuz-R, initrd.img-R)
        and have no /usr/lib/modules/R/vmlinuz: Debian 12's kernel-install refuses that
        argument ("not a file", exit 1), after the initramfs was already rebuilt (found on
        the lab's systemd-boot boot). The initramfs is named too: Debian's own plugin
        (85-initrd.install) would pick it, a kernel-install without that plugin would write
        an entry with none, which does not boot."""
        modules = f"usr/lib/modules/{release}/vmlinuz"
        boot = f"boot/vmlinuz-{release}"
        if self.root.exists(modules) or not self.root.exists(boot):
            return ("/" + modules,)
        initrd = f"boot/initrd.img-{release}"
        return ("/" + boot, "/" + initrd) if self.root.exists(initrd) else ("/" + boot,)

    def actions(self, change: ArgChange) -> list[Action]:
        text = self._read(self.PATH)
        if text is not None:
            new = edit_lines(text, change, cmdline_arg_line, "")
            return [
                WriteFile(self.PATH, new.encode(), "kernel arguments for the next boot"),
                self.regenerate(),
            ]
        return [w for _c, w in self._entry_writes(lambda _e: change)]


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


CLASSES: dict[BootloaderKind, type[Bootloader]] = {
    BootloaderKind.GRUB: Grub,
    BootloaderKind.GRUBBY: Grubby,
    BootloaderKind.SYSTEMD_BOOT: KernelCmdlineFile,
    BootloaderKind.PROXMOX: Proxmox,
    BootloaderKind.KERNELSTUB: Kernelstub,
    BootloaderKind.RPM_OSTREE: RpmOstree,
}


def for_host(root: HostRoot, host: Host) -> Bootloader | None:
    cls = CLASSES.get(host.boot.bootloader)
    return cls(root, host) if cls else None
