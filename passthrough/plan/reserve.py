# SPDX-License-Identifier: Apache-2.0
"""Kernel arguments that reserve memory at boot, written only where the root's RAM is known.

The only such argument passthrough writes is ``hugepages=N`` with ``hugepagesz=1G``
(``--hugepages-1g``): N GiB taken from the machine before anything else runs. Against a
root that reports its RAM (/proc/meminfo), plan/build.check_hugepages refuses a count the
host cannot give. A root that reports none (an image's tree) cannot be checked, and a
host that reserves more than it has does not boot: apply refuses there, naming the figure,
unless ``--force`` says the machine that boots it has the room. (``mem=`` and
``crashkernel=`` are never written by passthrough; an admin's stay as they are.)
"""

from __future__ import annotations

from passthrough.errors import PassthroughError
from passthrough.host.facts import read_memory_mib
from passthrough.host.root import HostRoot


class UnsizedReservation(PassthroughError):
    """Huge pages asked for on a root that reports no RAM, without --force (exit 2)."""


FORCE = "--force writes it anyway"


def refuse_unsized(
    root: HostRoot, hugepages_1g: int | None, force: bool, hint: str = FORCE
) -> str | None:
    """Refuse (exit 2) writing ``hugepages_1g`` pages of 1 GiB where ``root`` reports no
    RAM, unless ``force``; returns the warning to print when forced (None: nothing to say).
    Pages kept from an earlier apply (``hugepages_1g`` None) are not asked about again.
    ``hint``: how the caller's user writes it anyway (the fleet's differs from the CLI's)."""
    if not hugepages_1g or hugepages_1g <= 0 or read_memory_mib(root) is not None:
        return None
    figure = f"{hugepages_1g} x 1 GiB huge pages ({hugepages_1g << 10} MiB reserved at boot)"
    if not force:
        raise UnsizedReservation(
            f"hugepages: {figure} cannot be checked against the RAM: this root has no "
            f"/proc/meminfo, and a machine with less does not boot; nothing was written ({hint})"
        )
    return f"{figure} written with --force: this root reports no RAM to check them against"
