# SPDX-License-Identifier: Apache-2.0
"""Which cards a command takes: the one answer for plan, apply, bind, render and kubevirt.

A card is named by any of its functions' PCI addresses (``0000:01:00.0``, ``01:00.0``) or by
a vendor:device ID (``10de:2330``: every card with a function of that ID). Named nothing, a
command takes every viable NVIDIA card, never an SR-IOV virtual function (a VF goes to a
guest only when named; binding its PF to vfio-pci takes the VFs away). ``kubevirt
preflight`` reports on every NVIDIA card instead, viable or not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

from passthrough.analysis.codes import NO_IOMMU
from passthrough.errors import InvalidPciAddress, PassthroughError, quote
from passthrough.model import NVIDIA, GpuVerdict
from passthrough.pciaddr import CARD_METAVAR, PciAddress

ID_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$")

METAVAR = CARD_METAVAR  # how --gpu reads in every command's help (kept here for its importers)

Default = Literal["viable", "nvidia"]


class NoSuchCard(PassthroughError):
    """A --gpu value that names no card on this host, or none to take: a usage error
    (exit 2, nothing changed), told in one line."""


def parse_card(token: str) -> PciAddress | str:
    """A --gpu value as a PCI address, or a vendor:device ID (lower case)."""
    if ID_RE.match(token):
        return token.lower()
    try:
        return PciAddress.parse(token)
    except InvalidPciAddress:
        raise NoSuchCard(
            f"--gpu {quote(token)}: neither a PCI address (0000:01:00.0) nor a "
            "vendor:device ID (10de:2684)"
        ) from None


def _matches(v: GpuVerdict, wanted: PciAddress | str) -> bool:
    if isinstance(wanted, str):
        return any(f.id == wanted for f in v.gpu.functions)
    return any(f.address == wanted for f in v.gpu.functions)


def default_cards(verdicts: Iterable[GpuVerdict], default: Default = "viable") -> list[GpuVerdict]:
    """The cards taken when none is named (see the module's docstring)."""
    nvidia = [v for v in verdicts if v.gpu.primary.vendor_id == NVIDIA]
    if default == "nvidia":
        return nvidia
    return [v for v in nvidia if v.viable and v.gpu.primary.physfn is None]


def _why_none(verdicts: Sequence[GpuVerdict]) -> str:
    """Why no card is taken by default, with the way forward: an IOMMU that is off is
    turned on first (its groups exist only after that reboot), not worked around."""
    nvidia = default_cards(verdicts, "nvidia")
    if any(f.code == NO_IOMMU for v in nvidia for f in v.findings):
        return (
            "no IOMMU groups on this host (the IOMMU is off): `passthrough plan --iommu-only` "
            "turns it on; after that reboot, plan the cards"
        )
    return "no viable NVIDIA GPU on this host; name cards with --gpu (see `passthrough scan`)"


def choose_cards(
    verdicts: Sequence[GpuVerdict],
    requested: Iterable[str],
    *,
    default: Default = "viable",
    required: bool = True,
) -> list[GpuVerdict]:
    """The cards named (in the order named, each once), or the default ones. Raises
    :class:`NoSuchCard` for a value that names no card, and, when ``required``, for an
    empty default (render may write a guest with no card; plan has nothing to do)."""
    tokens = list(requested)
    if not tokens:
        chosen = default_cards(verdicts, default)
        if not chosen and required:
            raise NoSuchCard(_why_none(verdicts))
        return chosen
    chosen = []
    for token in tokens:
        wanted = parse_card(token)
        found = [v for v in verdicts if _matches(v, wanted)]
        if not found:
            raise NoSuchCard(f"--gpu {token}: matches no GPU on this host (see `passthrough scan`)")
        chosen += [v for v in found if v not in chosen]
    return chosen
