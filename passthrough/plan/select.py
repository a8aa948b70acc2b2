# SPDX-License-Identifier: Apache-2.0
"""Which cards go to vfio-pci, and the refusals that protect the host."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field

from passthrough.analysis import codes, policy
from passthrough.analysis.cards import choose_cards
from passthrough.analysis.nvswitch import split_cards, told, with_nvswitches
from passthrough.model import (
    Finding,
    GpuVerdict,
    Host,
    PciAddress,
    PciFunction,
)
from passthrough.records import frozen


class SelectionRefused(policy.Refused):
    """Nothing is written: the selection would harm the host or cannot work."""


@frozen
class Selection:
    """The cards chosen for vfio-pci, every function that goes with them, and their IDs."""

    cards: list[GpuVerdict]
    functions: list[PciFunction]  # every function that goes to vfio-pci (cards + group extras)
    vfio_ids: list[str]
    ids_ambiguous: bool  # some kept device shares an ID: bind per device instead
    boot_gpu: bool
    notes: list[str]
    findings: list[Finding] = field(default_factory=list)  # the policy's, warnings included


def select(
    host: Host,
    verdicts: list[GpuVerdict],
    gpus: list[str],
    include_group: bool = False,
    allow_boot_gpu: bool = False,
    nvswitches: Sequence[str] = (),
) -> Selection:
    # the NVSwitches (--nvswitch) go with every GPU as cards of their own, or are refused
    gpus, switches = split_cards(host, gpus, nvswitches)
    chosen = with_nvswitches(host, verdicts, choose_cards(verdicts, gpus), switches)
    taken: dict[PciAddress, PciFunction] = {}
    for v in chosen:
        for f in v.gpu.functions:
            taken[f.address] = f
    notes: list[str] = []
    if include_group:
        # The whole group goes over: the same policy then judges every added function.
        by_addr = {f.address: f for f in host.functions}
        for v in chosen:
            for addr in v.group_members:
                member = by_addr.get(addr)
                if member is None or member.is_bridge_like or addr in taken:
                    continue
                taken[addr] = member
                notes.append(
                    f"{addr} ({member.name}) goes to vfio-pci with the group of {v.gpu.address} "
                    "(--include-group)"
                )
    # the one verdict render and validate give: the policy on the exact selection and the
    # warnings scan gives each card it touches (ACS override, Optimus, NVSwitch...)
    findings = told(policy.verdict_findings(host, taken, allow_boot_gpu), chosen)
    # The plan turns the IOMMU on: groups are told after the reboot, not a refusal here.
    # (--include-group is no override here: it widens the selection, which is judged again.)
    overrides = {codes.PLAN, codes.ALLOW_BOOT_GPU} if allow_boot_gpu else {codes.PLAN}
    refusals = codes.refusals(findings, overrides)
    if refusals:
        hint = (
            "; select every GPU of the group (--gpu), or --include-group hands the whole group "
            "over knowingly"
            if codes.lifted_by(refusals) == {codes.INCLUDE_GROUP}
            else ""
        )
        raise SelectionRefused(refusals, hint)
    if any(f.code == policy.NO_IOMMU for f in findings):
        notes += [
            f"{v.gpu.address}: IOMMU groups are unknown until the IOMMU is on; run "
            "`passthrough scan` after the reboot"
            for v in chosen
        ]
    selected = sorted(taken.values(), key=lambda f: f.address)
    ids: list[str] = []
    for f in selected:
        if f.id not in ids:
            ids.append(f.id)
    kept = [f for f in host.functions if f.address not in taken and f.id in ids]
    if kept:
        notes.append(
            "the host keeps "
            + ", ".join(f"{f.address} ({f.id})" for f in kept)
            + " with the same IDs: binding per device (driver_override) instead of vfio-pci.ids"
        )
    return Selection(
        cards=chosen,
        functions=selected,
        vfio_ids=ids,
        ids_ambiguous=bool(kept),
        # any boot VGA handed over, a card's or one taken with its group: the console moves off
        boot_gpu=any(f.is_display and f.boot_vga for f in selected),
        notes=notes,
        findings=findings,
    )
