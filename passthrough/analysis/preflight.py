"""Preflight for a scanned host: what would get in the way of binding its cards now."""

from __future__ import annotations

from passthrough.analysis.scan import Scan
from passthrough.host.holders import Holder, find_holders, holder_checks
from passthrough.host.root import HostRoot
from passthrough.model import CheckResult


def card_holders(scan: Scan) -> dict[str, list[Holder]]:
    """Holders of every function of every card in the scan, keyed by function address."""
    addresses = [str(f.address) for v in scan.verdicts for f in v.gpu.functions]
    return find_holders(HostRoot(scan.host.root), addresses)


def held_checks(scan: Scan) -> list[CheckResult]:
    return holder_checks(card_holders(scan))
