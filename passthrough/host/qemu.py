# SPDX-License-Identifier: Apache-2.0
"""What a root's QEMU gives a guest: the emulator binary, the firmware descriptors libvirt
chooses from, and the CPU threads per core a guest topology can mirror.

Read from the root's files (so a snapshot carries them: it keeps every file discovery
reads): the emulator where the distro installs it (``/usr/libexec/qemu-kvm`` on RHEL,
Rocky and Alma; ``/usr/bin/qemu-system-x86_64`` elsewhere), and QEMU's firmware interop
descriptors (``docs/interop/firmware.json`` of QEMU: ``/usr/share/qemu/firmware/*.json``,
a file of the same name in ``/etc/qemu/firmware`` overriding it, first by name wins —
the order libvirt reads them in for ``<os firmware='efi'>``).
"""

from __future__ import annotations

import fnmatch
import json
import re

from passthrough.errors import NotAHostRoot
from passthrough.host.root import HostRoot
from passthrough.records import frozen

# searched in this order: the upstream name first (Fedora ships both: its qemu-kvm is a link)
EMULATORS = ("usr/bin/qemu-system-x86_64", "usr/libexec/qemu-kvm", "usr/bin/qemu-kvm")
FIRMWARE_DIRS = ("etc/qemu/firmware", "usr/share/qemu/firmware")
SECURE_ENROLLED = ("secure-boot", "enrolled-keys")


@frozen
class Firmware:
    """One descriptor: a UEFI build for x86_64 q35, its features and its files."""

    descriptor: str  # the descriptor's path in the root
    code: str | None
    vars_template: str | None
    features: tuple[str, ...]

    @property
    def secure_enrolled(self) -> bool:
        return all(f in self.features for f in SECURE_ENROLLED)


@frozen
class QemuPlatform:
    emulator: str | None  # an absolute path, None: no emulator in the root
    userland: bool  # the root has a /usr/bin: an emulator would be there (not a bare tree)
    firmware: tuple[Firmware, ...] = ()  # UEFI x86_64 q35 builds, in libvirt's order
    threads_per_core: int = 1  # siblings / cpu cores of /proc/cpuinfo; 1 where unknown

    @property
    def secure_firmware(self) -> Firmware | None:
        """The build libvirt picks for Secure Boot with enrolled keys (first in order)."""
        return next((f for f in self.firmware if f.secure_enrolled), None)


def _q35_uefi(data: object) -> bool:
    if not isinstance(data, dict) or "uefi" not in data.get("interface-types", []):
        return False
    for target in data.get("targets", []):
        if isinstance(target, dict) and target.get("architecture") == "x86_64":
            machines = [m for m in target.get("machines", []) if isinstance(m, str)]
            if any(fnmatch.fnmatchcase("pc-q35-9.0", m) for m in machines):
                return True
    return False


def _filename(mapping: dict[str, object], key: str) -> str | None:
    entry = mapping.get(key)
    name = entry.get("filename") if isinstance(entry, dict) else None
    return name if isinstance(name, str) else None


def read_firmware(root: HostRoot) -> tuple[Firmware, ...]:
    """The root's UEFI firmware descriptors for x86_64 q35, in the order libvirt tries them."""
    chosen: dict[str, str] = {}
    for directory in reversed(FIRMWARE_DIRS):  # /etc's file of a name replaces /usr's
        for rel in root.glob(f"{directory}/*.json"):
            chosen[rel.rpartition("/")[2]] = rel
    found: list[Firmware] = []
    for name in sorted(chosen):
        try:
            data = json.loads(root.read(chosen[name]) or "null")
        except ValueError:
            continue  # libvirt skips a descriptor it cannot parse too
        if not _q35_uefi(data):
            continue
        mapping = data.get("mapping", {})
        if not isinstance(mapping, dict):
            continue
        features = tuple(f for f in data.get("features", []) if isinstance(f, str))
        found.append(
            Firmware(
                descriptor="/" + chosen[name],
                code=_filename(mapping, "executable"),
                vars_template=_filename(mapping, "nvram-template"),
                features=features,
            )
        )
    return tuple(found)


def read_threads_per_core(root: HostRoot) -> int:
    """Hardware threads per core from the first CPU of /proc/cpuinfo (``siblings`` over
    ``cpu cores``); 1 where the file does not say."""
    text = root.read("proc/cpuinfo") or ""
    first = text.split("\n\n", 1)[0]
    values = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in first.splitlines())
    )
    siblings, cores = values.get("siblings", ""), values.get("cpu cores", "")
    if re.fullmatch(r"\d+", siblings) and re.fullmatch(r"\d+", cores) and int(cores):
        return max(1, int(siblings) // int(cores))
    return 1


def read_qemu(root: HostRoot) -> QemuPlatform:
    """What a guest rendered for this root is run with (``snapshot`` keeps what it read)."""
    emulator = next((rel for rel in EMULATORS if root.isfile(rel)), None)
    return QemuPlatform(
        emulator="/" + emulator if emulator else None,
        userland=root.isdir("usr/bin"),
        firmware=read_firmware(root),
        threads_per_core=read_threads_per_core(root),
    )


def qemu_of(root_path: str) -> QemuPlatform | None:
    """:func:`read_qemu` of the root a host was discovered from; None where it is gone (a
    host built in memory)."""
    try:
        return read_qemu(HostRoot(root_path))
    except NotAHostRoot:
        return None
