# SPDX-License-Identifier: Apache-2.0
"""The real H200 guest (tests/fixtures/h200-guest, captured live on 2026-11-26; its README
says what it holds): the guest check on its snapshot and recorded commands says what the
live guest said, check by check, except the vector add, which only a live GPU can run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from passthrough.cli import main

FIXTURE = Path(__file__).parent / "fixtures/h200-guest"


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    rc = main([*argv, "--json"])
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    return doc


def test_the_capture_gives_the_live_guests_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    live = json.loads((FIXTURE / "live-guest-check.json").read_text())
    got = _json(
        capsys,
        "guest",
        "check",
        "--root",
        str(FIXTURE / "snapshot.tar.gz"),
        "--commands",
        str(FIXTURE / "commands"),
    )
    by_id = {c["id"]: c for c in got["checks"]}
    for check in live["checks"]:
        mine = by_id[check["id"]]
        if check["id"] == "compute":  # the live vector add; a capture has no GPU to run it on
            assert check["level"] == "PASS" and "NVIDIA H200" in check["summary"]
            assert mine["level"] == "SKIP" and "captured root" in mine["summary"]
            continue
        assert (mine["level"], mine["summary"]) == (check["level"], check["summary"])
    assert got["gpus"] == live["gpus"]
    bars = by_id["gpu-bars"]["data"]["0000:00:06.0"]
    assert bars == {"0": 16 << 20, "2": 256 << 30, "4": 32 << 20}
    assert by_id["nvidia-smi"]["summary"].startswith("0000:00:06.0 NVIDIA H200 (ECC Enabled")


def test_scan_of_the_capture_is_the_live_scan(capsys: pytest.CaptureFixture[str]) -> None:
    """Host discovery on the snapshot reads what it read on the live guest: a guest, no
    IOMMU, the H200 at 00:06.0 with its 256 GiB BAR (the root's name aside)."""
    live = json.loads((FIXTURE / "live-scan.json").read_text())
    got = _json(capsys, "scan", "--root", str(FIXTURE / "snapshot.tar.gz"))
    for doc in (live, got):
        doc.pop("root")
    # What scan has read since the capture (the iommufd check, 2026-11-26) is held apart: the
    # captured /proc/config.gz says "# CONFIG_IOMMUFD is not set", the guest has no /dev/iommu,
    # and inside a guest without an IOMMU the check is a host check, not applicable.
    assert got["host"]["kernel"]["config"].pop("CONFIG_IOMMUFD") == "n"
    assert got["host"]["iommu"].pop("dev_iommu") is False
    assert got["host"]["iommu"].pop("vfio_cdevs") == []
    (iommufd,) = [c for c in got["checks"] if c["id"] == "iommufd"]
    got["checks"].remove(iommufd)
    assert iommufd["level"] == "SKIP" and "not applicable" in iommufd["summary"]
    # and each NVIDIA card's vGPU side (issue 49): none inside this guest
    (vgpu,) = got.pop("vgpu")
    assert vgpu["address"] == "0000:00:06.0" and vgpu["mode"] == "none"
    assert got == live
    (gpu,) = got["gpus"]
    assert (gpu["address"], gpu["id"], gpu["driver"], gpu["viable"]) == (
        "0000:00:06.0",
        "10de:2335",
        "nvidia",
        False,  # inside a guest without an IOMMU: not to be passed on
    )
    assert [b["size"] for b in gpu["bars"]] == [16 << 20, 256 << 30, 32 << 20]
    assert got["host"]["virtual_machine"]
