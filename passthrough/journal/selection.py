# SPDX-License-Identifier: Apache-2.0
"""Which cards a new plan takes on a host an earlier ``apply`` prepared: one rule for the
CLI and the Ansible module. The earlier cards are kept unless released by name, so a
second ``plan --gpu X`` adds X and never silently drops what is bound (the selection is
explicit); releasing every card is ``undo``, said so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from passthrough.errors import PassthroughError, quote
from passthrough.host.root import HostRoot
from passthrough.journal.applied import last_applied
from passthrough.model import PciAddress
from passthrough.plan.build import PlanOptions
from passthrough.plan.options import OPTIONS

Via = Literal["cli", "module"]


def _name(field: str, via: Via) -> str:
    """How the user spelled an option: its flag, or the module's option name."""
    opt = next(o for o in OPTIONS if o.name == field)
    return opt.flag if via == "cli" else opt.module_name


def plan_options(root: HostRoot, values: Mapping[str, Any], via: Via = "cli") -> PlanOptions:
    """:class:`PlanOptions` from the table's values (:func:`passthrough.plan.options.values`)
    with the earlier apply's cards kept or released, and the plan's notes saying which."""
    gpus: tuple[str, ...] = tuple(values["gpus"])
    record = last_applied(root)
    earlier = [c.address for c in record.cards] if record else []
    release = [str(PciAddress.parse(a)) for a in values["release"]]
    for addr in release:
        if addr not in earlier:
            raise PassthroughError(
                f"{_name('release', via)} {quote(addr)}: not a card an earlier apply bound "
                f"({', '.join(earlier) or 'none'})"
            )
    notes: tuple[str, ...] = ()
    if values["iommu_only"]:
        if gpus or release or earlier:
            raise PassthroughError(
                f"{_name('iommu_only', via)} plans no card: "
                + (
                    "cards are bound here already (plan them, or `passthrough undo`)"
                    if earlier
                    else f"leave out {_name('gpus', via)} and {_name('release', via)}"
                )
            )
    elif earlier:
        kept = [a for a in earlier if a not in release]
        if not kept and not gpus:
            raise PassthroughError(
                f"{_name('release', via)} gives back every card an earlier apply bound: "
                "that is `passthrough undo`"
            )
        flag = _name("release", via)
        notes = tuple(
            f"{a}: kept from the earlier apply ({flag} {a} gives it back to the host)" for a in kept
        ) + tuple(f"{a}: released, goes back to the host after the reboot" for a in release)
        gpus = (*gpus, *kept)
    # 1 GiB huge pages: the same rule as the cards (kept unless told, and said so)
    pages: int | None = values["hugepages_1g"]
    reserved = _reserved_pages(record.kernel_args.set if record else {})
    if pages is None:
        pages = reserved
        if reserved:
            notes += (
                f"hugepages={reserved} (1 GiB pages): kept from the earlier apply "
                f"({_name('hugepages_1g', via)} 0 gives them back to the host)",
            )
    return PlanOptions(
        gpus=gpus,
        nvswitches=tuple(values["nvswitches"]),
        include_group=values["include_group"],
        allow_boot_gpu=values["allow_boot_gpu"],
        iommu_pt=values["iommu_pt"],
        hugepages_1g=pages,
        release_hugepages=bool(reserved) and pages == 0,
        iommu_only=values["iommu_only"],
        notes=notes,
    )


def _reserved_pages(kernel_args: Mapping[str, str]) -> int:
    """The 1 GiB pages an applied plan reserved (0: none)."""
    if kernel_args.get("hugepagesz") != "hugepagesz=1G":
        return 0
    count = kernel_args.get("hugepages", "").partition("=")[2]
    return int(count) if count.isascii() and count.isdigit() else 0
