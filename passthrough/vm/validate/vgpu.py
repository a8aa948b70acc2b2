# SPDX-License-Identifier: Apache-2.0
"""The host layer on vGPU VFs: a VF in NVIDIA's vendor-VFIO mode stays on the nvidia driver
(its vGPU lives there), so its hostdev is ``managed='no'`` with no ``<driver name='vfio'/>``:
libvirt must not unbind it or bind it to vfio-pci."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from lxml.etree import _Element as Element

    from passthrough.model import Host
    from passthrough.pciaddr import PciAddress as Address

    Add = Callable[[str, Element | None, str, tuple[Address, ...]], None]


def vgpu_findings(host: Host, devs: Iterable[tuple[Element, Address | None]], add: Add) -> None:
    # the VFs NVIDIA's vGPU manager serves (discovery's vgpu_vf), found once for every hostdev
    vgpu_vfs = {f.address for f in host.functions if f.vgpu_vf}
    for element, address in devs:
        if address is None or address not in vgpu_vfs:
            continue
        wrong = []
        if element.get("managed") in ("yes", "on"):
            wrong.append("managed='yes'")
        driver = element.find("driver")
        if driver is not None and driver.get("name") == "vfio":
            wrong.append("<driver name='vfio'/>")
        if wrong:
            add(
                "host-vgpu-vf-rebound",
                element,
                f"{address} is a vGPU VF (vendor VFIO: it stays on the nvidia driver), given "
                f"{' and '.join(wrong)}: libvirt would unbind it and the vGPU with it; write "
                "managed='no' and no <driver name='vfio'/>",
                (address,),
            )
