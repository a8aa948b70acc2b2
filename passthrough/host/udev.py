# SPDX-License-Identifier: Apache-2.0
"""PCI functions through pyudev on a live host (or under umockdev-run).

udev gives the enumeration, the properties its rules computed (PCI_ID, PCI_CLASS,
DRIVER, names from the hwdb) and sysfs attributes. Links other than ``driver`` are not
exposed by libudev as attribute values, so ``iommu_group`` and ``physfn`` are read with
readlink on the device's sysfs path — which umockdev redirects like any other access.
"""

from __future__ import annotations

import os
from typing import Any

from passthrough.errors import PassthroughError
from passthrough.host.pci import build_function, with_names
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


class _UdevFacts:
    """One pyudev device: the properties udev's rules computed, its sysfs attributes."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.props = device.properties

    def event(self, key: str) -> str | None:
        value: str | None = self.props.get(key)
        return value

    def attr(self, name: str) -> str | None:
        return _attr(self.device, name)

    def link(self, name: str) -> str | None:
        return _link_name(f"{self.device.sys_path}/{name}")

    def where(self, name: str) -> str:
        return f"{self.device.sys_path}/{name}"


def _function(device: Any) -> PciFunction | None:
    name = device.sys_name
    if not PciAddress.looks_like(name):
        return None
    parents: list[PciAddress] = []
    parent = device.parent
    while parent is not None and parent.subsystem == "pci":
        if PciAddress.looks_like(parent.sys_name):
            parents.append(PciAddress.parse(parent.sys_name))
        parent = parent.parent
    props = device.properties
    return build_function(
        PciAddress.parse(name),
        _UdevFacts(device),
        driver=device.driver,
        parents=tuple(reversed(parents)),
        sysfs_path=device.sys_path.lstrip("/"),
        # the hwdb's names, where udev's rules looked them up
        names=lambda _v, _d: (
            props.get("ID_VENDOR_FROM_DATABASE"),
            props.get("ID_MODEL_FROM_DATABASE"),
        ),
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
