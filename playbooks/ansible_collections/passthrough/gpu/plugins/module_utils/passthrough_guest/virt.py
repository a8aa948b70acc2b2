# SPDX-License-Identifier: Apache-2.0
"""Is this a virtual machine? Read from what any root shows: the CPUID ``hypervisor``
flag in /proc/cpuinfo, DMI vendor/product, and paravirtual or emulated PCI devices.

Used by host discovery (host checks do not apply inside a guest) and by the guest check.
It takes a reader and the PCI IDs rather than a root type so that both root readers can
use it: host discovery passes the IDs of the functions it has already read, the guest check
reads them with :func:`pci_ids` (one ``uevent`` file each).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

# DMI sys_vendor / product_name fragments that name a hypervisor (lower case).
DMI_HYPERVISORS = (
    ("qemu", "QEMU"),
    ("kvm", "KVM"),
    ("amazon ec2", "Amazon EC2"),
    ("google compute engine", "Google Compute Engine"),
    ("virtual machine", "Hyper-V"),
    ("vmware", "VMware"),
    ("virtualbox", "VirtualBox"),
    ("innotek", "VirtualBox"),
    ("xen", "Xen"),
    ("openstack", "OpenStack"),
    ("cloud hypervisor", "Cloud Hypervisor"),
    ("bhyve", "bhyve"),
    ("firecracker", "Firecracker"),
)

VENDOR_VIRTIO = 0x1AF4  # Red Hat / virtio
VENDOR_REDHAT_QEMU = 0x1B36  # QEMU's own PCIe root ports, bridges, pxb
# Host bridges only emulators present: i440FX, Q35 MCH, and the one Firecracker-style
# microVMs show (8086:0d57).
EMULATED_HOST_BRIDGES = {(0x8086, 0x1237), (0x8086, 0x29C0), (0x8086, 0x0D57)}


@dataclass(frozen=True, slots=True)
class VirtualMachine:
    """Whether this machine is itself a guest, which hypervisor, and what says so."""

    guest: bool
    hypervisor: str | None  # a name when DMI or the devices say which
    evidence: tuple[str, ...]


NOT_A_VM = VirtualMachine(False, None, ())


# (address, vendor, device) of one PCI function; None where the root does not say
PciIds = tuple[str, "int | None", "int | None"]


# An ID as sysfs and uevent write it (``0x10de``, ``10DE``): ASCII hex digits only, where
# int(x, 16) alone would also take signs, underscores, spaces and non-ASCII digits.
HEX = re.compile(r"(?:0x)?[0-9A-Fa-f]{1,8}")
# A function's name under sys/bus/pci/devices (domain:bus:device.function).
PCI_NAME = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def hex_id(text: str | None) -> int | None:
    return int(text, 16) if text and HEX.fullmatch(text) else None


def parse_uevent(text: str | None) -> dict[str, str]:
    """A ``uevent`` file's KEY=value lines as a mapping."""
    pairs = {}
    for line in (text or "").splitlines():
        key, equals, value = line.partition("=")
        if equals:
            pairs[key] = value
    return pairs


def uevent(read: Callable[[str], str | None], device: str) -> dict[str, str]:
    """A device directory's ``uevent`` (empty where the root has no file)."""
    return parse_uevent(read(f"{device}/uevent"))


def hex_pair(text: str) -> tuple[int | None, int | None]:
    """``10DE:2330`` → (0x10de, 0x2330); None for a half that is not hex."""
    first, _colon, second = text.partition(":")
    return hex_id(first), hex_id(second)


def pci_ids(
    read: Callable[[str], str | None], listdir: Callable[[str], list[str]]
) -> Iterator[PciIds]:
    """Every function under ``sys/bus/pci/devices``: its IDs from ``uevent`` (PCI_ID), or
    from the ``vendor`` and ``device`` files where that line is missing."""
    for addr in listdir("sys/bus/pci/devices"):
        if not PCI_NAME.fullmatch(addr):
            continue  # not what the kernel names a function: nothing to read there
        base = f"sys/bus/pci/devices/{addr}"
        event = uevent(read, base)
        if "PCI_ID" in event:
            yield (addr, *hex_pair(event["PCI_ID"]))
        else:
            yield addr, hex_id(read(f"{base}/vendor")), hex_id(read(f"{base}/device"))


def detect(read: Callable[[str], str | None], devices: Iterable[PciIds]) -> VirtualMachine:
    """``read`` takes paths relative to the root (``proc/cpuinfo``); ``devices``: the PCI
    functions' IDs."""
    evidence: list[str] = []
    hypervisor: str | None = None
    for line in (read("proc/cpuinfo") or "").splitlines():
        key, _colon, value = line.partition(":")
        if key.strip() == "flags":
            if "hypervisor" in value.split():
                evidence.append("CPUID hypervisor flag (/proc/cpuinfo)")
            break
    dmi = " ".join(
        x for x in (read("sys/class/dmi/id/sys_vendor"), read("sys/class/dmi/id/product_name")) if x
    )
    for fragment, name in DMI_HYPERVISORS:
        if fragment in dmi.lower():
            evidence.append(f"DMI: {dmi}")
            hypervisor = name
            break
    virtio = 0
    for addr, vendor, device in devices:
        if vendor == VENDOR_VIRTIO:
            virtio += 1
        elif vendor == VENDOR_REDHAT_QEMU:
            evidence.append(f"QEMU PCI device {vendor:04x}:{device or 0:04x} at {addr}")
            hypervisor = hypervisor or "QEMU"
        elif (vendor, device) in EMULATED_HOST_BRIDGES:
            evidence.append(f"emulated host bridge {vendor:04x}:{device or 0:04x} at {addr}")
    if virtio:
        evidence.append(f"{virtio} virtio PCI function{'s' if virtio > 1 else ''} (1af4:*)")
    return VirtualMachine(bool(evidence), hypervisor, tuple(evidence))
