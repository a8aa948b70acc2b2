# SPDX-License-Identifier: Apache-2.0
"""What the host cannot live without: the PCI functions behind its root disk (through
dm/md/LVM) and its network interfaces, which a plan must never take."""

from __future__ import annotations

import posixpath

from passthrough.host.root import HostRoot
from passthrough.model import Critical, PciAddress


def _pci_of(real: str | None) -> PciAddress | None:
    """The PCI function closest to a device path (a disk or a NIC)."""
    if not real:
        return None
    found = None
    for part in real.split("/"):
        if PciAddress.looks_like(part):
            found = PciAddress.parse(part)
    return found


def _block_pci(root: HostRoot, block_rel: str, seen: set[str]) -> list[PciAddress]:
    """PCI functions under a block device, following dm/md/LVM ``slaves``."""
    real = root.resolve(block_rel)
    if real is None or real in seen:
        return []
    seen.add(real)
    out: list[PciAddress] = []
    slaves = root.listdir(f"{real}/slaves")
    for slave in slaves:
        out.extend(_block_pci(root, f"{real}/slaves/{slave}", seen))
    if not slaves:
        addr = _pci_of(real)
        if addr is not None:
            out.append(addr)
    return out


def _root_mount(root: HostRoot) -> tuple[str | None, str | None]:
    """(major:minor, source) of the filesystem mounted on /."""
    text = root.read("proc/self/mountinfo") or root.read("proc/1/mountinfo") or ""
    found: tuple[str | None, str | None] = (None, None)
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 10 or fields[4] != "/":
            continue
        try:
            sep = fields.index("-")
        except ValueError:
            continue
        found = (fields[2], fields[sep + 2] if len(fields) > sep + 2 else None)
    return found


def _net_pci(root: HostRoot, iface: str, seen: set[str]) -> list[PciAddress]:
    """PCI functions carrying an interface, through bridges, bonds and VLANs."""
    if iface in seen:
        return []
    seen.add(iface)
    base = f"sys/class/net/{iface}"
    out: list[PciAddress] = []
    for port in root.listdir(f"{base}/brif"):
        out.extend(_net_pci(root, port, seen))
    for entry in root.listdir(base):
        if entry.startswith("lower_"):
            out.extend(_net_pci(root, entry[len("lower_") :], seen))
    slaves = root.read(f"{base}/bonding/slaves")
    for slave in (slaves or "").split():
        out.extend(_net_pci(root, slave, seen))
    if not out:
        addr = _pci_of(root.resolve(f"{base}/device"))
        if addr is not None:
            out.append(addr)
    return out


def read_critical(root: HostRoot) -> Critical:
    devnum, source = _root_mount(root)
    root_pci: list[PciAddress] = []
    if devnum and not devnum.startswith("0:"):
        root_pci = _block_pci(root, f"sys/dev/block/{devnum}", set())
    if not root_pci and source and source.startswith("/dev/"):
        # btrfs and friends report an anonymous device number: use the mount source.
        root_pci = _block_pci(root, f"sys/class/block/{posixpath.basename(source)}", set())
    iface = None
    for line in (root.read("proc/net/route") or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[1] == "00000000" and fields[7] == "00000000":
            iface = fields[0]
            break
    nic_pci = _net_pci(root, iface, set()) if iface else []
    return Critical(
        root_device=source,
        root_pci=tuple(sorted(set(root_pci))),
        default_nic=iface,
        nic_pci=tuple(sorted(set(nic_pci))),
    )
