# SPDX-License-Identifier: Apache-2.0
"""Running a lab script (lab/run.py, lab/stacks.py) from a test: as root, with its tools,
its stage log and result kept beside its work directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).parents[2]
TOOLS = ["qemu-system-x86_64", "debootstrap", "mkfs.ext4", "ssh", "ssh-keygen"]
UEFI_TOOLS = ["mkfs.vfat", "mcopy", "sfdisk"]


def run_lab_script(
    tmp_path: Path, script: str, args: list[str], tools: list[str], timeout: int, artifacts: str
) -> dict[str, Any]:
    """``lab/SCRIPT ARGS --json`` with its artifacts under PASSTHROUGH_LAB_ARTIFACTS (default
    ./lab-artifacts) / ``artifacts``; its JSON result, which must say ok."""
    assert os.geteuid() == 0, "the lab images are built with debootstrap: run as root (CI does)"
    for tool in tools:
        assert shutil.which(tool), f"{tool} is required (scripts/setup.sh test installs it)"
    base = Path(os.environ.get("PASSTHROUGH_LAB_ARTIFACTS", REPO / "lab-artifacts"))
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "lab" / script),
            *args,
            "--json",
            "--artifacts",
            str(base / artifacts),
            "--keep",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    # what the lab said (each stage and its time) and its result, beside its work directory
    (tmp_path / "lab.log").write_text(r.stderr)
    (tmp_path / "result.json").write_text(r.stdout)
    assert r.returncode == 0, r.stderr[-3000:]
    result: dict[str, Any] = json.loads(r.stdout)
    assert result["ok"]
    return result
