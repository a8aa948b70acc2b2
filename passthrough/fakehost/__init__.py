"""Host roots built from a compact description: sample hosts and test fixtures.

A description (YAML, see ``hosts/*.yaml``) names the CPU, kernel, distro, firmware and
the PCI tree; :func:`build` writes a real directory tree as the kernel shows it —
relative symlinks where sysfs has links, a ``config`` file per function so that
``lspci -A linux-sysfs`` reads it too — plus the few proc/etc/boot files discovery
reads. :func:`umockdev_record` writes the same PCI devices as a umockdev record.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from passthrough.errors import BadDescription, PassthroughError
from passthrough.host.pciids import render_subset
from passthrough.model import PciAddress

HOSTS_DIR = Path(__file__).with_name("hosts")

CLASS_ALIASES = {
    "host-bridge": 0x060000,
    "isa-bridge": 0x060100,
    "bridge": 0x060400,
    "other-bridge": 0x068000,
    "vga": 0x030000,
    "3d": 0x030200,
    "display": 0x038000,
    "audio": 0x040300,
    "usb": 0x0C0330,
    "ucsi": 0x0C8000,
    "smbus": 0x0C0500,
    "sata": 0x010601,
    "nvme": 0x010802,
    "raid": 0x010400,
    "ethernet": 0x020000,
    "infiniband": 0x020700,
    "wifi": 0x028000,
    "signal": 0x118000,
    "system": 0x088000,
    "encryption": 0x108000,
}

GIB = 1 << 30
SIZE_RE = re.compile(r"^(\d+)([KMGT]?)$")
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

DISTROS: dict[str, dict[str, Any]] = {
    "debian-12": {
        "os_release": {
            "ID": "debian",
            "VERSION_ID": "12",
            "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)",
        },
        "release": "6.1.0-27-amd64",
        "bootloader": "grub",
        "initramfs": "initramfs-tools",
        # as Debian builds it: on by default except for an integrated GPU
        "config": {
            "CONFIG_INTEL_IOMMU_DEFAULT_ON": "n",
            "CONFIG_INTEL_IOMMU_DEFAULT_ON_INTGPU_OFF": "y",
        },
    },
    "ubuntu-24.04": {
        "os_release": {
            "ID": "ubuntu",
            "ID_LIKE": "debian",
            "VERSION_ID": "24.04",
            "PRETTY_NAME": "Ubuntu 24.04.1 LTS",
        },
        "release": "6.8.0-48-generic",
        "bootloader": "grub",
        "initramfs": "initramfs-tools",
        "config": {"CONFIG_INTEL_IOMMU_DEFAULT_ON": "y"},
    },
    "proxmox-8": {
        "os_release": {
            "ID": "debian",
            "VERSION_ID": "12",
            "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)",
        },
        "release": "6.8.12-4-pve",
        "bootloader": "proxmox-boot-tool",
        "initramfs": "initramfs-tools",
        "config": {"CONFIG_INTEL_IOMMU_DEFAULT_ON": "y"},
    },
    "rhel-9": {
        "os_release": {
            "ID": "rhel",
            "ID_LIKE": "fedora",
            "VERSION_ID": "9.4",
            "PRETTY_NAME": "Red Hat Enterprise Linux 9.4 (Plow)",
        },
        "release": "5.14.0-427.13.1.el9_4.x86_64",
        "bootloader": "grubby",
        "initramfs": "dracut",
        "config": {"CONFIG_INTEL_IOMMU_DEFAULT_ON": "y"},
    },
    "fedora-40": {
        "os_release": {
            "ID": "fedora",
            "VERSION_ID": "40",
            "PRETTY_NAME": "Fedora Linux 40 (Workstation Edition)",
        },
        "release": "6.10.11-200.fc40.x86_64",
        "bootloader": "grubby",
        "initramfs": "dracut",
        "config": {"CONFIG_INTEL_IOMMU_DEFAULT_ON": "y"},
    },
    "arch": {
        "os_release": {"ID": "arch", "PRETTY_NAME": "Arch Linux"},
        "release": "6.11.5-arch1-1",
        "bootloader": "systemd-boot",
        "initramfs": "mkinitcpio",
        "config": {"CONFIG_INTEL_IOMMU_DEFAULT_ON": "y"},
    },
    "popos-22.04": {
        "os_release": {
            "ID": "pop",
            "ID_LIKE": "ubuntu debian",
            "VERSION_ID": "22.04",
            "PRETTY_NAME": "Pop!_OS 22.04 LTS",
        },
        "release": "6.9.3-76060903-generic",
        "bootloader": "kernelstub",
        "initramfs": "initramfs-tools",
        "config": {"CONFIG_INTEL_IOMMU_DEFAULT_ON": "y"},
    },
}

BASE_CONFIG = {
    "CONFIG_INTEL_IOMMU": "y",
    "CONFIG_AMD_IOMMU": "y",
    "CONFIG_IRQ_REMAP": "y",
    "CONFIG_VFIO": "m",
    "CONFIG_VFIO_PCI": "m",
    "CONFIG_SYSFB_SIMPLEFB": "y",
    "CONFIG_FB_EFI": "y",
    "CONFIG_IOMMU_DEFAULT_PASSTHROUGH": "n",
}

# Driver name → module (the kernel's sys/bus/pci/drivers/X/module link); "" = built in.
DRIVER_MODULES = {
    "xhci_hcd": "xhci_pci",
    "nvidia-gpu": "i2c_nvidia_gpu",
    "pcieport": "",
    "ahci": "ahci",
}

# A few real modules.alias lines (the kernel's and the NVIDIA driver's patterns) for
# the classes the sample hosts carry.
MODULES_ALIAS = """\
# Aliases extracted from modules themselves.
alias pci:v000010DEd*sv*sd*bc03sc00i00* nouveau
alias pci:v000012D2d*sv*sd*bc03sc*i* nouveau
alias pci:v000010DEd*sv*sd*bc03sc02i00* nouveau
alias pci:v000010DEd*sv*sd*bc03sc00i00* nvidia
alias pci:v000010DEd*sv*sd*bc03sc02i00* nvidia
alias pci:v000010DEd*sv*sd*bc06sc80i00* nvidia
alias pci:v000010DEd*sv*sd*bc04sc03i00* snd_hda_intel
alias pci:v00008086d00007AD0sv*sd*bc*sc*i* snd_hda_intel
alias pci:v00001002d*sv*sd*bc04sc03i00* snd_hda_intel
alias pci:v*d*sv*sd*bc0Csc03i30* xhci_pci
alias pci:v000010DEd*sv*sd*bc0Csc80i00* i2c_nvidia_gpu
alias pci:v00001002d00001638sv*sd*bc*sc*i* amdgpu
alias pci:v*d*sv*sd*bc01sc08i02* nvme
alias pci:v*d*sv*sd*bc01sc06i01* ahci
alias pci:v00001A03d00002000sv*sd*bc*sc*i* ast
alias pci:v000015B3d00001021sv*sd*bc*sc*i* mlx5_core
"""

CPU_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
    "sse sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology cpuid pni "
    "pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand"
)


@dataclass
class Node:
    address: PciAddress
    vendor: int
    device: int
    class_code: int
    subsystem: tuple[int, int] | None
    revision: int
    driver: str | None
    group: int | None
    numa: int
    boot_vga: bool | None
    reset: list[str]
    bars: dict[int, tuple[int, bool, bool, bool]]  # index → size, io, 64bit, prefetch
    name: str | None
    parent: Node | None
    children: list[Node] = field(default_factory=list)
    physfn: PciAddress | None = None
    sriov_totalvfs: int | None = None
    path: str = ""  # sys/devices/... relative to the root

    @property
    def is_bridge(self) -> bool:
        return (self.class_code >> 8) in (0x0604, 0x0609)


def _size(text: str, where: str) -> int:
    m = SIZE_RE.match(text)
    if m is None:
        raise BadDescription(where, f"bad size {text!r} (use e.g. 16M, 32G)")
    return int(m[1]) * UNITS[m[2]]


def _hex_pair(text: str, where: str) -> tuple[int, int]:
    try:
        a, b = str(text).split(":")
        return int(a, 16), int(b, 16)
    except ValueError:
        raise BadDescription(where, f"expected vvvv:dddd, got {text!r}") from None


def _parse_bars(spec: dict[Any, Any], where: str) -> dict[int, tuple[int, bool, bool, bool]]:
    bars: dict[int, tuple[int, bool, bool, bool]] = {}
    for key, value in spec.items():
        words = str(value).split()
        io = "io" in words
        is64 = "p64" in words or "m64" in words
        pref = "p64" in words
        sizes = [w for w in words if w not in ("io", "p64", "m64")]
        if len(sizes) != 1:
            raise BadDescription(where, f"BAR {key}: expected a size, got {value!r}")
        bars[int(key)] = (_size(sizes[0], where), io, is64, pref)
    return bars


class Description:
    """A parsed host description."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        if not isinstance(data, dict):
            raise BadDescription(source, "expected a mapping at the top level")
        self.source = source
        self.data = data
        self.name = str(data.get("name") or Path(source).stem)
        distro_key = str(data.get("distro", "debian-12"))
        if distro_key not in DISTROS:
            raise BadDescription(
                source, f"unknown distro {distro_key!r} (know: {', '.join(DISTROS)})"
            )
        self.distro = DISTROS[distro_key]
        cpu = data.get("cpu", {})
        self.cpu_vendor = {"intel": "GenuineIntel", "amd": "AuthenticAMD"}.get(
            str(cpu.get("vendor", "intel")), str(cpu.get("vendor"))
        )
        self.cpu_model = str(cpu.get("model", "Generic CPU"))
        self.cpus = int(cpu.get("cpus", 4))
        self.cpu_virt = bool(cpu.get("virt", True))
        # RAM, for /proc/meminfo: what guest memory and huge pages are checked against
        self.memory_gib = int(data.get("memory_gib", 64))
        # /proc/cpuinfo "address sizes": 46 bits is a typical Xeon, 48 an EPYC
        default_bits = 46 if self.cpu_vendor == "GenuineIntel" else 48
        self.phys_bits = int(cpu.get("phys_bits", default_bits))
        kernel = data.get("kernel", {})
        self.release = str(kernel.get("release", self.distro["release"]))
        self.cmdline = str(
            kernel.get(
                "cmdline",
                f"BOOT_IMAGE=/boot/vmlinuz-{self.release} root=UUID=8d1c1b0e-4a9f-4c35-9d2b-3f1e2a7c5b10 ro quiet",
            )
        )
        self.config = {
            **BASE_CONFIG,
            **self.distro["config"],
            **{str(k): str(v) for k, v in kernel.get("config", {}).items()},
        }
        self.vfio = str(kernel.get("vfio", "module"))
        boot = data.get("boot", {})
        self.uefi = bool(boot.get("uefi", True))
        self.bootloader = str(boot.get("bootloader", self.distro["bootloader"]))
        self.initramfs = str(boot.get("initramfs", self.distro["initramfs"]))
        iommu = data.get("iommu", {})
        self.iommu_enabled = bool(iommu.get("enabled", True))
        self.firmware_iommu = bool(iommu.get("firmware", True))
        self.intremap = bool(iommu.get("intremap", True))
        # VT-d MGAW: the widest guest address the IOMMU can map for DMA (48: 4-level tables)
        self.iommu_bits = int(iommu.get("address_bits", 48))
        self.kvm = bool(data.get("kvm", True))
        self.dmi = data.get("dmi", {})
        self.vendors = {int(str(k), 16): str(v) for k, v in data.get("vendors", {}).items()}
        self.root_disk = data.get("root_disk")
        self.nic = data.get("nic")
        self.numa_default = int(data.get("numa", -1))
        self.nodes: list[Node] = []
        self.top: list[Node] = []
        for item in data.get("pci", []):
            self.top.append(self._node(item, None, None))
        self._assign_groups()

    def _node(self, item: dict[str, Any], parent: Node | None, inherited_group: int | None) -> Node:
        where = f"{self.source}: pci {item.get('addr', '?')}"
        try:
            address = PciAddress.parse(str(item["addr"]))
        except KeyError:
            raise BadDescription(where, "every PCI entry needs addr") from None
        except PassthroughError as exc:
            raise BadDescription(where, str(exc)) from None
        vendor, device = _hex_pair(item.get("id", ""), where)
        cls = item.get("class", "0x000000")
        class_code = CLASS_ALIASES.get(str(cls))
        if class_code is None:
            try:
                class_code = int(str(cls), 16)
            except ValueError:
                raise BadDescription(where, f"unknown class {cls!r}") from None
        group = item.get("group", inherited_group)
        bridge = (class_code >> 8) in (0x0604, 0x0609)
        node = Node(
            address=address,
            vendor=vendor,
            device=device,
            class_code=class_code,
            subsystem=_hex_pair(item["sub"], where) if "sub" in item else None,
            revision=int(str(item.get("rev", "a1")), 16),
            driver=item.get("driver", "pcieport" if bridge else None),
            group=int(group) if group is not None else None,
            numa=int(item.get("numa", parent.numa if parent else self.numa_default)),
            boot_vga=item.get("boot_vga", False if class_code >> 8 == 0x0300 else None),
            reset=list(item.get("reset", ["bus"] if parent is not None and not bridge else [])),
            bars=_parse_bars(item.get("bars", {}), where),
            name=item.get("name"),
            parent=parent,
            physfn=PciAddress.parse(item["physfn"]) if "physfn" in item else None,
            sriov_totalvfs=item.get("sriov_totalvfs"),
        )
        node.path = (
            f"{parent.path}/{address}"
            if parent is not None
            else f"sys/devices/pci{address.domain:04x}:{address.bus:02x}/{address}"
        )
        if any(n.address == address for n in self.nodes):
            raise BadDescription(where, "duplicate address")
        self.nodes.append(node)
        child_group = node.group if item.get("group_children") else inherited_group
        for child in item.get("children", []):
            node.children.append(self._node(child, node, child_group))
        return node

    def _assign_groups(self) -> None:
        if not self.iommu_enabled:
            for n in self.nodes:
                n.group = None
            return
        used = {n.group for n in self.nodes if n.group is not None}
        by_slot: dict[tuple[int, int, int], int] = {}
        for n in self.nodes:
            if n.group is not None:
                by_slot.setdefault(n.address.slot, n.group)
        counter = 0
        for n in sorted(self.nodes, key=lambda n: n.address):
            if n.group is not None:
                continue
            if n.address.slot in by_slot:
                n.group = by_slot[n.address.slot]
                continue
            while counter in used:
                counter += 1
            n.group = counter
            used.add(counter)
            by_slot[n.address.slot] = counter


def load(name_or_path: str) -> Description:
    path = Path(name_or_path)
    if not path.exists():
        candidate = HOSTS_DIR / f"{name_or_path}.yaml"
        if not candidate.exists():
            known = ", ".join(sample_names())
            raise BadDescription(name_or_path, f"no such file or sample host (samples: {known})")
        path = candidate
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadDescription(str(path), f"not valid YAML{line}") from None
    return Description(data, str(path))


def sample_names() -> list[str]:
    return sorted(p.stem for p in HOSTS_DIR.glob("*.yaml"))


# -- writing a root ---------------------------------------------------------------------


class _Writer:
    def __init__(self, dest: Path) -> None:
        self.dest = dest

    def file(self, rel: str, content: str | bytes, mode: int = 0o644) -> None:
        p = self.dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.encode()
        p.write_bytes(content)
        p.chmod(mode)

    def dir(self, rel: str) -> None:
        (self.dest / rel).mkdir(parents=True, exist_ok=True)

    def link(self, rel: str, target_rel: str) -> None:
        """A relative symlink at ``rel`` pointing to ``target_rel`` (both root-relative)."""
        p = self.dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(target_rel, os.path.dirname(rel))
        if p.is_symlink() or p.exists():
            p.unlink()
        p.symlink_to(target)


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
    w = _Writer(out)
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

    _write_host_files(desc, w, by_addr)
    return out


def _vtd_cap(mgaw: int) -> int:
    """A VT-d capability register: a real client part's value with MGAW (bits 21:16, the
    width minus one) and SAGAW (bits 12:8: 39-bit 3-level, 48-bit 4-level, 57-bit 5-level
    tables) set for this width."""
    sagaw = 0x2 if mgaw <= 39 else 0x4 if mgaw <= 48 else 0x8
    base = 0xD2008C40660462 & ~(0x3F << 16) & ~(0x1F << 8)
    return base | ((mgaw - 1) << 16) | (sagaw << 8)


def _write_host_files(desc: Description, w: _Writer, by_addr: dict[PciAddress, Node]) -> None:
    # CPU
    virt = ("vmx" if desc.cpu_vendor == "GenuineIntel" else "svm") if desc.cpu_virt else ""
    blocks = []
    for i in range(desc.cpus):
        blocks.append(
            f"processor\t: {i}\nvendor_id\t: {desc.cpu_vendor}\nmodel name\t: {desc.cpu_model}\n"
            f"flags\t\t: {CPU_FLAGS} {virt}\n"
            f"address sizes\t: {desc.phys_bits} bits physical, 48 bits virtual\n"
        )
    w.file("proc/cpuinfo", "\n".join(blocks) + "\n")
    w.file("proc/cmdline", desc.cmdline + "\n")
    w.file("proc/meminfo", f"MemTotal:       {desc.memory_gib << 20} kB\n")
    nodes = sorted({n.numa for n in desc.nodes if n.numa >= 0}) or [0]
    per = max(1, desc.cpus // len(nodes))
    for i, node in enumerate(nodes):
        first = i * per
        w.file(f"sys/devices/system/node/node{node}/cpulist", f"{first}-{first + per - 1}\n")
    w.file("proc/sys/kernel/osrelease", desc.release + "\n")
    ir = desc.firmware_iommu and desc.intremap  # IR stays on even when DMA remapping is off
    prefix = "IR-" if ir else ""
    w.file(
        "proc/interrupts",
        "            CPU0       CPU1\n"
        f"   0:         44          0  {prefix}IO-APIC    2-edge      timer\n"
        f"   9:          0          0  {prefix}IO-APIC    9-fasteoi   acpi\n"
        f" 120:          0          0  {prefix}PCI-MSI-0000:00:00.0   0-edge      aerdrv\n",
    )
    if desc.kvm:
        w.file("dev/kvm", "")
    # Kernel config and modules
    config = "\n".join(
        f"# {k} is not set" if v == "n" else f"{k}={v}" for k, v in sorted(desc.config.items())
    )
    w.file(f"boot/config-{desc.release}", config + "\n")
    moddir = f"lib/modules/{desc.release}"
    dep = "kernel/drivers/vfio/vfio.ko:\nkernel/drivers/vfio/vfio_iommu_type1.ko: kernel/drivers/vfio/vfio.ko\n"
    if desc.vfio == "module":
        dep += "kernel/drivers/vfio/pci/vfio-pci.ko: kernel/drivers/vfio/pci/vfio-pci-core.ko kernel/drivers/vfio/vfio.ko\n"
    w.file(f"{moddir}/modules.dep", dep)
    w.file(f"{moddir}/modules.alias", MODULES_ALIAS)
    w.file(
        f"{moddir}/modules.builtin",
        "kernel/drivers/vfio/pci/vfio-pci.ko\n" if desc.vfio == "builtin" else "",
    )
    # IOMMU hardware
    intel = desc.cpu_vendor == "GenuineIntel"
    if desc.firmware_iommu:
        table = "DMAR" if intel else "IVRS"
        w.file(f"sys/firmware/acpi/tables/{table}", table.encode() + bytes(32), 0o400)
        if desc.iommu_enabled:
            unit = "dmar0" if intel else "ivhd0"
            w.link(f"sys/class/iommu/{unit}", f"sys/devices/virtual/iommu/{unit}")
            if intel:
                ecap = 0xF050DA | (0x8 if desc.intremap else 0)
                w.file(f"sys/devices/virtual/iommu/{unit}/intel-iommu/ecap", f"{ecap:x}\n")
                w.file(
                    f"sys/devices/virtual/iommu/{unit}/intel-iommu/cap",
                    f"{_vtd_cap(desc.iommu_bits):x}\n",
                )
            else:
                w.file(f"sys/devices/virtual/iommu/{unit}/amd-iommu/features", "25bf732fa2295afe\n")
    w.dir("sys/kernel/iommu_groups")
    # Firmware, DMI
    if desc.uefi:
        w.dir("sys/firmware/efi/efivars")
        if desc.bootloader == "systemd-boot":
            w.file(
                "sys/firmware/efi/efivars/LoaderInfo-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f",
                b"\x06\x00\x00\x00s\x00d\x00",
            )
    dmi = desc.dmi
    w.file("sys/class/dmi/id/chassis_type", f"{int(dmi.get('chassis_type', 3))}\n")
    w.file("sys/class/dmi/id/sys_vendor", f"{dmi.get('vendor', 'To Be Filled By O.E.M.')}\n")
    w.file("sys/class/dmi/id/product_name", f"{dmi.get('product', 'System Product Name')}\n")
    # Distro and boot tooling (markers: discovery only looks for their presence)
    osr = dict(desc.distro["os_release"])
    if desc.data.get("os_release"):
        osr.update({str(k): str(v) for k, v in desc.data["os_release"].items()})
    w.file("usr/lib/os-release", "".join(f'{k}="{v}"\n' for k, v in osr.items()))
    w.link("etc/os-release", "usr/lib/os-release")
    _boot_files(desc, w)
    # Names
    names: dict[tuple[int, int | None], str] = {}
    for vendor, vname in desc.vendors.items():
        names[(vendor, None)] = vname
    for n in desc.nodes:
        if n.name:
            known = names.get((n.vendor, n.device))
            if known is not None and known != n.name:
                raise BadDescription(
                    desc.source,
                    f"{n.address}: {n.vendor:04x}:{n.device:04x} named both {known!r} and {n.name!r}",
                )
            names[(n.vendor, n.device)] = n.name
            names.setdefault((n.vendor, None), f"Vendor {n.vendor:04x}")
    w.file("usr/share/misc/pci.ids", render_subset(names))
    _storage_and_net(desc, w, by_addr)


def _boot_args(desc: Description) -> tuple[list[str], list[str]]:
    """(root/ro arguments, the rest) of the running command line, as the bootloader holds them."""
    base: list[str] = []
    rest: list[str] = []
    for arg in desc.cmdline.split():
        if arg.startswith(("BOOT_IMAGE=", "initrd=")):
            continue
        (base if arg.startswith(("root=", "rootflags=")) or arg in ("ro", "rw") else rest).append(
            arg
        )
    return base, rest


def _boot_files(desc: Description, w: _Writer) -> None:
    bl, init = desc.bootloader, desc.initramfs
    exe = 0o755
    base, rest = _boot_args(desc)
    if bl in ("grub", "grubby", "proxmox-boot-tool") or desc.distro["bootloader"] == "grub":
        w.file(
            "etc/default/grub",
            "GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n"
            "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
            f'GRUB_CMDLINE_LINUX_DEFAULT="{" ".join(rest)}"\nGRUB_CMDLINE_LINUX=""\n',
        )
    if bl == "grub":
        w.file("usr/sbin/update-grub", "#!/bin/sh\n", exe)
        w.file("usr/sbin/grub-mkconfig", "#!/bin/sh\n", exe)
        w.file("boot/grub/grub.cfg", "# generated by grub-mkconfig\n")
    elif bl == "grubby":
        w.file("usr/sbin/grubby", "#!/bin/sh\n", exe)
        w.file(
            f"boot/loader/entries/3f1e2a7c5b104c358d1c1b0e4a9f4c35-{desc.release}.conf",
            f"title {desc.distro['os_release']['PRETTY_NAME']}\nversion {desc.release}\n"
            f"linux /vmlinuz-{desc.release}\ninitrd /initramfs-{desc.release}.img\n"
            f"options {' '.join(base + rest)}\n",
        )
    elif bl == "systemd-boot":
        w.file("usr/bin/bootctl", "#!/bin/sh\n", exe)
        w.file("usr/bin/kernel-install", "#!/bin/sh\n", exe)
        w.file("etc/kernel/cmdline", " ".join(base + rest) + "\n")
    elif bl == "proxmox-boot-tool":
        w.file("usr/sbin/proxmox-boot-tool", "#!/bin/sh\n", exe)
        w.file("usr/sbin/update-grub", "#!/bin/sh\n", exe)
        w.file("etc/kernel/proxmox-boot-uuids", "5B2C-1A7E\n")
        w.file("etc/kernel/cmdline", " ".join(base + rest) + "\n")
    elif bl == "kernelstub":
        w.file("usr/bin/kernelstub", "#!/bin/sh\n", exe)
        w.file(
            "etc/kernelstub/configuration",
            json.dumps({"user": {"kernel_options": rest}}, indent=2) + "\n",
        )
    elif bl == "rpm-ostree":
        w.file("usr/bin/rpm-ostree", "#!/bin/sh\n", exe)
        w.file("run/ostree-booted", "")
    if init == "initramfs-tools":
        w.file("usr/sbin/update-initramfs", "#!/bin/sh\n", exe)
        w.file(
            "etc/initramfs-tools/modules",
            "# List of modules that you want to include in your initramfs.\n",
        )
    elif init == "dracut":
        w.file("usr/bin/dracut", "#!/bin/sh\n", exe)
        w.dir("etc/dracut.conf.d")
    elif init == "mkinitcpio":
        w.file("usr/bin/mkinitcpio", "#!/bin/sh\n", exe)
        w.file(
            "etc/mkinitcpio.conf",
            "MODULES=()\nHOOKS=(base udev autodetect microcode modconf kms keyboard keymap consolefont block filesystems fsck)\n",
        )
    w.dir("etc/modprobe.d")


def _storage_and_net(desc: Description, w: _Writer, by_addr: dict[PciAddress, Node]) -> None:
    routes = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    mount_src, devnum = "/dev/sda2", "8:2"
    if desc.root_disk:
        spec = desc.root_disk
        ctrl = by_addr.get(PciAddress.parse(str(spec["pci"])))
        if ctrl is None:
            raise BadDescription(desc.source, f"root_disk: {spec['pci']} is not described")
        if spec.get("kind", "nvme") == "nvme":
            disk_path = f"{ctrl.path}/nvme/nvme0/nvme0n1"
            disk, part, major, base_minor = "nvme0n1", "nvme0n1p2", 259, 0
        else:
            disk_path = f"{ctrl.path}/ata1/host0/target0:0:0/0:0:0:0/block/sda"
            disk, part, major, base_minor = "sda", "sda2", 8, 0
        w.file(f"{disk_path}/dev", f"{major}:{base_minor}\n")
        w.file(f"{disk_path}/{part}/dev", f"{major}:{base_minor + 2}\n")
        w.file(f"{disk_path}/{part}/partition", "2\n")
        w.link(f"sys/class/block/{disk}", disk_path)
        w.link(f"sys/class/block/{part}", f"{disk_path}/{part}")
        w.link(f"sys/dev/block/{major}:{base_minor}", disk_path)
        w.link(f"sys/dev/block/{major}:{base_minor + 2}", f"{disk_path}/{part}")
        mount_src, devnum = f"/dev/{part}", f"{major}:{base_minor + 2}"
        if spec.get("lvm"):
            dm = "sys/devices/virtual/block/dm-0"
            w.file(f"{dm}/dev", "253:0\n")
            w.link(f"{dm}/slaves/{part}", f"{disk_path}/{part}")
            w.link("sys/class/block/dm-0", dm)
            w.link("sys/dev/block/253:0", dm)
            mount_src, devnum = "/dev/mapper/vg0-root", "253:0"
    w.file(
        "proc/self/mountinfo",
        f"26 1 {devnum} / / rw,relatime shared:1 - ext4 {mount_src} rw,errors=remount-ro\n"
        "22 26 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
        "23 26 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n",
    )
    if desc.nic:
        spec = desc.nic
        ctrl = by_addr.get(PciAddress.parse(str(spec["pci"])))
        if ctrl is None:
            raise BadDescription(desc.source, f"nic: {spec['pci']} is not described")
        iface = str(spec.get("iface", "eno1"))
        netdir = f"{ctrl.path}/net/{iface}"
        w.file(f"{netdir}/address", "3c:ec:ef:10:20:30\n")
        w.link(f"{netdir}/device", ctrl.path)
        w.link(f"sys/class/net/{iface}", netdir)
        route_if = iface
        if spec.get("bridge"):
            br = str(spec["bridge"])
            brdir = f"sys/devices/virtual/net/{br}"
            w.file(f"{brdir}/address", "3c:ec:ef:10:20:30\n")
            w.link(f"{brdir}/brif/{iface}", f"{netdir}/brport")
            w.dir(f"{netdir}/brport")
            w.link(f"sys/class/net/{br}", brdir)
            route_if = br
        routes += f"{route_if}\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        routes += f"{route_if}\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    w.file("proc/net/route", routes)


# -- umockdev ---------------------------------------------------------------------------


def umockdev_record(desc: Description, root: Path) -> str:
    """The PCI devices of a built root as a umockdev record (``umockdev-run -d``)."""
    by_addr = {n.address: n for n in desc.nodes}
    blocks = []

    def emit(n: Node) -> None:
        path = "/" + n.path
        lines = [f"P: {path[len('/sys') :]}"]
        env = {"SUBSYSTEM": "pci", **uevent(n)}
        vname = desc.vendors.get(n.vendor)
        if vname:
            env["ID_VENDOR_FROM_DATABASE"] = vname
        if n.name:
            env["ID_MODEL_FROM_DATABASE"] = n.name
        lines += [f"E: {k}={v}" for k, v in env.items()]
        for attr in (
            "vendor",
            "device",
            "class",
            "revision",
            "subsystem_vendor",
            "subsystem_device",
            "numa_node",
            "boot_vga",
            "reset_method",
            "resource",
            "sriov_totalvfs",
            "modalias",
        ):
            f = root / n.path / attr
            if f.exists():
                text = f.read_text()
                if "\n" in text.rstrip("\n"):
                    # Multi-line attributes are stored as binary (hex) in the record.
                    lines.append(f"H: {attr}={text.encode().hex()}")
                else:
                    lines.append(f"A: {attr}={text.rstrip(chr(10))}")
        for link in ("driver", "iommu_group", "physfn"):
            f = root / n.path / link
            if f.is_symlink():
                lines.append(f"L: {link}={os.readlink(f)}")
        blocks.append("\n".join(lines) + "\n")
        for child in n.children:
            emit(child)

    for n in desc.top:
        emit(n)
    del by_addr
    return "\n".join(blocks)
