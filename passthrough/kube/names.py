# SPDX-License-Identifier: Apache-2.0
"""Resource names as the device plugins that publish them spell them.

NVIDIA's kubevirt-gpu-device-plugin (also what the GPU Operator runs for sandbox
workloads) registers every NVIDIA function bound to vfio-pci, one resource per PCI device
ID, named ``nvidia.com/`` + the device's pci.ids name made upper case, ``/`` and ``.`` to
``_``, whitespace runs to ``_``, anything else outside ``[A-Za-z0-9_]`` dropped; with no
pci.ids name, the bare device ID. KubeVirt's own plugin takes whatever name the KubeVirt CR
gives, so the same name serves both providers.
"""

from __future__ import annotations

import re

from passthrough.model import PciFunction

PREFIX = "nvidia.com/"
_SPACES = re.compile(r"\s+")
_OTHER = re.compile(r"[^A-Za-z0-9_]+")


def plugin_name(device_name: str | None, device_id: int) -> str:
    """The part after ``nvidia.com/``: ``GH100 [H100 SXM5 80GB]`` → ``GH100_H100_SXM5_80GB``."""
    if not device_name or not device_name.strip():
        return f"{device_id:04x}"
    text = device_name.strip().upper().replace("/", "_").replace(".", "_")
    return _OTHER.sub("", _SPACES.sub("_", text))


def resource_name(fn: PciFunction) -> str:
    return PREFIX + plugin_name(fn.device_name, fn.device_id)


def vendor_selector(fn: PciFunction) -> str:
    """KubeVirt's ``pciVendorSelector``: ``10DE:2330``."""
    return f"{fn.vendor_id:04X}:{fn.device_id:04X}"
