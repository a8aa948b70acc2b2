# SPDX-License-Identifier: Apache-2.0
"""What KubeVirt's ``permittedHostDevices`` can say of a vGPU, by mode.

mdev (on VFs or on the card): a ``mediatedDevices`` entry whose ``mdevNameSelector`` is the
type's name as the driver spells it, one resource per type. Vendor-VFIO VFs are PCI devices
that all carry the card's own vendor:device id, whatever vGPU type each holds: a
``pciHostDevices`` entry cannot tell one type from another, so it is one resource per card
model, published by NVIDIA's plugin (the VFs stay on the nvidia driver, which KubeVirt's own
plugin, wanting vfio-pci, does not publish)."""

from __future__ import annotations

import re
from typing import Any

from passthrough.vgpu.hostdev import NoSuchVgpu
from passthrough.vgpu.model import Mode, VgpuCard

PCI_LIMIT = (
    "vendor-VFIO vGPU VFs all carry the card's vendor:device id ({id}): pciHostDevices cannot "
    "tell their types apart, so {resource} is any VF of the card whatever its type (one "
    "resource per profile needs NVIDIA's device plugin to publish them by type)"
)


def _resource(name: str) -> str:
    return "nvidia.com/" + re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def vgpu_devices(
    cards: tuple[VgpuCard, ...], wanted: list[str], pci_ids: dict[str, str]
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, str]], list[str]]:
    """(permittedHostDevices entries by list name, the VM's ``gpus``, what they cannot say)
    for each ``wanted`` VF or mdev UUID. ``pci_ids``: card address → ``VVVV:DDDD``."""
    permitted: dict[str, list[dict[str, Any]]] = {}
    gpus: list[dict[str, str]] = []
    notes: list[str] = []
    for n, want in enumerate(wanted):
        card, name = _find(cards, want)
        if card.mode is Mode.VENDOR_VFIO:
            ident = pci_ids[str(card.address)]
            resource = _resource(card.name or ident)
            entry: dict[str, Any] = {
                "pciVendorSelector": ident,
                "resourceName": resource,
                "externalResourceProvider": True,
            }
            key = "pciHostDevices"
            note = PCI_LIMIT.format(id=ident, resource=resource)
            if note not in notes:
                notes.append(note)
        else:
            resource = _resource(name)
            entry = {"mdevNameSelector": name, "resourceName": resource}
            key = "mediatedDevices"
        if entry not in permitted.setdefault(key, []):
            permitted[key].append(entry)
        gpus.append({"name": f"vgpu{n}", "deviceName": resource})
    return permitted, gpus, notes


def _find(cards: tuple[VgpuCard, ...], want: str) -> tuple[VgpuCard, str]:
    for card in cards:
        for vf in card.vfs:
            for m in vf.mdevs:
                if want.lower() in (m.uuid, str(vf.address)) and m.type_name:
                    return card, m.type_name
            if str(vf.address) == want and card.mode is Mode.VENDOR_VFIO and vf.type_id:
                return card, vf.type_name or str(vf.type_id)
    raise NoSuchVgpu(
        f"--vgpu {want}: no vGPU there (a vendor-VFIO VF holding a type, or an mdev's UUID: "
        "see `passthrough vgpu list`)"
    )
