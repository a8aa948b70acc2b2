# SPDX-License-Identifier: Apache-2.0
"""The hostdev a vGPU needs in a libvirt domain.

Vendor VFIO: the VF as a PCI hostdev with ``managed='no'`` and no ``<driver name='vfio'/>``
(the VF stays on the nvidia driver, which created its vGPU: libvirt must not rebind it).
mdev (on a VF or on the card): ``type='mdev' model='vfio-pci'`` naming the mdev's UUID.
"""

from __future__ import annotations

from passthrough.errors import InvalidPciAddress, PassthroughError
from passthrough.model import PciAddress
from passthrough.vgpu.model import Mode, VgpuCard


class NoSuchVgpu(PassthroughError):
    pass


def pci_hostdev(vf: PciAddress) -> str:
    return (
        "    <hostdev mode='subsystem' type='pci' managed='no'>\n"
        "      <source>\n"
        f"        <address domain='0x{vf.domain:04x}' bus='0x{vf.bus:02x}' "
        f"slot='0x{vf.device:02x}' function='0x{vf.function:x}'/>\n"
        "      </source>\n"
        "    </hostdev>\n"
    )


def mdev_hostdev(uuid: str) -> str:
    return (
        "    <hostdev mode='subsystem' type='mdev' model='vfio-pci'>\n"
        "      <source>\n"
        f"        <address uuid='{uuid}'/>\n"
        "      </source>\n"
        "    </hostdev>\n"
    )


def hostdev_for(cards: tuple[VgpuCard, ...], wanted: str) -> str:
    """``wanted``: a vendor-VFIO VF's address (it must hold a vGPU type), or an mdev's UUID,
    or a VF holding exactly one mdev."""
    for card in cards:
        for vf in card.vfs:
            for m in vf.mdevs:
                if m.uuid == wanted.lower():
                    return mdev_hostdev(m.uuid)
    try:
        address = PciAddress.parse(wanted)
    except (ValueError, InvalidPciAddress):
        raise NoSuchVgpu(
            f"--vgpu {wanted!r}: neither a VF address nor an mdev's UUID on this host"
        ) from None
    for card in cards:
        for vf in card.vfs:
            if vf.address != address:
                continue
            if card.mode is Mode.VENDOR_VFIO:
                if not vf.type_id:
                    raise NoSuchVgpu(
                        f"--vgpu {address}: no vGPU type on it yet (`passthrough vgpu apply` first)"
                    )
                return pci_hostdev(address)
            if len(vf.mdevs) == 1:
                return mdev_hostdev(vf.mdevs[0].uuid)
            raise NoSuchVgpu(f"--vgpu {address}: {len(vf.mdevs)} mdevs on it; name one by its UUID")
    raise NoSuchVgpu(
        f"--vgpu {wanted}: not a VF of a vGPU card on this host (see `passthrough vgpu list`)"
    )


def add_hostdevs(xml: str, hostdevs: list[str]) -> str:
    """The hostdevs put at the end of ``<devices>`` (libvirt gives each its guest address)."""
    end = xml.rindex("  </devices>")
    return xml[:end] + "".join(hostdevs) + xml[end:]
