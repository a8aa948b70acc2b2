# SPDX-License-Identifier: Apache-2.0
"""The PCI tree under sys/: device directories, config space, resources, links."""

from __future__ import annotations

import struct
from pathlib import Path

from passthrough.errors import BadDescription
from passthrough.fakehost.description import Description, Node
from passthrough.fakehost.hostfiles import write_host_files
from passthrough.fakehost.writer import Writer

# Driver name → module (the kernel's sys/bus/pci/drivers/X/module link); "" = built in.
DRIVER_MODULES = {
    "xhci_hcd": "xhci_pci",
    "nvidia-gpu": "i2c_nvidia_gpu",
    "pcieport": "",
    "ahci": "ahci",
}


def _subordinate(n: Node) -> int:
    return max(
        [c.address.bus for c in n.children] + [_subordinate(c) for c in n.children], default=0
    )


def _config_space(n: Node, multifunction: bool, secondary: int | None) -> bytes:
    header_type = (0x01 if n.is_bridge else 0x00) | (0x80 if multifunction else 0)
    cfg = bytearray(256)
    struct.pack_into("<HHHH", cfg, 0, n.vendor, n.device, 0x0007, 0x0010)
    cfg[8] = n.revision
    cfg[9] = n.class_code & 0xFF
    cfg[10] = (n.class_code >> 8) & 0xFF
    cfg[11] = (n.class_code >> 16) & 0xFF
    cfg[14] = header_type
    if n.is_bridge:
        cfg[0x18] = n.address.bus
        cfg[0x19] = secondary if secondary is not None else 0
        cfg[0x1A] = _subordinate(n) if secondary is not None else 0
    elif n.subsystem:
        struct.pack_into("<HH", cfg, 0x2C, *n.subsystem)
    return bytes(cfg)


class _Allocator:
    """Hands out aligned BAR addresses so resource files look like a real host's."""

    def __init__(self) -> None:
        self.mem32 = 0xC000_0000
        self.mem64 = 0x200_0000_0000
        self.io = 0x3000

    def take(self, size: int, io: bool, is64: bool) -> int:
        attr = "io" if io else "mem64" if is64 else "mem32"
        base: int = getattr(self, attr)
        start = (base + size - 1) // size * size
        setattr(self, attr, start + size)
        return start


def _resource(n: Node, alloc: _Allocator) -> str:
    lines = []
    for index in range(13):
        bar = n.bars.get(index) if index < 6 else None
        if bar is None:
            lines.append(f"0x{0:016x} 0x{0:016x} 0x{0:016x}")
            continue
        size, io, is64, pref = bar
        start = alloc.take(size, io, is64)
        flags = 0x100 if io else 0x200
        if is64:
            flags |= 0x00100000 | 0x4
        if pref:
            flags |= 0x2000 | 0x8
        flags |= 0x40000  # IORESOURCE_SIZEALIGN
        lines.append(f"0x{start:016x} 0x{start + size - 1:016x} 0x{flags:016x}")
    return "\n".join(lines) + "\n"


def modalias(n: Node) -> str:
    sv, sd = n.subsystem or (0, 0)
    return (
        f"pci:v{n.vendor:08X}d{n.device:08X}sv{sv:08X}sd{sd:08X}"
        f"bc{n.class_code >> 16:02X}sc{(n.class_code >> 8) & 0xFF:02X}i{n.class_code & 0xFF:02X}"
    )


def uevent(n: Node) -> dict[str, str]:
    """The kernel's uevent variables for a PCI function (drivers/pci/pci-driver.c)."""
    sv, sd = n.subsystem or (0, 0)
    env = {"DRIVER": n.driver} if n.driver else {}
    env.update(
        {
            "PCI_CLASS": f"{n.class_code:X}",
            "PCI_ID": f"{n.vendor:04X}:{n.device:04X}",
            "PCI_SUBSYS_ID": f"{sv:04X}:{sd:04X}",
            "PCI_SLOT_NAME": str(n.address),
            "MODALIAS": modalias(n),
        }
    )
    return env


def build(desc: Description, dest: str | Path) -> Path:
    """Write the host root for ``desc`` into ``dest`` (created; must be empty or absent)."""
    out = Path(dest)
    if out.exists() and any(out.iterdir()):
        raise BadDescription(str(out), "destination exists and is not empty")
    w = Writer(out)
    alloc = _Allocator()
    slots: dict[tuple[int, int, int], int] = {}
    for n in desc.nodes:
        slots[n.address.slot] = slots.get(n.address.slot, 0) + 1

    def place(n: Node) -> None:
        secondary = min((c.address.bus for c in n.children), default=None)
        d = n.path
        w.file(f"{d}/vendor", f"0x{n.vendor:04x}\n")
        w.file(f"{d}/device", f"0x{n.device:04x}\n")
        w.file(f"{d}/class", f"0x{n.class_code:06x}\n")
        w.file(f"{d}/revision", f"0x{n.revision:02x}\n")
        sv, sd = n.subsystem or (0, 0)
        w.file(f"{d}/subsystem_vendor", f"0x{sv:04x}\n")
        w.file(f"{d}/subsystem_device", f"0x{sd:04x}\n")
        w.file(f"{d}/numa_node", f"{n.numa}\n")
        w.file(f"{d}/modalias", modalias(n) + "\n")
        w.file(f"{d}/uevent", "".join(f"{k}={v}\n" for k, v in uevent(n).items()))
        w.file(f"{d}/resource", _resource(n, alloc))
        w.file(f"{d}/config", _config_space(n, slots[n.address.slot] > 1, secondary))
        w.file(f"{d}/enable", "1\n")
        w.file(f"{d}/driver_override", "(null)\n")
        if n.boot_vga is not None:
            w.file(f"{d}/boot_vga", "1\n" if n.boot_vga else "0\n")
        if n.reset:
            w.file(f"{d}/reset_method", " ".join(n.reset) + "\n")
        if n.sriov_totalvfs is not None:
            w.file(f"{d}/sriov_totalvfs", f"{n.sriov_totalvfs}\n")
        w.link(f"{d}/subsystem", "sys/bus/pci")
        w.link(f"sys/bus/pci/devices/{n.address}", d)
        if n.driver:
            w.link(f"{d}/driver", f"sys/bus/pci/drivers/{n.driver}")
            w.link(f"sys/bus/pci/drivers/{n.driver}/{n.address}", d)
            module = DRIVER_MODULES.get(n.driver, n.driver.replace("-", "_"))
            if module:
                w.link(f"sys/bus/pci/drivers/{n.driver}/module", f"sys/module/{module}")
                w.dir(f"sys/module/{module}")
        if n.group is not None:
            w.link(f"{d}/iommu_group", f"sys/kernel/iommu_groups/{n.group}")
            w.link(f"sys/kernel/iommu_groups/{n.group}/devices/{n.address}", d)
        for child in n.children:
            place(child)

    for n in desc.top:
        place(n)
    by_addr = {n.address: n for n in desc.nodes}
    for n in desc.nodes:
        if n.physfn is not None:
            pf = by_addr.get(n.physfn)
            if pf is None:
                raise BadDescription(desc.source, f"{n.address}: physfn {n.physfn} not described")
            w.link(f"{n.path}/physfn", pf.path)
            w.link(f"{pf.path}/virtfn{n.address.function}", n.path)

    write_host_files(desc, w, by_addr)
    return out
