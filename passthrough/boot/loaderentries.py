# SPDX-License-Identifier: Apache-2.0
"""Type #1 loader entries (the Boot Loader Specification) as systemd-boot reads them.

Where there is no ``/etc/kernel/cmdline`` the entries are the configuration: Arch's usual
setup is hand-written ``loader/entries/arch.conf`` and ``arch-fallback.conf`` (one pair per
kernel package) on the ESP, mounted at ``/boot``, ``/efi`` or ``/boot/efi``. Every entry
whose ``linux`` kernel is on that partition can boot; which one boots unattended is
``LoaderEntryDefault`` (an EFI variable set from the menu) or else ``loader.conf``'s
``default`` (a glob; ``@saved`` is the entry booted last, ``LoaderEntryLastBooted``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import NoReturn

from passthrough.actions import Action, PlanRecord, Run, WriteFile
from passthrough.boot import loaderentries, uki
from passthrough.boot.base import (
    Bootloader,
    TargetOf,
    checked_entry,
    checked_release,
)
from passthrough.boot.linefiles import (
    WORD,
    arguments,
    cmdline_arg_line,
    edit_lines,
    options_line,
    without_spans,
)
from passthrough.boot.readback import NextBoot, lacking
from passthrough.host.root import HostRoot
from passthrough.kargs import (
    ArgChange,
    UnsafeCmdline,
    needed,
    union,
    utf8_text,
)
from passthrough.model import BootloaderKind
from passthrough.records import frozen

# where the ESP (or XBOOTLDR) is mounted on the hosts we know, in the order bootctl looks
ESP_MOUNTS = ("efi", "boot", "boot/efi")
EFIVARS = "sys/firmware/efi/efivars"
LOADER_GUID = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"


@frozen
class Entry:
    """A boot loader entry file and the partition it lives on."""

    path: str  # relative to the root: boot/loader/entries/arch.conf
    mount: str  # the partition's mount point, relative to the root: boot
    text: str

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def kernel(self) -> str | None:
        """The ``linux`` line's path (relative to the entry's partition), None for an
        entry that boots no Linux kernel (``efi``, ``uki``)."""
        for line in self.text.split("\n"):
            words = line.split()
            if len(words) >= 2 and words[0] == "linux":
                return words[1]
        return None

    def arguments(self) -> list[str]:
        return arguments(self.text, options_line, is_options=True)


def all_entries(root: HostRoot) -> list[Entry]:
    """Every ``*.conf`` under each mount point's ``loader/entries`` (a mount point reached
    twice through a link counted once), in name order. Names that cannot be file names
    are refused (BadName)."""
    out: list[Entry] = []
    seen: set[str] = set()
    for mount in ESP_MOUNTS:
        folder = f"{mount}/loader/entries"
        real = root.resolve(folder) or folder
        if real in seen or not root.isdir(folder):
            continue
        seen.add(real)
        for name in sorted(root.listdir(folder)):
            if not name.endswith(".conf"):
                continue
            rel = f"{folder}/{checked_entry(name)}"
            text = utf8_text(root.read_bytes(rel), "/" + rel)
            if text is not None:
                out.append(Entry(rel, mount, text))
    return out


def installed(root: HostRoot, entry: Entry) -> bool:
    """The entry's kernel is a file on its partition: systemd-boot could load it."""
    kernel = entry.kernel
    return kernel is not None and root.isfile(f"{entry.mount}/{kernel.lstrip('/')}")


def _efivar(root: HostRoot, name: str) -> str | None:
    """A systemd-boot EFI variable's string (4 attribute bytes, then UTF-16LE, NUL-ended)."""
    data = root.read_bytes(f"{EFIVARS}/{name}-{LOADER_GUID}")
    if data is None or len(data) < 6:
        return None
    try:
        return data[4:].decode("utf-16-le").split("\0", 1)[0] or None
    except UnicodeDecodeError:
        return None


def _loader_conf_default(root: HostRoot) -> str | None:
    """``default`` of loader.conf on the first mount point that has one (a later line wins,
    as systemd-boot reads it)."""
    for mount in ESP_MOUNTS:
        text = root.read(f"{mount}/loader/loader.conf")
        if text is None:
            continue
        value = None
        for line in text.split("\n"):
            words = line.split(None, 1)
            if len(words) == 2 and words[0] == "default":
                value = words[1].strip()
        return value
    return None


def default_pattern(root: HostRoot) -> str | None:
    """What names the default entry: the EFI variable set from the menu, else loader.conf's
    ``default`` (``@saved``: the entry booted last, where that variable is visible)."""
    chosen = _efivar(root, "LoaderEntryDefault")
    if chosen is not None:
        return chosen
    pattern = _loader_conf_default(root)
    if pattern == "@saved":
        return _efivar(root, "LoaderEntryLastBooted")
    return pattern


def _matches(pattern: str, entry: Entry) -> bool:
    # systemd-boot matches the entry's id, the file name; newer versions also without .conf
    return fnmatch.fnmatchcase(entry.name, pattern) or fnmatch.fnmatchcase(
        entry.name.removesuffix(".conf"), pattern
    )


def default_entry(root: HostRoot, entries: list[Entry]) -> Entry | None:
    """Which of ``entries`` boots unattended. Several matching a glob: systemd-boot sorts
    entries newest version first, so the name sorting last is taken."""
    pattern = default_pattern(root)
    if pattern is None:
        return None
    hits = sorted((e for e in entries if _matches(pattern, e)), key=lambda e: e.name)
    return hits[-1] if hits else None


def bootable(root: HostRoot) -> list[Entry]:
    """The entries that can boot, the default one first, the others in name order."""
    entries = [e for e in all_entries(root) if installed(root, e)]
    default = default_entry(root, entries)
    return entries if default is None else [default, *(e for e in entries if e != default)]


def check_loader_entries(root: HostRoot, record: PlanRecord, out: NextBoot) -> None:
    entries = bootable(root)
    ukis = check_ukis(root, record, out)
    if not entries and not ukis:
        # entries whose kernel is not where the loader looks (relative to the entry's own
        # partition): kernel-install run in a tree whose ESP is a plain folder, not a mount
        # point, names its files from the tree's / (``linux /boot/efi/...``) -- nothing boots
        stranded = [e for e in all_entries(root) if e.kernel is not None]
        for e in stranded:
            out.missing.append(
                f"/{e.path}: its kernel {e.kernel} is not on the partition at /{e.mount}, "
                "so the loader cannot boot it"
            )
        if not stranded:
            out.unchecked.append("loader entries (none on /efi, /boot or /boot/efi)")
        return
    check_entries(root, entries, record, out)


def without(text: str, words: list[str]) -> str:
    """``text`` with every one of ``words`` taken out of its ``options`` lines (each
    occurrence, as a whole word); every other byte stays."""
    lines = text.split("\n")
    for n, line in enumerate(lines):
        if options_line(line):
            spans = [m.span() for m in list(WORD.finditer(line))[1:] if m[0] in words]
            lines[n] = without_spans(line, spans)
    return "\n".join(lines)


class KernelCmdlineFile(Bootloader):
    """systemd-boot / Proxmox: /etc/kernel/cmdline, then the tool that copies it to the ESP;
    without that file, the loader entries themselves (every one that can boot)."""

    name = BootloaderKind.SYSTEMD_BOOT
    PATH = "etc/kernel/cmdline"

    def configured(self) -> list[str]:
        text = self._read(self.PATH)
        if text is not None:
            return arguments(text, cmdline_arg_line, is_options=False)
        entries = bootable(self.root)
        return entries[0].arguments() if entries else []

    def change_for(
        self, configured: list[str], target_of: TargetOf
    ) -> tuple[ArgChange, list[Action], list[str]]:
        """Without /etc/kernel/cmdline each bootable entry gets what it lacks of its own
        target (an entry may differ from the default one: a fallback written apart)."""
        if self._read(self.PATH) is not None:
            return super().change_for(configured, target_of)
        if not bootable(self.root):
            if needed(configured, target_of(configured)).is_empty():
                return ArgChange(), [], []
            self._no_entry()
        writes = self._entry_writes(lambda e: needed(e.arguments(), target_of(e.arguments())))
        change = union([c for c, _w in writes])
        return change, [w for _c, w in writes], self._unbootable_notes()

    def _entry_writes(
        self, change_of: Callable[[Entry], ArgChange]
    ) -> list[tuple[ArgChange, WriteFile]]:
        """One exact line edit per bootable entry that needs one, the default entry first."""
        entries = bootable(self.root)
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
            for e in all_entries(self.root)
            if e.kernel is not None and not installed(self.root, e)
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


def check_entries(root: HostRoot, entries: list[Entry], record: PlanRecord, out: NextBoot) -> None:
    for entry in entries:
        if gone := lacking(entry.arguments(), record):
            out.missing.append(f"/{entry.path}: {' '.join(gone)}")
        out.checked.append("/" + entry.path)


def check_ukis(root: HostRoot, record: PlanRecord, out: NextBoot) -> bool:
    """Each unified kernel image in ``EFI/Linux`` of an ESP: the command line its
    ``.cmdline`` section carries (kernel-install built it in from /etc/kernel/cmdline).
    True when there was one."""
    images = sorted({i for m in ESP_MOUNTS for i in root.glob(f"{m}/EFI/Linux/*.efi")})
    for image in images:
        try:
            args = uki.cmdline(root.real(image))
        except (OSError, uki.NotPE) as exc:
            out.unchecked.append(f"/{image} (not a readable PE image: {exc})")
            continue
        if args is None:
            out.unchecked.append(f"/{image} (no .cmdline section: the loader gives the line)")
            continue
        if gone := lacking(args, record):
            out.missing.append(f"/{image} (.cmdline): {' '.join(gone)}")
        out.checked.append("/" + image)
    return bool(images)
