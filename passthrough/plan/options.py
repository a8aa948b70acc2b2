# SPDX-License-Identifier: Apache-2.0
"""The host options as one table, as :mod:`passthrough.vm.options` is for guests: each
option's field of :class:`~passthrough.plan.build.PlanOptions`, its flag on ``plan`` and
``apply`` (and ``bind``, where it takes it), its name in the ``passthrough_host`` Ansible
module, its type, default and help.

The flags are built from this table, the values read back through it, and the module's
``argument_spec`` is generated from it (``plugins/module_utils/host_options.py``, held to
the table by tests/test_options_ansible.py): a new option cannot reach one side only.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, Literal

from passthrough.pciaddr import CARD_METAVAR
from passthrough.records import frozen

Kind = Literal["bool", "int", "list"]


def count(text: str) -> int:
    """A count given on purpose: 0 or more (0: none, and what an earlier apply reserved
    goes; leaving the flag out keeps what an earlier apply reserved)."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number (0 for none)")
    return int(text)


@frozen
class PlanOption:
    """One plan option as the CLI, the Ansible module and the spec file spell it."""

    name: str  # the field the value lands in (PlanOptions, or the selection's own)
    kind: Kind
    flag: str
    help: str  # the flag's help
    doc: str  # the module option's description (Ansible users read it in ansible-doc)
    default: Any
    metavar: str = ""
    negated: bool = False  # a boolean whose flag turns it off (--no-iommu-pt)
    bind: bool = False  # `bind` takes it too (which cards, and how)
    module: str = ""  # the module's option name where it is not ``name``

    @property
    def module_name(self) -> str:
        return self.module or self.name


OPTIONS: tuple[PlanOption, ...] = (
    PlanOption(
        "gpus",
        "list",
        "--gpu",
        "a card to hand over (repeatable); default: every viable NVIDIA GPU",
        "PCI addresses or vendor:device IDs; empty means every viable NVIDIA GPU",
        default=(),
        metavar=CARD_METAVAR,
        bind=True,
    ),
    PlanOption(
        "nvswitches",
        "list",
        "--nvswitch",
        "an NVSwitch to bind with the GPUs, or 'all' (repeatable): a guest that owns the whole "
        "NVLink domain (every GPU and NVSwitch; Fabric Manager runs in the guest)",
        "NVSwitch PCI addresses, or 'all', bound with every GPU for a guest that owns the "
        "whole NVLink domain; empty leaves the NVSwitches to the host (shared-NVSwitch mode)",
        default=(),
        metavar="all|ADDRESS",
    ),
    PlanOption(
        "include_group",
        "bool",
        "--include-group",
        "take every device of the cards' IOMMU groups, knowingly",
        "Take every device of the cards' IOMMU groups",
        default=False,
        bind=True,
    ),
    PlanOption(
        "allow_boot_gpu",
        "bool",
        "--allow-boot-gpu",
        "allow the boot VGA (the host loses its console)",
        "Allow the boot VGA (the host loses its console)",
        default=False,
        bind=True,
    ),
    PlanOption(
        "release",
        "list",
        "--release",
        "a card an earlier apply bound that goes back to the host (repeatable); without it a "
        "new plan keeps every card an earlier apply bound, and says so",
        "Cards an earlier apply bound that go back to the host; without them a new plan keeps "
        "every card an earlier apply bound",
        default=(),
        metavar="ADDRESS",
    ),
    PlanOption(
        "iommu_only",
        "bool",
        "--iommu-only",
        "only the kernel arguments that turn the IOMMU on, no card: the first step on a host "
        "whose IOMMU is off (its groups are known only after the reboot)",
        "Only the kernel arguments that turn the IOMMU on, no card (the first step on a host "
        "whose IOMMU is off)",
        default=False,
    ),
    PlanOption(
        "iommu_pt",
        "bool",
        "--no-iommu-pt",
        "do not add iommu=pt",
        "Add iommu=pt",
        default=True,
        negated=True,
    ),
    PlanOption(
        "hugepages_1g",
        "int",
        "--hugepages-1g",
        "reserve N x 1 GiB huge pages at boot (at most what the host's RAM can spare); 0 "
        "removes what an earlier apply reserved, and without the flag a new plan keeps it, "
        "and says so",
        "Number of 1 GiB huge pages to reserve at boot; 0 for none (what an earlier apply "
        "reserved goes); null keeps what an earlier apply reserved",
        default=None,
        metavar="N",
        module="hugepages",
    ),
)

# Spellings that meant one of these once: refused with the new name, never guessed.
RENAMED = {"--hugepages": "--hugepages-1g"}


def _renamed(old: str, new: str) -> type[argparse.Action]:
    class Renamed(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
            parser.error(f"{old} is now {new} (render's --hugepages is the guest's memory)")

    return Renamed


def add_flags(p: argparse.ArgumentParser, bind: bool = False) -> None:
    """The flags of the table: every one (plan, apply), or those ``bind`` takes."""
    for opt in OPTIONS:
        if bind and not opt.bind:
            continue
        if opt.kind == "bool":
            action = "store_false" if opt.negated else "store_true"
            p.add_argument(opt.flag, dest=opt.name, action=action, help=opt.help)
        elif opt.kind == "list":
            p.add_argument(
                opt.flag,
                dest=opt.name,
                action="append",
                default=[],
                metavar=opt.metavar,
                help=opt.help,
            )
        else:
            p.add_argument(
                opt.flag,
                dest=opt.name,
                type=count,
                default=opt.default,
                metavar=opt.metavar,
                help=opt.help,
            )
    if not bind:
        for old, new in RENAMED.items():
            p.add_argument(
                old,
                action=_renamed(old, new),
                nargs="?",
                dest=f"renamed{old}",
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )


def values(source: argparse.Namespace | Mapping[str, Any], module: bool = False) -> dict[str, Any]:
    """Each option's value by field name, from parsed flags or the module's parameters
    (``module``: read by the module's option names), lists as tuples."""
    got = vars(source) if isinstance(source, argparse.Namespace) else source
    out: dict[str, Any] = {}
    for opt in OPTIONS:
        key = opt.module_name if module else opt.name
        value = got.get(key, opt.default)
        if value is None:
            value = opt.default  # an int left out stays None: "not given"
        out[opt.name] = tuple(value) if opt.kind == "list" else value
    return out


def ansible_argument_spec() -> dict[str, dict[str, Any]]:
    """The passthrough_host module's host options, generated from :data:`OPTIONS`."""
    spec: dict[str, dict[str, Any]] = {}
    for opt in OPTIONS:
        if opt.kind == "list":
            spec[opt.module_name] = {"type": "list", "elements": "str", "default": []}
        else:
            spec[opt.module_name] = {"type": opt.kind, "default": opt.default}
    return spec
