# SPDX-License-Identifier: Apache-2.0
"""Which libvirt, QEMU and OVMF a host has, from what discovery read (``host/packages.py``:
the root's dpkg database, and on the live host the tools themselves); where neither says,
Debian 12's versions stand in, marked so. Here, beside discovery, so that ``check`` can
say what they support without loading the guest code (``passthrough.vm``)."""

from __future__ import annotations

import re
from typing import Any

from passthrough.host.packages import PACKAGES
from passthrough.records import frozen


def dotted(v: tuple[int, int]) -> str:
    """(9, 0) → ``9.0``; (2022, 11) → ``2022.11``."""
    return f"{v[0]}.{v[1]:02d}" if v[0] > 1000 else f"{v[0]}.{v[1]}"


@frozen
class Versions:
    libvirt: tuple[int, int]
    qemu: tuple[int, int]
    ovmf: tuple[int, int]
    source: str = "given"
    # the names (libvirt, qemu, ovmf) whose version was not found: a default stands in
    assumed: tuple[str, ...] = ()

    def is_assumed(self, name: str) -> bool:
        return name in self.assumed

    def as_json(self) -> dict[str, Any]:
        return {
            "libvirt": dotted(self.libvirt),
            "qemu": dotted(self.qemu),
            "ovmf": dotted(self.ovmf),
            "source": self.source,
            "assumed": bool(self.assumed),
        }


# Debian 12, what this project's CI runs: the default when the host root does not say
# (worded so that an Ubuntu or Fedora root does not read as if it were taken for Debian)
ASSUMED = "not found on this root (Debian 12's versions stand in)"
DEFAULT_VERSIONS = Versions((9, 0), (7, 2), (2022, 11), ASSUMED, ("libvirt", "qemu", "ovmf"))


def _two(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"(?:\d+:)?(\d+)\.(\d+)", text or "")
    return (int(m[1]), int(m[2])) if m else None


def versions_of(packages: dict[str, str], tools: dict[str, str]) -> Versions:
    """libvirt, QEMU and OVMF from the installed packages discovery read, then what the
    tools said (live host, or a snapshot of one); what neither says comes from
    :data:`DEFAULT_VERSIONS`."""
    found: dict[str, tuple[int, int]] = {}
    for what, names in PACKAGES.items():
        v = next((v for v in (_two(packages.get(n)) for n in names) if v is not None), None)
        if v is not None:
            found[what] = v
    source = "dpkg status" if found else ""
    said = False
    for what, text in tools.items():
        v = _two(text)
        if what not in found and v is not None:
            found[what] = v
            said = True
    if said:
        source = f"{source} + tools" if source else "virsh/qemu --version"
    missing = [k for k in ("libvirt", "qemu", "ovmf") if k not in found]
    if missing:
        source = (source + "; " if source else "") + f"{ASSUMED}: " + ", ".join(missing)
    return Versions(
        libvirt=found.get("libvirt", DEFAULT_VERSIONS.libvirt),
        qemu=found.get("qemu", DEFAULT_VERSIONS.qemu),
        ovmf=found.get("ovmf", DEFAULT_VERSIONS.ovmf),
        source=source,
        assumed=tuple(missing),
    )


# iommufd in QEMU: the ``-object iommufd`` backend and vfio-pci's ``iommufd=`` property
# (QEMU 9.0); in libvirt: a hostdev's ``<driver iommufd='yes'/>`` (libvirt 12.1). See
# docs/iommufd.md for the sources.
IOMMUFD_QEMU = (9, 0)
IOMMUFD_LIBVIRT = (12, 1)


def iommufd_lacks(v: Versions) -> list[str]:
    """What of QEMU and libvirt is too old for iommufd, one phrase each ([] when neither)."""
    lacks = []
    for name, have, need in (
        ("QEMU", v.qemu, IOMMUFD_QEMU),
        ("libvirt", v.libvirt, IOMMUFD_LIBVIRT),
    ):
        if have < need:
            assumed = " (assumed: not found on this root)" if v.is_assumed(name.lower()) else ""
            lacks.append(f"{name} {dotted(have)}{assumed} predates iommufd ({dotted(need)}+)")
    return lacks
