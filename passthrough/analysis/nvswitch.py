# SPDX-License-Identifier: Apache-2.0
"""NVSwitch functions for a guest that owns the whole NVLink domain: the one answer for
plan, apply, render and kubevirt render.

An HGX board's NVLink fabric works in one of two ways: every GPU and every NVSwitch in one
guest, whose Fabric Manager runs the fabric (full passthrough), or the GPUs alone in guests
with Fabric Manager on the host (shared NVSwitch). ``--nvswitch all`` (or each switch's
address) asks for the first; anything in between has no working fabric and is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from passthrough.analysis.cards import default_cards
from passthrough.analysis.codes import NVSWITCH
from passthrough.errors import InvalidPciAddress, PassthroughError, quote
from passthrough.model import NVIDIA, Finding, Gpu, GpuVerdict, Host, PciFunction
from passthrough.pciaddr import PciAddress
from passthrough.pciclass import SUBCLASS_OTHER_BRIDGE

METAVAR = "all|ADDRESS"
ALL = "all"
SHARED_MODE = (
    "the other choice is shared-NVSwitch mode: the GPUs alone, Fabric Manager on the host "
    "(leave out --nvswitch)"
)


class NvswitchRefused(PassthroughError):
    """An NVSwitch selection that names no switch or leaves the NVLink domain split (exit 2,
    nothing written)."""


def nvswitches(host: Host) -> list[PciFunction]:
    """The host's NVSwitch functions (NVIDIA, PCI class 0x0680)."""
    return [
        f for f in host.functions if f.vendor_id == NVIDIA and f.subclass == SUBCLASS_OTHER_BRIDGE
    ]


def _pick(switches: list[PciFunction], token: str) -> list[PciFunction]:
    if token.lower() == ALL:
        return switches
    try:
        wanted = PciAddress.parse(token)
    except InvalidPciAddress:
        raise NvswitchRefused(
            f"--nvswitch {quote(token)}: neither 'all' nor a PCI address (0000:da:00.0)"
        ) from None
    found = [f for f in switches if f.address == wanted]
    if not found:
        raise NvswitchRefused(
            f"--nvswitch {token}: matches no NVSwitch on this host (see `passthrough scan`)"
        )
    return found


def split_cards(
    host: Host, gpus: Sequence[str], switches: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The addresses among ``gpus`` that are NVSwitches moved to ``switches``: a plan after
    an apply that bound them keeps them as cards (the record lists every card it bound)."""
    own = {f.address for f in nvswitches(host)}
    cards: list[str] = []
    named = list(switches)
    for token in gpus:
        try:
            is_switch = PciAddress.parse(token) in own
        except InvalidPciAddress:
            is_switch = False
        (named if is_switch else cards).append(token)
    return cards, named


def with_nvswitches(
    host: Host,
    verdicts: Sequence[GpuVerdict],
    chosen: list[GpuVerdict],
    requested: Iterable[str],
) -> list[GpuVerdict]:
    """``chosen`` and, where asked for, every NVSwitch as a card of its own (its one
    function). Refused: a switch that is not there, some switches only, or switches
    without every NVIDIA GPU of the host."""
    tokens = list(requested)
    if not tokens:
        return chosen
    switches = nvswitches(host)
    if not switches:
        raise NvswitchRefused("--nvswitch: this host has no NVSwitch")
    picked: list[PciFunction] = []
    for token in tokens:
        picked += [f for f in _pick(switches, token) if f not in picked]
    left = [f for f in switches if f not in picked]
    if left:
        raise NvswitchRefused(
            f"--nvswitch: {len(picked)} of {len(switches)} NVSwitches ("
            + ", ".join(str(f.address) for f in left)
            + " left out): full-passthrough NVLink needs every NVSwitch in the guest; "
            + SHARED_MODE
        )
    gpus = [v.gpu.address for v in chosen]
    missing = [v for v in default_cards(verdicts, "nvidia") if v.gpu.primary.physfn is None]
    missing = [v for v in missing if v.gpu.address not in gpus]
    if missing:
        raise NvswitchRefused(
            f"--nvswitch: the guest lacks {len(missing)} GPU(s) of the NVLink domain ("
            + ", ".join(str(v.gpu.address) for v in missing)
            + "): full-passthrough NVLink needs every GPU with the NVSwitches; "
            + SHARED_MODE
        )
    groups = host.group_index
    extra = [
        GpuVerdict(
            gpu=Gpu(primary=f, functions=(f,)),
            group_members=tuple(groups[f.iommu_group].members) if f.iommu_group in groups else (),
            findings=(),
        )
        for f in sorted(picked, key=lambda f: f.address)
    ]
    return chosen + extra


def told(findings: Iterable[Finding], chosen: Sequence[GpuVerdict]) -> list[Finding]:
    """``findings`` less the NVSwitch warning where the guest owns the whole domain (the
    choice it asks for is made)."""
    whole = any(v.gpu.primary.subclass == SUBCLASS_OTHER_BRIDGE for v in chosen)
    return [f for f in findings if not (whole and f.code == NVSWITCH)]
