# SPDX-License-Identifier: Apache-2.0
"""After a reboot: ``passthrough vgpu verify`` (and ``passthrough verify``'s vgpu line) on
roots built from the real captures in ../shared/realworld/vgpu/, with the STAND-INS of
tests/vgpu_standin.py for NVIDIA's sriov-manage and kernel driver (which cannot run here).

A reboot is simulated as the driver leaves sysfs at boot: every type back to 0 and the VFs
gone (the stand-in sriov-manage takes them away); the boot unit's own ExecStart is then run
against the root, and verify passes again."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import jsonschema
import pytest

from passthrough.cli import main
from passthrough.host.root import HostRoot
from passthrough.vgpu.apply import apply_layout, tool_runner
from passthrough.vgpu.unit import LAYOUT, UNIT, unit_command

from .test_vgpu_realworld import VFS, card, driver
from .vgpu_standin import A2_PF, L40S_PF, L40S_VF, a2_root, l40s_root

pytestmark = pytest.mark.skipif(not L40S_VF.is_dir(), reason="../shared/realworld/vgpu absent")
REPO = Path(__file__).parents[1]
SCHEMA = json.loads((REPO / "passthrough/schemas/vgpu-v1.schema.json").read_text())


def applied(tmp: Path, type_name: str = "L40S-12Q", count: int = 2) -> Path:
    """An L40S root whose VFs sriov-manage enabled and whose layout apply recorded."""
    from passthrough.vgpu.plan import plan_layout

    root = l40s_root(tmp, enabled=False)
    r = HostRoot(str(root))
    plan = plan_layout(card(root), type_name, count)
    apply_layout(r, plan, tool=tool_runner(r, True), kernel=driver(), unit_command=unit_command())
    return root


def vf_type(root: Path, vf: str) -> Path:
    return root / "sys/bus/pci/devices" / vf / "nvidia/current_vgpu_type"


def reboot(root: Path) -> None:
    """What the driver leaves at boot: no type on any VF, then no VF at all."""
    for vf in VFS:
        if vf_type(root, vf).exists():
            vf_type(root, vf).write_text("0\n")
    env = dict(os.environ, PASSTHROUGH_ROOT=str(root))
    subprocess.run([str(root / "usr/lib/nvidia/sriov-manage"), "-d", L40S_PF], check=True, env=env)
    assert not (root / "sys/bus/pci/devices" / VFS[0]).exists()


def verify_json(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["vgpu", "verify", "--root", str(root), "--json"])
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, SCHEMA)
    return code, out


def test_verify_passes_after_apply_and_names_each_vgpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = applied(tmp_path)
    assert main(["vgpu", "verify", "--root", str(root)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{VFS[0]}  NVIDIA L40S-12Q (id 1153): as recorded",
        f"{VFS[1]}  NVIDIA L40S-12Q (id 1153): as recorded",
        "2 of 2 recorded vGPU(s) as recorded.",
    ]
    code, out = verify_json(root, capsys)
    assert code == 0 and out["ok"] is True and out["recorded"] is True
    assert [(c["vf"], c["state"]) for c in out["checked"]] == [(v, "as-recorded") for v in VFS[:2]]


def test_after_a_reboot_verify_finds_the_vfs_missing_and_the_boot_unit_brings_them_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = applied(tmp_path)
    reboot(root)
    code, out = verify_json(root, capsys)
    assert code == 1 and out["ok"] is False
    assert [(c["vf"], c["state"], c["ok"]) for c in out["checked"]] == [
        (v, "vf-missing", False) for v in VFS[:2]
    ]
    assert main(["vgpu", "verify", "--root", str(root)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{VFS[0]}  NVIDIA L40S-12Q (id 1153): VF missing: SR-IOV was not")
    assert lines[-1] == "0 of 2 recorded vGPU(s) as recorded."
    # passthrough verify carries one line on it
    assert main(["verify", "--root", str(root), "--json"]) == 1
    (line,) = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["id"] == "vgpu"]
    assert line["level"] == "FAIL"
    assert line["summary"] == (
        f"0 of 2 recorded vGPU(s) as recorded; VF missing: {VFS[0]}, {VFS[1]}"
    )
    # and so does the fleet's verify after its reboot (the passthrough_check module calls
    # the library's verify, not the command)
    from passthrough.host.discover import discover
    from passthrough.host.root import HostRoot
    from passthrough.live.verify import verify

    fleet = [r for r in verify(HostRoot(str(root)), discover(str(root))) if r.id == "vgpu"]
    assert [(r.level.value, r.summary) for r in fleet] == [("FAIL", line["summary"])]
    # the boot unit's own command, run against the root: verify passes again
    exec_start = next(
        x for x in (root / UNIT).read_text().splitlines() if x.startswith("ExecStart=")
    )
    argv = [*shlex.split(exec_start.removeprefix("ExecStart=")), "--root", str(root)]
    ran = subprocess.run(
        [*argv, "--run-root-tools"], capture_output=True, text=True, check=False, cwd=REPO
    )
    assert ran.returncode == 0, ran.stderr
    code, out = verify_json(root, capsys)
    assert code == 0 and {c["state"] for c in out["checked"]} == {"as-recorded"}
    assert main(["verify", "--root", str(root), "--json"]) == 0
    (line,) = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["id"] == "vgpu"]
    assert line["level"] == "PASS"


def test_verify_tells_a_type_reset_to_0_from_another_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = applied(tmp_path)
    vf_type(root, VFS[0]).write_text("0\n")  # the unit did not run: the VF is there, empty
    vf_type(root, VFS[1]).write_text("1163\n")  # someone set another type by hand
    assert main(["vgpu", "verify", "--root", str(root)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{VFS[0]}  NVIDIA L40S-12Q (id 1153): reset to 0: the boot unit did not run or failed "
        "(journalctl -u passthrough-vgpu.service)",
        f"{VFS[1]}  NVIDIA L40S-12Q (id 1153): holds NVIDIA L40S-12A (id 1163), another type "
        "than recorded: changed after apply (by hand, another tool)",
        "0 of 2 recorded vGPU(s) as recorded.",
    ]
    code, out = verify_json(root, capsys)
    assert code == 1
    assert [(c["state"], c["now_type_id"]) for c in out["checked"]] == [
        ("reset", 0),
        ("other-type", 1163),
    ]


def test_verify_checks_mdevs_by_uuid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from passthrough.vgpu.plan import plan_layout

    root = a2_root(tmp_path)
    r = HostRoot(str(root))
    plan = plan_layout(card(root, A2_PF), "A2-4C", 2)
    done = apply_layout(r, plan, tool=None, kernel=driver(), unit_command="/bin/true")
    code, out = verify_json(root, capsys)
    assert code == 0
    assert [(c["uuid"], c["state"]) for c in out["checked"]] == [
        (p.uuid, "as-recorded") for p in done.placements
    ]
    gone = root / "sys/bus/mdev/devices" / str(done.placements[0].uuid)
    for child in gone.iterdir():
        child.unlink()
    gone.rmdir()  # the mdev did not come back after boot
    code, out = verify_json(root, capsys)
    assert code == 1
    assert [c["state"] for c in out["checked"]] == ["reset", "as-recorded"]


def test_verify_without_a_layout_and_with_a_broken_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path)
    assert main(["vgpu", "verify", "--root", str(root)]) == 0
    assert capsys.readouterr().out == (f"No vGPU layout recorded (/{LAYOUT}): nothing to verify.\n")
    assert main(["verify", "--root", str(root), "--json"]) in (0, 1)
    ids = [c["id"] for c in json.loads(capsys.readouterr().out)["checks"]]
    assert "vgpu" not in ids  # no layout: verify says nothing of vGPU
    (root / LAYOUT).parent.mkdir(parents=True)
    (root / LAYOUT).write_text('{"cards": {"0000:26:00.0": {"vgpus": [{"vf": 3}]}}}')
    assert main(["vgpu", "verify", "--root", str(root)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"passthrough: error: /{LAYOUT}: 0000:26:00.0: a vGPU entry without its VF and type id"
    )
