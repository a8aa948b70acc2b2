# SPDX-License-Identifier: Apache-2.0
"""What discovery tells of a card's vGPU side: its mode, its VFs or mdev parents, its types."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from passthrough.model import PciAddress
from passthrough.records import frozen


class Mode(StrEnum):
    VENDOR_VFIO = "vendor-vfio"  # (a) SR-IOV VFs with nvidia/current_vgpu_type (kernel 6.8+)
    MDEV_VF = "mdev-vf"  # (b) mdev_supported_types under each VF
    MDEV_PF = "mdev-pf"  # (c) mdev_supported_types under the card itself (Turing, Volta)
    NONE = "none"


@frozen(slots=True)
class VgpuType:
    id: int  # card-local: the decimal id current_vgpu_type takes, or N of mdev type nvidia-N
    name: str  # as the driver spells it: "NVIDIA L40S-12Q"
    available: int | None = None  # mdev: available_instances; None: not told
    description: str = ""  # mdev: num_heads=..., framebuffer=...

    @property
    def short(self) -> str:
        return short_name(self.name)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name}
        if self.available is not None:
            out["available"] = self.available
        if self.description:
            out["description"] = self.description
        return out


def short_name(name: str) -> str:
    """``NVIDIA L40S-12Q`` → ``L40S-12Q``: how people name a type."""
    return name.removeprefix("NVIDIA ").strip()


_SIZE = re.compile(r"-(\d+)[A-Z]+$")


def framebuffer_gb(name: str) -> int | None:
    """The framebuffer a type's name gives, in GB: ``L40S-12Q`` → 12, ``DC-1-24Q`` → 24;
    None where the name does not end in one."""
    m = _SIZE.search(name.strip())
    return int(m.group(1)) if m else None


@frozen(slots=True)
class Mdev:
    uuid: str
    type_id: int
    type_name: str | None
    guest: str | None = None  # the running libvirt domain using it


@frozen(slots=True)
class Vf:
    """A virtual function (vendor VFIO or mdev parent), or the card itself in mode (c)."""

    address: PciAddress
    driver: str | None
    type_id: int = 0  # vendor VFIO: current_vgpu_type; 0: no vGPU on it
    type_name: str | None = None  # from its own catalog or its siblings'
    catalog: tuple[VgpuType, ...] = ()  # what can still be created on it
    mdevs: tuple[Mdev, ...] = ()
    guest: str | None = None  # the running libvirt domain using it

    @property
    def free(self) -> bool:
        return self.type_id == 0 and not self.mdevs

    def to_json(self) -> dict[str, Any]:
        return {
            "address": str(self.address),
            "driver": self.driver,
            "type_id": self.type_id,
            "type_name": self.type_name,
            "free": self.free,
            "guest": self.guest,
            "creatable": [t.to_json() for t in self.catalog],
            "mdevs": [
                {"uuid": m.uuid, "type_id": m.type_id, "type_name": m.type_name, "guest": m.guest}
                for m in self.mdevs
            ],
        }


@frozen(slots=True)
class VgpuCard:
    address: PciAddress
    name: str | None
    driver: str | None
    mode: Mode
    why: str  # how the mode was told, or why there is none
    vfs: tuple[Vf, ...] = ()  # mode (c): the card itself, as its own mdev parent
    total_vfs: int | None = None
    heterogeneous: bool | None = None  # None: not readable from sysfs
    sriov_manage: str | None = None  # the host's sriov-manage, inside the root
    nvidia_smi: str | None = None  # the host's nvidia-smi (sets heterogeneous mode), not in JSON

    def types(self) -> tuple[VgpuType, ...]:
        """Every type any VF still offers or holds, by id (names from the siblings)."""
        seen: dict[int, VgpuType] = {}
        for vf in self.vfs:
            for t in vf.catalog:
                seen.setdefault(t.id, t)
        return tuple(sorted(seen.values(), key=lambda t: t.id))

    def guests(self) -> list[str]:
        names = {vf.guest for vf in self.vfs if vf.guest}
        names |= {m.guest for vf in self.vfs for m in vf.mdevs if m.guest}
        return sorted(names)

    def to_json(self) -> dict[str, Any]:
        return {
            "address": str(self.address),
            "name": self.name,
            "driver": self.driver,
            "mode": self.mode.value,
            "why": self.why,
            "total_vfs": self.total_vfs,
            "heterogeneous": self.heterogeneous,
            "sriov_manage": self.sriov_manage,
            "vfs": [vf.to_json() for vf in self.vfs],
            "free_vfs": sum(1 for vf in self.vfs if vf.free),
            "guests": self.guests(),
        }
