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

from passthrough.host.root import HostRoot
from passthrough.plan.bootloader_base import checked_entry
from passthrough.plan.kargs import utf8_text
from passthrough.plan.linefiles import arguments, options_line
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
