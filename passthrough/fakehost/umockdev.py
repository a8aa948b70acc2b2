# SPDX-License-Identifier: Apache-2.0
"""The PCI devices of a built root as a umockdev record (``umockdev-run -d``)."""

from __future__ import annotations

import os
from pathlib import Path

from passthrough.fakehost.description import Description, Node
from passthrough.fakehost.sysfs import uevent


def umockdev_record(desc: Description, root: Path) -> str:
    """The PCI devices of a built root as a umockdev record (``umockdev-run -d``)."""
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
    return "\n".join(blocks)
