# SPDX-License-Identifier: Apache-2.0
"""Loading a host description: the YAML checked against its schema, then parsed into nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from passthrough.errors import BadDescription, PassthroughError
from passthrough.fakehost.distros import BASE_CONFIG, BOOTLOADERS, DISTROS, INITRAMFS
from passthrough.fakehost.schema import NONE, Anything, Keys, ListOf, MapOf, OneOf, check
from passthrough.model import PciAddress
from passthrough.pciclass import (
    SUBCLASS_3D,
    SUBCLASS_AUDIO_HDA,
    SUBCLASS_CRYPTO_OTHER,
    SUBCLASS_DISPLAY_OTHER,
    SUBCLASS_ETHERNET,
    SUBCLASS_HOST_BRIDGE,
    SUBCLASS_INFINIBAND,
    SUBCLASS_ISA_BRIDGE,
    SUBCLASS_NETWORK_OTHER,
    SUBCLASS_NVME,
    SUBCLASS_OTHER_BRIDGE,
    SUBCLASS_PCI_BRIDGE,
    SUBCLASS_RAID,
    SUBCLASS_SATA,
    SUBCLASS_SERIAL_OTHER,
    SUBCLASS_SIGNAL_OTHER,
    SUBCLASS_SMBUS,
    SUBCLASS_SYSTEM_OTHER,
    SUBCLASS_USB,
    SUBCLASS_VGA,
    is_pci_bridge,
)
from passthrough.units import parse_size

HOSTS_DIR = Path(__file__).with_name("hosts")

# Class words a description may use; the low byte is the programming interface
# (xHCI 0x30, AHCI 0x01, NVMe 0x02).
CLASS_ALIASES = {
    "host-bridge": SUBCLASS_HOST_BRIDGE << 8,
    "isa-bridge": SUBCLASS_ISA_BRIDGE << 8,
    "bridge": SUBCLASS_PCI_BRIDGE << 8,
    "other-bridge": SUBCLASS_OTHER_BRIDGE << 8,
    "vga": SUBCLASS_VGA << 8,
    "3d": SUBCLASS_3D << 8,
    "display": SUBCLASS_DISPLAY_OTHER << 8,
    "audio": SUBCLASS_AUDIO_HDA << 8,
    "usb": SUBCLASS_USB << 8 | 0x30,
    "ucsi": SUBCLASS_SERIAL_OTHER << 8,
    "smbus": SUBCLASS_SMBUS << 8,
    "sata": SUBCLASS_SATA << 8 | 0x01,
    "nvme": SUBCLASS_NVME << 8 | 0x02,
    "raid": SUBCLASS_RAID << 8,
    "ethernet": SUBCLASS_ETHERNET << 8,
    "infiniband": SUBCLASS_INFINIBAND << 8,
    "wifi": SUBCLASS_NETWORK_OTHER << 8,
    "signal": SUBCLASS_SIGNAL_OTHER << 8,
    "system": SUBCLASS_SYSTEM_OTHER << 8,
    "encryption": SUBCLASS_CRYPTO_OTHER << 8,
}

STR, INT, BOOL = (str,), (int,), (bool,)
PCI_ITEM = Keys(
    {
        "addr": STR,
        "id": STR,  # vvvv:dddd
        "class": STR,  # a word of CLASS_ALIASES or 24-bit hex
        "sub": STR,  # subsystem vvvv:dddd
        "rev": STR,  # hex
        "name": STR,
        "driver": (str, NONE),
        "group": INT,
        "group_children": BOOL,  # children share this entry's group
        "numa": INT,
        "boot_vga": (bool, NONE),
        "reset": ListOf(STR),
        "bars": MapOf((int, str), STR),  # BAR number → "16M", "64G p64", "256 io"
        "physfn": STR,
        "sriov_totalvfs": INT,
    },
    required=("addr", "id"),
)
PCI_ITEM.fields["children"] = ListOf(PCI_ITEM)

SCHEMA = Keys(
    {
        "name": STR,
        "description": STR,
        "anchors": Anything("YAML anchors reused by the pci entries"),
        "distro": STR,
        "cpu": Keys({"vendor": STR, "model": STR, "cpus": INT, "virt": BOOL, "phys_bits": INT}),
        "memory_gib": INT,
        "kernel": Keys(
            {
                "release": STR,
                "cmdline": STR,
                "config": MapOf(STR, STR),
                "vfio": OneOf(("module", "builtin", "none")),
            }
        ),
        "boot": Keys(
            {"uefi": BOOL, "bootloader": OneOf(BOOTLOADERS), "initramfs": OneOf(INITRAMFS)}
        ),
        "iommu": Keys({"enabled": BOOL, "firmware": BOOL, "intremap": BOOL, "address_bits": INT}),
        "kvm": BOOL,
        # iommufd's nodes: /dev/iommu, sys/module/iommufd, and for each vfio-pci function
        # its vfio-dev/vfioN in sysfs and /dev/vfio/devices/vfioN (CONFIG_* go in kernel.config)
        "iommufd": Keys({"dev_iommu": BOOL, "module": BOOL, "vfio_dev": BOOL, "dev_nodes": BOOL}),
        "dmi": Keys({"chassis_type": INT, "vendor": STR, "product": STR}),
        "vendors": MapOf(STR, STR),  # hex vendor id → name, for pci.ids
        "os_release": MapOf(STR, STR),  # over the distro's
        "root_disk": Keys(
            {"pci": STR, "kind": OneOf(("nvme", "sata")), "lvm": BOOL}, required=("pci",)
        ),
        "nic": Keys({"pci": STR, "iface": STR, "bridge": STR}, required=("pci",)),
        "numa": INT,
        # installed Debian packages (name → version) for var/lib/dpkg/status
        "packages": MapOf(STR, STR),
        "pci": ListOf(PCI_ITEM),
    }
)

DEFAULT_CMDLINE = "root=UUID=8d1c1b0e-4a9f-4c35-9d2b-3f1e2a7c5b10 ro quiet"


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
        return is_pci_bridge(self.class_code)


def _hex_pair(text: str, where: str) -> tuple[int, int]:
    try:
        a, b = text.split(":")
        return int(a, 16), int(b, 16)
    except ValueError:
        raise BadDescription(where, f"expected vvvv:dddd, got {text!r}") from None


def _parse_bars(spec: dict[Any, str], where: str) -> dict[int, tuple[int, bool, bool, bool]]:
    bars: dict[int, tuple[int, bool, bool, bool]] = {}
    for key, value in spec.items():
        if str(key) not in ("0", "1", "2", "3", "4", "5"):
            raise BadDescription(where, f"BAR {key!r}: a BAR number is 0 to 5")
        words = value.split()
        io = "io" in words
        is64 = "p64" in words or "m64" in words
        pref = "p64" in words
        sizes = [w for w in words if w not in ("io", "p64", "m64")]
        size = parse_size(sizes[0]) if len(sizes) == 1 else None
        if size is None:
            raise BadDescription(where, f"BAR {key}: expected a size such as 16M, got {value!r}")
        bars[int(key)] = (size, io, is64, pref)
    return bars


def _class_code(cls: str, where: str) -> int:
    code = CLASS_ALIASES.get(cls)
    if code is None:
        try:
            code = int(cls, 16)
        except ValueError:
            raise BadDescription(where, f"unknown class {cls!r}") from None
    return code


class Description:
    """A parsed host description."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        check(data, SCHEMA, source)
        self.source = source
        self.data = data
        self.name = str(data.get("name") or Path(source).stem)
        distro_key = data.get("distro", "debian-12")
        if distro_key not in DISTROS:
            raise BadDescription(
                source, f"unknown distro {distro_key!r} (know: {', '.join(DISTROS)})"
            )
        self.distro = DISTROS[distro_key]
        self._cpu(data.get("cpu", {}))
        # RAM, for /proc/meminfo: what guest memory and huge pages are checked against
        self.memory_gib: int = data.get("memory_gib", 64)
        self._kernel(data.get("kernel", {}))
        boot = data.get("boot", {})
        self.uefi: bool = boot.get("uefi", True)
        self.bootloader: str = boot.get("bootloader", self.distro.bootloader)
        self.initramfs: str = boot.get("initramfs", self.distro.initramfs)
        iommu = data.get("iommu", {})
        self.iommu_enabled: bool = iommu.get("enabled", True)
        self.firmware_iommu: bool = iommu.get("firmware", True)
        self.intremap: bool = iommu.get("intremap", True)
        # VT-d MGAW: the widest guest address the IOMMU can map for DMA (48: 4-level tables)
        self.iommu_bits: int = iommu.get("address_bits", 48)
        self.kvm: bool = data.get("kvm", True)
        iommufd = data.get("iommufd", {})
        self.dev_iommu: bool = iommufd.get("dev_iommu", False)
        self.iommufd_module: bool = iommufd.get("module", self.dev_iommu)
        self.vfio_dev: bool = iommufd.get("vfio_dev", False)
        self.vfio_dev_nodes: bool = iommufd.get("dev_nodes", self.vfio_dev)
        self.dmi: dict[str, Any] = data.get("dmi", {})
        self.vendors = {int(k, 16): v for k, v in data.get("vendors", {}).items()}
        self.os_release: dict[str, str] = {**self.distro.os_release, **data.get("os_release", {})}
        self.root_disk: dict[str, Any] | None = data.get("root_disk")
        self.nic: dict[str, Any] | None = data.get("nic")
        self.numa_default: int = data.get("numa", -1)
        self.packages: dict[str, str] = data.get("packages", {})
        self.nodes: list[Node] = []
        self.top: list[Node] = []
        for item in data.get("pci", []):
            self.top.append(self._node(item, None, None))
        self._assign_groups()

    def _cpu(self, cpu: dict[str, Any]) -> None:
        vendor = cpu.get("vendor", "intel")
        self.cpu_vendor = {"intel": "GenuineIntel", "amd": "AuthenticAMD"}.get(vendor, vendor)
        self.cpu_model: str = cpu.get("model", "Generic CPU")
        self.cpus: int = cpu.get("cpus", 4)
        self.cpu_virt: bool = cpu.get("virt", True)
        # /proc/cpuinfo "address sizes": 46 bits is a typical Xeon, 48 an EPYC
        default_bits = 46 if self.cpu_vendor == "GenuineIntel" else 48
        self.phys_bits: int = cpu.get("phys_bits", default_bits)

    def _kernel(self, kernel: dict[str, Any]) -> None:
        self.release: str = kernel.get("release", self.distro.release)
        default = f"BOOT_IMAGE=/boot/vmlinuz-{self.release} {DEFAULT_CMDLINE}"
        self.cmdline: str = kernel.get("cmdline", default)
        self.config = {**BASE_CONFIG, **self.distro.config, **kernel.get("config", {})}
        self.vfio: str = kernel.get("vfio", "module")

    def _node(self, item: dict[str, Any], parent: Node | None, inherited_group: int | None) -> Node:
        where = f"{self.source}: pci {item['addr']}"
        try:
            address = PciAddress.parse(item["addr"])
            physfn = PciAddress.parse(item["physfn"]) if "physfn" in item else None
        except PassthroughError as exc:
            raise BadDescription(where, str(exc)) from None
        vendor, device = _hex_pair(item["id"], where)
        class_code = _class_code(item.get("class", "0x000000"), where)
        group = item.get("group", inherited_group)
        bridge = is_pci_bridge(class_code)
        is_vga = class_code >> 8 == SUBCLASS_VGA
        node = Node(
            address=address,
            vendor=vendor,
            device=device,
            class_code=class_code,
            subsystem=_hex_pair(item["sub"], where) if "sub" in item else None,
            revision=int(item.get("rev", "a1"), 16),
            driver=item.get("driver", "pcieport" if bridge else None),
            group=group,
            numa=item.get("numa", parent.numa if parent else self.numa_default),
            boot_vga=item.get("boot_vga", False if is_vga else None),
            reset=list(item.get("reset", ["bus"] if parent is not None and not bridge else [])),
            bars=_parse_bars(item.get("bars", {}), where),
            name=item.get("name"),
            parent=parent,
            physfn=physfn,
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
    """A description file, or a bundled sample by name. A file of that name wins; a
    directory of that name does not hide the sample (``sample build NAME NAME`` makes one)."""
    path = Path(name_or_path)
    if not path.is_file():
        sample = HOSTS_DIR / f"{name_or_path}.yaml"
        if "/" not in name_or_path and sample.is_file():
            path = sample
        elif path.exists():
            raise BadDescription(
                name_or_path, "not a file (give a YAML description or a sample's name)"
            )
        else:
            known = ", ".join(sample_names())
            raise BadDescription(name_or_path, f"no such file or sample host (samples: {known})")
    from passthrough.inputs import Unreadable, read_text, yaml_without_aliases

    try:
        # the bundled samples share PCI entries through aliases: bounded, not refused
        loader = yaml_without_aliases("a host description", max_nodes=200_000)
        data = yaml.load(read_text(str(path), "a host description"), Loader=loader)
    except Unreadable as exc:
        raise BadDescription(str(path), str(exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadDescription(str(path), f"not valid YAML{line}") from None
    return Description(data, str(path))


def sample_names() -> list[str]:
    return sorted(p.stem for p in HOSTS_DIR.glob("*.yaml"))
