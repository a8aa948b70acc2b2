# SPDX-License-Identifier: Apache-2.0
"""What every family's read-back reports, and the one comparison they all make.

Each family module (grub, loaderentries, kernelstub, proxmox) reads what its next boot
gets and adds to a :class:`NextBoot`: the sources it read, the ones it could not read (and
why), and what lacks our arguments; :func:`lacking` says what a command line lacks.
``passthrough.journal.nextboot`` runs the right family after apply's regeneration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from passthrough.actions import PlanRecord
from passthrough.kargs import key_of


@dataclass
class NextBoot:
    missing: list[str] = field(default_factory=list)  # "/boot/grub/grub.cfg: iommu=pt"
    checked: list[str] = field(default_factory=list)  # what was read
    unchecked: list[str] = field(default_factory=list)  # what could not be, and why
    not_run: list[list[str]] = field(default_factory=list)  # regenerations that did not run
    ran: list[list[str]] = field(default_factory=list)  # regenerations that ran: what they wrote


def lacking(args: list[str], record: PlanRecord) -> list[str]:
    """The arguments of ``record`` that ``args`` does not give the kernel: one of ours
    missing or overridden by a later value, or a key we dropped still there."""
    last: dict[str, str] = {}
    for arg in args:
        last[key_of(arg)] = arg
    out = [a for k, a in record.kernel_args.set.items() if last.get(k) != a]
    return out + [f"(not {k})" for k in sorted(record.kernel_args.drop) if k in last]
