# SPDX-License-Identifier: Apache-2.0
"""Each NVIDIA card's vGPU side, read from sysfs under a root (never written).

The mode is told from what sysfs shows, not from the GPU's generation: ``nvidia/
creatable_vgpu_types`` on the VFs (vendor VFIO), ``mdev_supported_types`` on the VFs
(mdev on VFs) or on the card itself (mdev on the PF). The catalog's format as the driver
writes it: a header line (``ID    : vGPU Name``), then one ``<id> : <name>`` row a type.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from passthrough.errors import InvalidPciAddress, echo
from passthrough.host.root import HostRoot
from passthrough.model import Host, PciAddress, PciFunction
from passthrough.pciclass import CLASS_DISPLAY
from passthrough.vgpu.model import Mdev, Mode, Vf, VgpuCard, VgpuType, framebuffer_gb

NVIDIA = 0x10DE
SRIOV_MANAGE = "usr/lib/nvidia/sriov-manage"
NVIDIA_SMI = "usr/bin/nvidia-smi"
CATALOG = "nvidia/creatable_vgpu_types"
CURRENT = "nvidia/current_vgpu_type"
MDEV_TYPES = "mdev_supported_types"
RUNNING = "run/libvirt/qemu"  # libvirt's status XML of each running domain
_ROW = re.compile(r"\s*(\d+)\s*:\s*(\S.*?)\s*")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def parent_dir(root: HostRoot, vf: str) -> str:
    """Where a VF's (or mode-c card's) mdev types and mdevs are."""
    d = f"sys/bus/pci/devices/{vf}"
    return d if root.isdir(f"{d}/{MDEV_TYPES}") else f"sys/class/mdev_bus/{vf}"


def parse_catalog(text: str, where: str, problems: list[str] | None = None) -> list[VgpuType]:
    """The rows of a ``creatable_vgpu_types`` file; the header and blank lines skipped, any
    other line that is not a row noted in ``problems``."""
    out: list[VgpuType] = []
    for n, line in enumerate(text.splitlines(), 1):
        m = _ROW.fullmatch(line)
        if m:
            out.append(VgpuType(int(m.group(1)), m.group(2)))
        elif problems is not None and line.strip() and not _header(n, line):
            problems.append(f"{where}: line {n} is not '<id> : <name>': {echo(line[:60])}")
    return out


def _header(n: int, line: str) -> bool:
    return n == 1 and line.split(":")[0].strip().upper() == "ID"


def _mdev_types(root: HostRoot, parent: str) -> list[VgpuType]:
    out = []
    for name in sorted(root.listdir(parent)):
        if not name.startswith("nvidia-") or not name[7:].isdigit():
            continue
        d = f"{parent}/{name}"
        available = root.read_int(f"{d}/available_instances")
        out.append(
            VgpuType(
                int(name[7:]),
                (root.read(f"{d}/name") or name).strip(),
                available=available,
                description=(root.read(f"{d}/description") or "").strip(),
            )
        )
    return out


def _mdevs(
    root: HostRoot, device_dir: str, names: dict[int, str], used: dict[str, str]
) -> tuple[Mdev, ...]:
    out = []
    for entry in sorted(root.listdir(device_dir)):
        if not _UUID.fullmatch(entry):
            continue
        kind = root.link_name(f"{device_dir}/{entry}/mdev_type") or ""
        tid = int(kind[7:]) if kind.startswith("nvidia-") and kind[7:].isdigit() else 0
        out.append(Mdev(entry, tid, names.get(tid), used.get(entry)))
    return tuple(out)


def running_guests(root: HostRoot) -> dict[str, str]:
    """PCI addresses and mdev UUIDs → the running libvirt domain that holds them."""
    used: dict[str, str] = {}
    for name in root.listdir(RUNNING):
        if not name.endswith(".xml"):
            continue
        text = root.read(f"{RUNNING}/{name}")
        try:
            tree = ET.fromstring(text or "")
        except ET.ParseError:
            continue
        domain = tree if tree.tag == "domain" else tree.find("domain")
        if domain is None:
            continue
        guest = domain.findtext("name") or name[:-4]
        for hd in domain.iter("hostdev"):
            src = hd.find("source")
            if src is None:
                continue
            a = src.find("address")
            if a is not None and a.get("uuid"):
                used[a.get("uuid", "")] = guest
            elif a is not None and a.get("bus"):
                try:
                    addr = PciAddress.from_libvirt(a.attrib)
                except InvalidPciAddress:
                    continue
                used[str(addr)] = guest
    return used


def _vf(
    root: HostRoot, f: PciFunction, used: dict[str, str], problems: list[str]
) -> tuple[Vf, str]:
    """One VF (or mode-c card) and what it shows: "vendor", "mdev" or ""."""
    d = f.sysfs_path
    if root.isfile(f"{d}/{CATALOG}") or root.isfile(f"{d}/{CURRENT}"):
        catalog = parse_catalog(
            root.read(f"{d}/{CATALOG}") or "", root.abs(f"{d}/{CATALOG}"), problems
        )
        current = root.read_int(f"{d}/{CURRENT}") or 0
        vf = Vf(f.address, f.driver, current, None, tuple(catalog), guest=used.get(str(f.address)))
        return vf, "vendor"
    parent = d if root.isdir(f"{d}/{MDEV_TYPES}") else f"sys/class/mdev_bus/{f.address}"
    if root.isdir(f"{parent}/{MDEV_TYPES}"):
        types = _mdev_types(root, f"{parent}/{MDEV_TYPES}")
        mdevs = _mdevs(root, parent, {t.id: t.name for t in types}, used)
        return Vf(f.address, f.driver, 0, None, tuple(types), mdevs), "mdev"
    return Vf(f.address, f.driver, guest=used.get(str(f.address))), ""


def _named(vfs: list[Vf]) -> tuple[Vf, ...]:
    """A configured VF's own catalog may be empty: its type's name from its siblings'."""
    names = {t.id: t.name for vf in vfs for t in vf.catalog}
    out = []
    for vf in vfs:
        if vf.type_id and vf.type_name is None:
            vf = Vf(
                vf.address,
                vf.driver,
                vf.type_id,
                names.get(vf.type_id),
                vf.catalog,
                vf.mdevs,
                vf.guest,
            )
        out.append(vf)
    return tuple(out)


def _card(
    root: HostRoot,
    pf: PciFunction,
    vfs: list[PciFunction],
    used: dict[str, str],
    problems: list[str],
) -> VgpuCard:
    seen = [_vf(root, f, used, problems) for f in vfs]
    kinds = {kind for _, kind in seen}
    parts: tuple[Mode, str, tuple[Vf, ...]]
    if "vendor" in kinds:
        what = "nvidia/creatable_vgpu_types (vendor VFIO)"
        parts = (Mode.VENDOR_VFIO, f"{len(vfs)} VFs with {what}", _named([v for v, _ in seen]))
    elif "mdev" in kinds:
        what = "mdev_supported_types (mdev on VFs)"
        parts = (Mode.MDEV_VF, f"{len(vfs)} VFs with {what}", tuple(v for v, k in seen if k))
    else:
        own, kind = _vf(root, pf, used, problems)
        if kind == "mdev":
            parts = (Mode.MDEV_PF, "the card has mdev_supported_types (mdev on the PF)", (own,))
        else:
            parts = (Mode.NONE, _why_none(root, pf, vfs), ())
    return VgpuCard(
        address=pf.address,
        name=pf.device_name,
        driver=pf.driver,
        mode=parts[0],
        why=parts[1],
        vfs=parts[2],
        total_vfs=pf.sriov_totalvfs,
        sriov_manage=SRIOV_MANAGE if root.isfile(SRIOV_MANAGE) else None,
        nvidia_smi=NVIDIA_SMI if root.isfile(NVIDIA_SMI) else None,
        heterogeneous=_mixed(parts[2]),
    )


def _mixed(vfs: tuple[Vf, ...]) -> bool | None:
    """Heterogeneous mode is not in sysfs; VFs holding types of two framebuffer sizes show
    it is on (True). Otherwise unknown (None): one size is either mode."""
    sizes = {framebuffer_gb(vf.type_name) for vf in vfs if vf.type_id and vf.type_name}
    return True if len(sizes - {None}) > 1 else None


def _why_none(root: HostRoot, pf: PciFunction, vfs: list[PciFunction]) -> str:
    if pf.driver != "nvidia":
        return (
            f"the card is on {pf.driver or 'no driver'}, not nvidia: vGPU needs NVIDIA's vGPU host "
            "driver (licensed, from the NVIDIA licensing portal)"
        )
    if pf.sriov_totalvfs and not vfs:
        how = (
            f"`/{SRIOV_MANAGE} -e {pf.address}`"
            if root.isfile(SRIOV_MANAGE)
            else "sriov-manage (not found: is this the vGPU host driver?)"
        )
        return f"SR-IOV capable ({pf.sriov_totalvfs} VFs) but no VF is enabled: {how}"
    if vfs:
        return f"{len(vfs)} VFs but none shows vGPU types: the driver is not the vGPU host driver"
    return (
        "no SR-IOV VFs and no mdev types: not the vGPU host driver (a datacenter driver, or the "
        "open kernel module without vGPU), SR-IOV off in firmware, or a card without vGPU"
    )


def read_vgpu(root: HostRoot, host: Host) -> tuple[VgpuCard, ...]:
    """Every NVIDIA display-class card that is not itself a VF, with its vGPU side."""
    used = running_guests(root)
    problems: list[str] = []
    cards = []
    for f in host.functions:
        if f.vendor_id != NVIDIA or f.base_class != CLASS_DISPLAY or f.physfn is not None:
            continue
        vfs = [v for v in host.functions if v.physfn == f.address]
        cards.append(_card(root, f, vfs, used, problems))
    root.problems.extend(problems)
    return tuple(cards)
