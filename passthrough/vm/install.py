# SPDX-License-Identifier: Apache-2.0
"""What a guest is installed and run with, beside its cards: the emulator and machine the
host has, the vCPU topology (one place for libvirt and KubeVirt), the firmware's Secure Boot
with enrolled keys, an emulated TPM 2.0, the installer and driver CD-ROMs with the boot
order, USB input and a console.

The profile decides what a value left out means: a Windows 11 guest gets what Setup needs
(TPM 2.0, Secure Boot, a SATA disk it sees without a driver, USB tablet and keyboard, a VNC
console); a Linux guest gets none of them and its serial console. Each can be turned off
(or on) by its option.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from passthrough.errors import PassthroughError
from passthrough.host.qemu import QemuPlatform
from passthrough.records import frozen
from passthrough.vm.options import BadVmSpec

T = TypeVar("T")


class InstallOptions(Protocol):
    """The guest options this module reads (spec.VmOptions has them)."""

    @property
    def profile(self) -> str: ...

    @property
    def vcpus(self) -> int: ...

    @property
    def cdrom(self) -> str | None: ...

    @property
    def driver_iso(self) -> str | None: ...

    @property
    def seed(self) -> str | None: ...

    @property
    def disk_bus(self) -> str | None: ...

    @property
    def secure_boot(self) -> bool | None: ...

    @property
    def tpm(self) -> bool | None: ...

    @property
    def usb_input(self) -> bool | None: ...

    @property
    def graphics(self) -> str | None: ...

    @property
    def headless(self) -> bool: ...

    @property
    def topology(self) -> bool: ...


DEFAULT_EMULATOR = "/usr/bin/qemu-system-x86_64"
# QEMU's q35 alias is its newest pc-q35-X.Y machine: libvirt writes the versioned name back
MACHINE = "q35"


class NoEmulator(PassthroughError):
    """The root has an OS but no QEMU: a domain for it names an emulator it lacks."""


@frozen
class Topology:
    """``<cpu><topology>`` and KubeVirt's ``domain.cpu``: one socket (Windows 11 Pro runs
    on 2 sockets at most, Home on 1), the vCPUs as cores, threads as the host's SMT where
    the vCPU count divides by it."""

    sockets: int
    cores: int
    threads: int


def topology(vcpus: int, threads_per_core: int) -> Topology:
    threads = threads_per_core if threads_per_core > 1 and vcpus % threads_per_core == 0 else 1
    return Topology(sockets=1, cores=vcpus // threads, threads=threads)


@frozen
class Drive:
    """A ``<disk>``: the guest's disk or a CD-ROM, its bus and target, its boot order."""

    device: str  # disk | cdrom
    path: str
    bus: str  # virtio | sata
    target: str  # vda, sda, sdb...
    format: str  # qcow2 | raw
    boot_order: int | None = None


@frozen
class Install:
    emulator: str
    machine: str
    topology: Topology
    topology_element: bool  # written into the libvirt domain (off: libvirt's default)
    secure_boot: bool
    tpm: bool
    usb_input: bool
    graphics: str | None  # vnc | spice | None
    drives: tuple[Drive, ...]
    boot_dev: str | None  # <os><boot dev=...> where no drive carries a boot order


def _emulator(qemu: QemuPlatform | None, warnings: list[str]) -> str:
    if qemu is None or (qemu.emulator is None and not qemu.userland):
        if qemu is not None:  # a bare tree (sysfs and proc only): nothing to read it from
            warnings.append(
                f"no emulator read: this root has no /usr/bin; {DEFAULT_EMULATOR} assumed"
            )
        return DEFAULT_EMULATOR
    if qemu.emulator is None:
        raise NoEmulator(
            "no QEMU in this root (none of /usr/bin/qemu-system-x86_64, /usr/libexec/qemu-kvm): "
            "install it (qemu-system-x86 on Debian and Ubuntu, qemu-kvm on the RHEL family)"
        )
    return qemu.emulator


def _drives(
    disk: str | None, disk_format: str, disk_bus: str, cdroms: list[tuple[str, bool]]
) -> tuple[Drive, ...]:
    """The disk, then the CD-ROMs ((path, boots) each), SATA targets counted in order."""
    drives: list[Drive] = []
    sata = iter("abcdefghijklmnopqrstuvwxyz")
    boots = any(b for _, b in cdroms)
    if disk:
        target = "vda" if disk_bus == "virtio" else f"sd{next(sata)}"
        drives.append(Drive("disk", disk, disk_bus, target, disk_format, 2 if boots else None))
    for path, boot in cdroms:
        drives.append(Drive("cdrom", path, "sata", f"sd{next(sata)}", "raw", 1 if boot else None))
    return tuple(drives)


def build_install(
    opts: InstallOptions,
    qemu: QemuPlatform | None,
    disk: str | None,
    disk_format: str,
    warnings: list[str],
) -> Install:
    """The install pieces of a guest from its options, the profile's defaults and the host."""
    windows = opts.profile == "windows"

    def choose(value: T | None, windows_default: T, linux_default: T) -> T:
        return value if value is not None else windows_default if windows else linux_default

    graphics = choose(opts.graphics, "vnc", None)
    if opts.headless:
        if opts.graphics is not None:
            raise BadVmSpec("headless", "a headless guest has no graphics (leave out --graphics)")
        graphics = None
    disk_bus = choose(opts.disk_bus, "virtio" if opts.driver_iso else "sata", "virtio")
    cdroms = [(p, b) for p, b in ((opts.cdrom, True), (opts.driver_iso, False)) if p]
    if opts.seed:
        cdroms.append((opts.seed, False))
    secure_boot = choose(opts.secure_boot, True, False)
    if secure_boot and qemu is not None and qemu.firmware and qemu.secure_firmware is None:
        warnings.append(
            "Secure Boot with enrolled keys: no firmware descriptor in this root's "
            "/usr/share/qemu/firmware offers it (libvirt will refuse the domain; install the "
            "OVMF build with Microsoft keys, or --no-secure-boot)"
        )
    return Install(
        emulator=_emulator(qemu, warnings),
        machine=MACHINE,
        topology=topology(opts.vcpus, qemu.threads_per_core if qemu else 1),
        topology_element=opts.topology,
        secure_boot=secure_boot,
        tpm=choose(opts.tpm, True, False),
        usb_input=choose(opts.usb_input, True, False),
        graphics=graphics,
        drives=_drives(disk, disk_format, disk_bus, cdroms),
        boot_dev=None if opts.cdrom else "hd",
    )
