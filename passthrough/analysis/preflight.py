# SPDX-License-Identifier: Apache-2.0
"""Preflight for a scanned host: what would get in the way of binding its cards now."""

from __future__ import annotations

from passthrough.analysis.reset import reset_checks
from passthrough.analysis.scan import Scan
from passthrough.host.holders import Holder, find_holders, holder_checks
from passthrough.host.modalias import variant_notes, vfio_drivers
from passthrough.host.root import HostRoot
from passthrough.model import CheckResult, Host, PciFunction


def card_holders(scan: Scan) -> dict[str, list[Holder]]:
    """Holders of every function of every card in the scan, keyed by function address."""
    addresses = [str(f.address) for v in scan.verdicts for f in v.gpu.functions]
    return find_holders(HostRoot(scan.host.root), addresses)


def held_checks(scan: Scan) -> list[CheckResult]:
    """The preflight checks of ``check``: held cards and reset risk."""
    return holder_checks(card_holders(scan)) + reset_checks(scan.host, scan.verdicts)


def preflight_notes(
    root: HostRoot, host: Host, functions: list[PciFunction], notes: list[str]
) -> dict[str, str]:
    """What a plan says before anything changes: who holds its cards now (a boot-time
    binding does not wait on them) and which vfio driver each function gets. Appends the
    notes; returns the driver of each function."""
    addresses = [str(f.address) for f in functions]
    for addr, holders in sorted(find_holders(root, addresses).items()):
        notes.append(
            f"{addr}: held open now ({'; '.join(h.describe() for h in holders)}): the binding "
            "at boot is not held up by it, but `passthrough bind` would refuse until they let go"
        )
    drivers = vfio_drivers(root, host.kernel.release, functions)
    notes.extend(variant_notes(drivers))
    return drivers
