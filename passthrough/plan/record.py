# SPDX-License-Identifier: Apache-2.0
"""What ``plan`` reads from a root beyond discovery, recorded while a snapshot is taken
(``passthrough snapshot`` hands this to :func:`passthrough.host.snapshot.capture`), so that
``plan --root`` on the snapshot gives the plan it gives on the root it came from."""

from __future__ import annotations

from passthrough.analysis.viability import find_gpus
from passthrough.errors import PassthroughError
from passthrough.host.root import HostRoot
from passthrough.model import Host
from passthrough.plan.build import PlanOptions, make_plan


def record_plan(recorder: HostRoot, host: Host) -> None:
    """Also what ``plan`` reads beyond discovery (the bootloader's and initramfs tool's
    files, modprobe.d, the kernel's module lists, what was applied before), so that
    ``plan --root`` on the snapshot gives the plan it gives on the host: the default
    selection and each card alone (with its group) are planned, nothing is written."""
    tries = [PlanOptions()] + [
        PlanOptions(gpus=(str(g.address),), include_group=True, allow_boot_gpu=True)
        for g in find_gpus(host)
    ]
    for opts in tries:
        try:
            make_plan(recorder, host, opts)
        except PassthroughError:
            continue  # a refused selection reads what it read; the others go on
