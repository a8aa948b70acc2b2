"""Kernel arguments through the bootloader the host really uses — one small class each.

Each knows where its configured arguments live (``configured``) and how to change them
(``actions``); the choice comes from discovery's detection, never from a guess.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar

from passthrough.errors import PassthroughError
from passthrough.host.root import HostRoot
from passthrough.model import BootloaderKind, Host
from passthrough.plan.actions import Action, Run, WriteFile
from passthrough.plan.kargs import ArgChange, UnsafeCmdline, edit, key_of, utf8_text
from passthrough.plan.shellvars import quote, read_assignments

HEADER = (
    "# Written by passthrough (GPU passthrough kernel arguments); `passthrough undo` removes it.\n"
)


class UnknownBootloader(PassthroughError):
    def __init__(self, args: Sequence[str]) -> None:
        super().__init__(
            "cannot tell which bootloader this host uses, so kernel arguments are not changed; "
            f"add them with your bootloader's tool: {' '.join(args)}"
        )


class Bootloader:
    name: ClassVar[BootloaderKind] = BootloaderKind.UNKNOWN

    def __init__(self, root: HostRoot, host: Host) -> None:
        self.root = root
        self.host = host

    def configured(self) -> list[str]:
        raise NotImplementedError

    def actions(self, change: ArgChange) -> list[Action]:
        raise NotImplementedError


class Grub(Bootloader):
    """Debian/Ubuntu GRUB: a drop-in in /etc/default/grub.d (sourced last), then update-grub."""

    name = BootloaderKind.GRUB
    DROPIN = "etc/default/grub.d/99-passthrough.cfg"
    VARS = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")

    def _files(self) -> list[str]:
        files = ["etc/default/grub"]
        files += [
            f"etc/default/grub.d/{n}"
            for n in self.root.listdir("etc/default/grub.d")
            if n.endswith(".cfg")
        ]
        return files

    def _values(self, skip_ours: bool) -> dict[str, str]:
        known = {v: "" for v in self.VARS}
        main = self.root.read_bytes("etc/default/grub")
        if main is None:
            raise UnsafeCmdline("/etc/default/grub", "missing, although GRUB was detected")
        for rel in self._files():
            if skip_ours and rel == self.DROPIN:
                continue
            text = utf8_text(self.root.read_bytes(rel), "/" + rel)
            if text is None:
                continue
            found = read_assignments(text, "/" + rel, set(self.VARS), known)
            if rel > self.DROPIN and found:
                raise UnsafeCmdline(
                    "/" + rel, f"sorts after {self.DROPIN} and sets the command line itself"
                )
        return known

    def configured(self) -> list[str]:
        values = self._values(skip_ours=False)
        return values["GRUB_CMDLINE_LINUX"].split() + values["GRUB_CMDLINE_LINUX_DEFAULT"].split()

    def actions(self, change: ArgChange) -> list[Action]:
        base = self._values(skip_ours=True)
        current = self._values(skip_ours=False)
        new_linux = edit(current["GRUB_CMDLINE_LINUX"].split(), ArgChange(drop=change.drop))
        # keys being set move to _DEFAULT (it comes last on the kernel line)
        new_linux = [a for a in new_linux if key_of(a) not in change.set]
        new_default = edit(current["GRUB_CMDLINE_LINUX_DEFAULT"].split(), change)
        lines = [HEADER]
        for var, value in (
            ("GRUB_CMDLINE_LINUX", new_linux),
            ("GRUB_CMDLINE_LINUX_DEFAULT", new_default),
        ):
            if " ".join(value) != base[var]:
                lines.append(f"{var}={quote(' '.join(value))}\n")
        tool = "update-grub" if self._has("update-grub") else "grub-mkconfig"
        argv = (
            ("update-grub",)
            if tool == "update-grub"
            else ("grub-mkconfig", "-o", "/boot/grub/grub.cfg")
        )
        return [
            WriteFile(self.DROPIN, "".join(lines).encode(), "kernel arguments for the next boot"),
            Run(argv, "regenerate grub.cfg", touches=("boot/grub/grub.cfg",), regenerate=True),
        ]

    def _has(self, tool: str) -> bool:
        return any(self.root.exists(f"{d}/{tool}") for d in ("usr/sbin", "sbin", "usr/bin"))


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
        entries = sorted(e for e in self.root.listdir("boot/loader/entries") if e.endswith(".conf"))
        release = self.host.kernel.release or ""
        chosen = next(
            (e for e in entries if release and release in e), entries[0] if entries else None
        )
        if chosen is None:
            raise UnsafeCmdline("/boot/loader/entries", "no BLS entry found")
        for line in (self.root.read(f"boot/loader/entries/{chosen}") or "").splitlines():
            if line.startswith("options "):
                return line[len("options ") :].split()
        return []

    def actions(self, change: ArgChange) -> list[Action]:
        argv = ["grubby", "--update-kernel=ALL"]
        if change.set:
            argv.append("--args=" + " ".join(change.set.values()))
        if change.drop:
            argv.append("--remove-args=" + " ".join(sorted(change.drop)))
        # BLS entries are generated per kernel: undo asks grubby to take our arguments out
        # again (and put back what they replaced) rather than restoring entries from a backup
        present = {key_of(a): a for a in self.configured()}
        back = [present[k] for k in [*change.set, *sorted(change.drop)] if k in present]
        undo = ["grubby", "--update-kernel=ALL"]
        if change.set:
            undo.append("--remove-args=" + " ".join(change.set.values()))
        if back:
            undo.append("--args=" + " ".join(back))
        return [
            Run(
                tuple(argv),
                "change the arguments of every BLS entry",
                touches=self.TOUCHES,
                undo_argv=tuple(undo),
            )
        ]


class KernelCmdlineFile(Bootloader):
    """systemd-boot / Proxmox: /etc/kernel/cmdline, then the tool that copies it to the ESP."""

    name = BootloaderKind.SYSTEMD_BOOT
    PATH = "etc/kernel/cmdline"

    def configured(self) -> list[str]:
        text = self._read(self.PATH)
        if text is not None:
            return text.split()
        entry = self._entry()
        return self._options(entry) if entry else []

    def _entry(self) -> str | None:
        for base in ("boot/loader/entries", "efi/loader/entries", "boot/efi/loader/entries"):
            for name in self.root.listdir(base):
                if name.endswith(".conf"):
                    return f"{base}/{name}"
        return None

    def _read(self, rel: str) -> str | None:
        return utf8_text(self.root.read_bytes(rel), "/" + rel)

    def _options(self, rel: str) -> list[str]:
        for line in (self._read(rel) or "").splitlines():
            if line.startswith("options"):
                return line.split()[1:]
        return []

    def regenerate(self) -> Run:
        release = self.host.kernel.release or "$(uname -r)"
        return Run(
            ("kernel-install", "add", release, f"/usr/lib/modules/{release}/vmlinuz"),
            "install the kernel with the new command line",
            touches=(),
            regenerate=True,
        )

    def actions(self, change: ArgChange) -> list[Action]:
        text = self._read(self.PATH)
        if text is not None:
            new = " ".join(edit(text.split(), change)) + "\n"
            return [
                WriteFile(self.PATH, new.encode(), "kernel arguments for the next boot"),
                self.regenerate(),
            ]
        entry = self._entry()
        if entry is None:
            raise UnsafeCmdline("/etc/kernel/cmdline", "missing, and no loader entry found")
        data = self._read(entry) or ""
        out = []
        for line in data.splitlines():
            if line.startswith("options"):
                line = "options " + " ".join(edit(line.split()[1:], change))
            out.append(line)
        return [
            WriteFile(
                entry, ("\n".join(out) + "\n").encode(), "kernel arguments in the loader entry"
            )
        ]


class Proxmox(KernelCmdlineFile):
    name = BootloaderKind.PROXMOX

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
            opts = data.get("user", {}).get("kernel_options", [])
        except (json.JSONDecodeError, AttributeError):
            raise UnsafeCmdline("/" + self.CONFIG, "is not the JSON kernelstub writes") from None
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
        present = {key_of(a): a for a in self.configured()}
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
