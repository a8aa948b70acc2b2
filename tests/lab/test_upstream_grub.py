# SPDX-License-Identifier: Apache-2.0
"""Upstream GRUB on a real boot (lab/grub_upstream.py): the lab host's grub-mkconfig reads
/etc/default/grub only (Debian's grub.d loop taken out in the image's copy, no update-grub).
plan → our marked line in /etc/default/grub, no drop-in → apply --iommu-only → grub.cfg →
the admin's sed and grub-mkconfig → reboot: both in /proc/cmdline → undo: the admin's file
kept → reboot → clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from .script import TOOLS, UEFI_TOOLS, run_lab_script

pytestmark = pytest.mark.lab
ADMIN_ARG = "lab.admin_edit=1"


def test_upstream_grub_apply_admin_edit_reboot_undo(tmp_path: Path) -> None:
    tools = [*TOOLS, *UEFI_TOOLS, "grub-mkstandalone"]
    # two reboots and three grub-mkconfig runs under TCG: at load 12-22 the stages before the
    # first reboot took 24 min (docs/lab.md); the limit leaves room for such a machine
    result = run_lab_script(tmp_path, "grub_upstream.py", [], tools, 3600, "upstream-grub")
    assert result["first"]["bootloader"] == "grub"
    # the plan writes /etc/default/grub and regenerates with grub-mkconfig, nothing else
    plan = result["plan"]
    ours = plan["args"]
    assert "iommu=pt" in ours
    assert plan["writes"] == ["/etc/default/grub"]
    assert plan["runs"] == [["grub-mkconfig", "-o", "/boot/grub/grub.cfg"]]
    # apply's own grub-mkconfig put ours on the default entry
    assert set(ours) <= set(result["apply"]["grub_cfg"].split())
    # the admin's edit after apply: both on the entry and, after the reboot, on the kernel's
    # command line, theirs first (our line appends to their value)
    assert {ADMIN_ARG, *ours} <= set(result["admin"]["grub_cfg"].split())
    words = result["admin"]["cmdline"].split()
    assert ADMIN_ARG in words and set(ours) <= set(words)
    assert words.index(ADMIN_ARG) < min(words.index(a) for a in ours)
    # undo: /etc/default/grub is the original with the admin's edit, by hash (the lab computes
    # it from the first boot's file); after the reboot ours are gone, theirs kept
    undone = result["undo"]
    assert undone["default_grub"] == undone["original_with_admin_edit"]
    assert ADMIN_ARG in undone["grub_cfg"].split() and not set(ours) & set(undone["grub_cfg"])
    after = result["clean"]["cmdline"].split()
    assert ADMIN_ARG in after and not set(ours) & set(after)
    assert list(result["timings"]) == [
        "image (upstream grub-mkconfig)",
        "boot (UEFI, GRUB from disk)",
        "first boot: discovery, baseline",
        "plan --iommu-only",
        "apply --iommu-only",
        "admin edits /etc/default/grub, grub-mkconfig",
        "reboot",
        "admin's argument and ours in /proc/cmdline",
        "undo",
        "reboot after undo",
        "clean",
    ]
