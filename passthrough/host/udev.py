"""PCI functions through pyudev on a live host (or under umockdev-run).

udev gives the enumeration, the properties its rules computed (PCI_ID, PCI_CLASS,
DRIVER, names from the hwdb) and sysfs attributes. Links other than ``driver`` are not
exposed by libudev as attribute values, so ``iommu_group`` and ``physfn`` are read with
readlink on the device's sysfs path — which umockdev redirects like any other access.
"""

from __future__ import annotations

import os
from typing import Any

from passthrough.errors import MalformedHostData, PassthroughError
from passthrough.host.pci import hex_field, hex_pair, parse_resource, with_names
from passthrough.host.pciids import find_pci_ids, lookup
from passthrough.host.root import HostRoot
from passthrough.model import PciAddress, PciFunction


class UdevUnavailable(PassthroughError):
    def __init__(self, why: str) -> None:
        super().__init__(f"udev: {why}")


def _attr(device: Any, name: str) -> str | None:
    try:
        value: bytes = device.attributes.get(name)
    except (KeyError, OSError, UnicodeDecodeError):
        return None
    if value is None:
        return None
    return value.decode("utf-8", "replace").strip()


def _link_name(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(path).rstrip("/"))
    except OSError:
        return None


def _function(device: Any) -> PciFunction | None:
    props = device.properties
    name = device.sys_name
    if not PciAddress.looks_like(name):
        return None
    where = device.sys_path
    ids: tuple[int | None, int | None] | None = hex_pair(props.get("PCI_ID"), where)
    if ids is None:
        ids = (hex_field(_attr(device, "vendor"), where), hex_field(_attr(device, "device"), where))
    vendor, dev_id = ids
    cls = hex_field(props.get("PCI_CLASS"), where)
    if cls is None:
        cls = hex_field(_attr(device, "class"), where)
    if vendor is None or dev_id is None or cls is None:
        raise MalformedHostData(where, "udev reports no vendor, device or class")
    subsys = hex_pair(props.get("PCI_SUBSYS_ID"), where)
    sv, sd = subsys if subsys is not None else (None, None)
    parents: list[PciAddress] = []
    parent = device.parent
    while parent is not None and parent.subsystem == "pci":
        if PciAddress.looks_like(parent.sys_name):
            parents.append(PciAddress.parse(parent.sys_name))
        parent = parent.parent
    numa_text = _attr(device, "numa_node")
    try:
        numa = int(numa_text) if numa_text not in (None, "") else None
    except ValueError:
        raise MalformedHostData(
            f"{where}/numa_node", f"expected a number, got {numa_text!r}"
        ) from None
    boot_vga = _attr(device, "boot_vga")
    reset = _attr(device, "reset_method")
    resource = _attr(device, "resource")
    group = _link_name(f"{device.sys_path}/iommu_group")
    physfn = _link_name(f"{device.sys_path}/physfn")
    totalvfs = _attr(device, "sriov_totalvfs")
    return PciFunction(
        address=PciAddress.parse(name),
        vendor_id=vendor,
        device_id=dev_id,
        subsystem_vendor_id=sv
        if sv is not None
        else hex_field(_attr(device, "subsystem_vendor"), where),
        subsystem_device_id=sd
        if sd is not None
        else hex_field(_attr(device, "subsystem_device"), where),
        class_code=cls,
        driver=device.driver,
        iommu_group=int(group) if group is not None and group.isdigit() else None,
        numa_node=numa if numa is not None and numa >= 0 else None,
        boot_vga=None if boot_vga in (None, "") else boot_vga == "1",
        reset_methods=tuple(reset.split()) if reset is not None else None,
        bars=parse_resource(resource, f"{where}/resource") if resource else (),
        parents=tuple(reversed(parents)),
        physfn=PciAddress.parse(physfn) if physfn and PciAddress.looks_like(physfn) else None,
        sriov_totalvfs=int(totalvfs) if totalvfs and totalvfs.isdigit() else None,
        modalias=props.get("MODALIAS") or _attr(device, "modalias"),
        sysfs_path=device.sys_path.lstrip("/"),
        vendor_name=props.get("ID_VENDOR_FROM_DATABASE"),
        device_name=props.get("ID_MODEL_FROM_DATABASE"),
    )


def udev_pci_source(root: HostRoot) -> list[PciFunction]:
    """PCI functions as udev sees them; names the hwdb lacks come from the root's pci.ids."""
    try:
        import pyudev
    except ImportError as exc:  # pragma: no cover - pyudev is a dependency
        raise UdevUnavailable(f"pyudev cannot be imported ({exc})") from None
    try:
        context = pyudev.Context()
        devices = list(context.list_devices(subsystem="pci"))
    except Exception as exc:
        raise UdevUnavailable(f"cannot enumerate PCI devices ({exc})") from None
    functions = [f for f in (_function(d) for d in devices) if f is not None]
    functions.sort(key=lambda f: f.address)
    if any(f.vendor_name is None or f.device_name is None for f in functions):
        rel = find_pci_ids(root)
        data = root.read_bytes(rel) if rel else None
        if data is not None:
            functions = with_names(
                functions, lookup(data, {(f.vendor_id, f.device_id) for f in functions})
            )
    return functions
