# SPDX-License-Identifier: Apache-2.0
"""Which vfio driver a function gets: the running kernel's ``modules.alias`` decides.

A vfio variant driver declares the devices it serves with ``vfio_pci:`` aliases
(``alias vfio_pci:v000010DEd00002342sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci``); the device's own
``modalias`` (``pci:v…d…sv…sd…bc…sc…i…``) with its ``pci:`` prefix read as ``vfio_pci:`` is
matched against those globs, the most specific match wins (most literal characters), and
with no match the function gets plain vfio-pci. A variant driver never claims a device by
ID tables at boot: it is bound through ``driver_override``.
"""

from __future__ import annotations

import fnmatch

from passthrough.host.root import HostRoot
from passthrough.model import PciFunction
from passthrough.records import frozen

PLAIN = "vfio-pci"
_PREFIX = "vfio_pci:"


@frozen(slots=True)
class VfioAlias:
    """A modules.alias line that hands matching devices to a vfio driver."""

    pattern: str  # the glob after ``vfio_pci:``
    module: str

    @property
    def weight(self) -> int:
        return sum(1 for c in self.pattern if c not in "*?[]")


def is_vfio(driver: str | None) -> bool:
    """vfio-pci or one of its variant drivers (every one upstream is named ``*_vfio_pci``:
    nvgrace_gpu_vfio_pci, mlx5_vfio_pci, hisi_acc_vfio_pci, ...)."""
    return bool(driver) and (driver == PLAIN or str(driver).replace("-", "_").endswith("_vfio_pci"))


def vfio_aliases(root: HostRoot, release: str | None) -> list[VfioAlias]:
    """The ``alias vfio_pci:…`` lines of ``lib/modules/<release>/modules.alias``."""
    if not release:
        return []
    text = root.read(f"lib/modules/{release}/modules.alias") or ""
    found: list[VfioAlias] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "alias" and parts[1].startswith(_PREFIX):
            found.append(VfioAlias(parts[1][len(_PREFIX) :], parts[2]))
    return found


def choose(modalias: str | None, aliases: list[VfioAlias]) -> str:
    """The module for a device's ``modalias``; :data:`PLAIN` when no variant claims it."""
    if not modalias or not modalias.startswith("pci:"):
        return PLAIN
    device = modalias[len("pci:") :]
    # fnmatchcase: modalias globs are case-sensitive, as the kernel's own matching is
    matches = [a for a in aliases if fnmatch.fnmatchcase(device, a.pattern)]
    if not matches:
        return PLAIN
    best = max(matches, key=lambda a: (a.weight, a.module))
    # vfio-pci's own module (a catch-all alias, where a kernel has one) is plain vfio-pci
    return PLAIN if best.module == "vfio_pci" else best.module


def vfio_drivers(
    root: HostRoot, release: str | None, functions: list[PciFunction]
) -> dict[str, str]:
    """The vfio driver for each function (by address), from the modalias discovery read."""
    aliases = vfio_aliases(root, release)
    return {str(f.address): choose(f.modalias, aliases) for f in functions}


def variant_notes(drivers: dict[str, str]) -> list[str]:
    return [
        f"{addr}: the running kernel's modules.alias gives it the vfio variant driver {mod}, "
        f"bound through driver_override (driver_override={mod}), not vfio-pci's ID table"
        for addr, mod in sorted(drivers.items())
        if mod != PLAIN
    ]
