# SPDX-License-Identifier: Apache-2.0
"""Messages say what is true (issue 31, point 3): a GRUB refusal names the arguments that
would not reach the kernel; verify after an apply whose regeneration commands never ran
names them first, as status lists them, instead of blaming the softdeps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.cli_process import run_cli

from .conftest import build_variant


def test_a_grub_d_file_that_replaces_the_line_names_what_would_not_reach_the_kernel(
    tmp_path: Path,
) -> None:
    root = build_variant(tmp_path, "consumer-intel")
    (root / "etc/default/grub.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/default/grub.d/zz-harden.cfg").write_text('GRUB_CMDLINE_LINUX_DEFAULT="ro"\n')
    got = run_cli(["plan", "--root", str(root)])
    assert got.returncode == 2
    assert "vfio-pci.ids=10de:2684,10de:22ba" in got.stderr
    assert "would not reach the kernel" in got.stderr
    assert "instead of ours" not in got.stderr


def test_verify_names_the_commands_that_never_ran_first(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(hosts["turing-desktop"], root, symlinks=True)
    assert run_cli(["apply", "--root", str(root)]).returncode == 0  # list mode: nothing ran
    pending = [
        " ".join(p["argv"])
        for p in json.loads(run_cli(["status", "--root", str(root), "--json"]).stdout)["pending"]
    ]
    assert len(pending) == 2
    got = run_cli(["verify", "--root", str(root), "--json"])
    checks = json.loads(got.stdout)["checks"]
    assert checks[0]["id"] == "pending" and checks[0]["level"] == "FAIL"
    assert all(p in checks[0]["summary"] for p in pending)
    assert checks[0]["summary"].startswith("2 commands of the apply never ran")
    text = run_cli(["verify", "--root", str(root)])
    assert text.returncode == 1
    assert "softdeps" not in text.stdout


def test_verify_and_check_give_the_same_cause_and_fix_for_an_iommu_that_is_off(
    hosts: dict[str, Path],
) -> None:
    """The iommu-off sample has DMAR (the firmware is fine) and a kernel whose IOMMU is off
    by default: verify sent the user to the firmware setup, check to intel_iommu=on. Both
    now read the same cause."""
    by_command = {}
    for command in ("check", "verify"):
        got = run_cli([command, "--root", str(hosts["iommu-off"]), "--json"])
        assert got.returncode == 1, got.stderr
        (row,) = [c for c in json.loads(got.stdout)["checks"] if c["id"] == "iommu-enabled"]
        by_command[command] = (row["level"], row["summary"], row["fix"])
    assert by_command["check"] == by_command["verify"]
    assert by_command["verify"][2] == "add intel_iommu=on to the kernel command line, then reboot"
