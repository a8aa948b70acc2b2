# SPDX-License-Identifier: Apache-2.0
"""Heterogeneous mode: several vGPU types (framebuffer sizes) on one card, on roots built
from the real L40S capture in ../shared/realworld/vgpu/, with the STAND-INS of
tests/vgpu_standin.py for NVIDIA's sriov-manage, nvidia-smi and kernel driver (which cannot
run here). The order is the documented one: VFs enabled, then ``nvidia-smi vgpu -shm 1``,
then the type writes; undo and the boot unit keep it."""

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
from passthrough.journal.journal import Journal, StepKind, TxState
from passthrough.vgpu.apply import apply_layout, tool_runner, undo_layouts
from passthrough.vgpu.plan import LayoutRefused, plan_card
from passthrough.vgpu.unit import LAYOUT, UNIT, unit_command

from .test_vgpu_realworld import VFS, card, current, driver, tree
from .vgpu_standin import A2_PF, L40S_PF, L40S_VF, a2_root, heterogeneous_on, l40s_root

pytestmark = pytest.mark.skipif(not L40S_VF.is_dir(), reason="../shared/realworld/vgpu absent")
REPO = Path(__file__).parents[1]
SCHEMA = json.loads((REPO / "passthrough/schemas/vgpu-v1.schema.json").read_text())
SMI = "/usr/bin/nvidia-smi"
SRIOV = "/usr/lib/nvidia/sriov-manage"
MIXED = f'cards:\n  "{L40S_PF}": {{L40S-24Q: 1, L40S-12Q: 2, heterogeneous: true}}\n'


def layout(tmp: Path, text: str = MIXED) -> str:
    path = tmp / "vgpu.yaml"
    path.write_text(text)
    return str(path)


def test_plan_orders_vfs_then_heterogeneous_mode_then_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path, enabled=False)
    before = tree(root)
    assert main(["vgpu", "plan", "--root", str(root), "--layout", layout(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"enable the VFs of {L40S_PF}: {SRIOV} -e {L40S_PF}",
        f"set heterogeneous mode on {L40S_PF}: {SMI} vgpu -shm 1 -i {L40S_PF}",
        "then free VFs get 1 L40S-24Q and 2 L40S-12Q, read back one by one",
    ]
    assert main(["vgpu", "plan", "--root", str(root), "--layout", layout(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, SCHEMA)
    assert out["heterogeneous"] is True and out["types"] == {"L40S-24Q": 1, "L40S-12Q": 2}
    assert tree(root) == before


def test_apply_sets_heterogeneous_mode_between_the_vfs_and_the_types_and_undo_takes_it_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path, enabled=False)
    before = tree(root)
    r = HostRoot(str(root))
    argv = ["vgpu", "apply", "--root", str(root), "--layout", layout(tmp_path)]
    assert main([*argv, "--run-root-tools"]) == 0
    assert "Created 3 L40S-24Q, L40S-12Q on 0000:26:00.0" in capsys.readouterr().out
    assert heterogeneous_on(root, L40S_PF)
    assert [current(root, vf) for vf in VFS] == ["1155", "1153", "1153", "0"]
    tx = Journal.load(r).transactions[-1]
    assert [s.argv[:2] if s.kind is StepKind.RUN else s.argv[1:2] for s in tx.steps[:5]] == [
        [SRIOV, "-e"],
        [SMI, "vgpu"],
        ["1155"],
        ["1153"],
        ["1153"],
    ]
    assert tx.steps[1].argv == [SMI, "vgpu", "-shm", "1", "-i", L40S_PF]
    assert tx.steps[1].undo_argv == [SMI, "vgpu", "-shm", "0", "-i", L40S_PF]
    assert json.loads((root / LAYOUT).read_text())["cards"][L40S_PF]["heterogeneous"] is True
    # discovery: two framebuffer sizes held show the mode is on
    assert main(["vgpu", "list", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cards"][0]["heterogeneous"] is True
    # undo: the types to 0 first (the stand-in nvidia-smi refuses the mode under vGPUs), then
    # the mode off, then the VFs
    assert main(["vgpu", "undo", "--root", str(root), "--run-root-tools"]) == 0
    assert not heterogeneous_on(root, L40S_PF)
    assert tree(root) == before
    undone = [s for t in Journal.load(r).transactions[1:] for s in t.steps]
    assert [s.argv[1] if s.kind is StepKind.SYSFS else s.argv[:4] for s in undone[:5]] == [
        "0",
        "0",
        "0",
        [SMI, "vgpu", "-shm", "0"],
        [SRIOV, "-d", L40S_PF],
    ]


def test_the_driver_then_offers_every_size_that_still_fits(tmp_path: Path) -> None:
    root = l40s_root(tmp_path)
    r = HostRoot(str(root))
    plan = plan_card(card(root), [("L40S-24Q", 1), ("L40S-8Q", 2)], heterogeneous=True)
    apply_layout(r, plan, tool=tool_runner(r, True), kernel=driver(), unit_command="/bin/true")
    assert [current(root, vf) for vf in VFS] == ["1155", "1152", "1152", "0"]
    # 48 GB less 24 + 8 + 8: the free VF offers the types of 8 GB and less
    assert max(int(t.short.split("-")[1][:-1]) for t in card(root).vfs[3].catalog) == 8
    # without heterogeneous mode the stand-in driver collapses to one size, as the real one
    plain = l40s_root(tmp_path / "plain")
    with pytest.raises(LayoutRefused, match="several types on one card need heterogeneous mode"):
        plan_card(card(plain), [("L40S-24Q", 1), ("L40S-8Q", 2)])


def test_the_boot_unit_sets_heterogeneous_mode_again_before_the_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path, enabled=False)
    r = HostRoot(str(root))
    plan = plan_card(card(root), [("L40S-24Q", 1), ("L40S-12Q", 1)], heterogeneous=True)
    apply_layout(r, plan, tool=tool_runner(r, True), kernel=driver(), unit_command=unit_command())
    # a reboot: the types, the mode and the VFs are gone
    for vf in VFS:
        (root / "sys/bus/pci/devices" / vf / "nvidia/current_vgpu_type").write_text("0\n")
    (root / "usr/lib/nvidia/standin-heterogeneous" / L40S_PF).unlink()
    env = dict(os.environ, PASSTHROUGH_ROOT=str(root))
    subprocess.run([str(root / SRIOV.lstrip("/")), "-d", L40S_PF], check=True, env=env)
    assert main(["vgpu", "verify", "--root", str(root)]) == 1
    capsys.readouterr()
    line = next(x for x in (root / UNIT).read_text().splitlines() if x.startswith("ExecStart="))
    argv = [*shlex.split(line.removeprefix("ExecStart=")), "--root", str(root), "--run-root-tools"]
    ran = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        f"{L40S_PF}: enabling its VFs",
        f"{L40S_PF}: setting heterogeneous mode",
        f"{VFS[0]}: NVIDIA L40S-24Q (id 1155) set",
        f"{VFS[1]}: NVIDIA L40S-12Q (id 1153) set",
    ]
    assert heterogeneous_on(root, L40S_PF)
    assert main(["vgpu", "verify", "--root", str(root)]) == 0
    again = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
    assert again.returncode == 0 and "heterogeneous" not in again.stdout  # in place: left alone


def test_the_boot_unit_stops_at_a_card_whose_mode_is_not_set(tmp_path: Path) -> None:
    root = l40s_root(tmp_path)
    r = HostRoot(str(root))
    plan = plan_card(card(root), [("L40S-24Q", 1), ("L40S-12Q", 1)], heterogeneous=True)
    apply_layout(r, plan, tool=tool_runner(r, True), kernel=driver(), unit_command=unit_command())
    for vf in VFS:
        (root / "sys/bus/pci/devices" / vf / "nvidia/current_vgpu_type").write_text("0\n")
    (root / "run").mkdir(exist_ok=True)
    (root / "run/standin-no-heterogeneous").write_text("")
    line = next(x for x in (root / UNIT).read_text().splitlines() if x.startswith("ExecStart="))
    argv = [*shlex.split(line.removeprefix("ExecStart=")), "--root", str(root), "--run-root-tools"]
    ran = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
    assert ran.returncode == 3
    assert ran.stdout.splitlines()[-1] == (
        f"{L40S_PF}: Setting vGPU heterogeneous mode is not supported for GPU {L40S_PF}."
    )
    assert [current(root, vf) for vf in VFS] == ["0"] * 4  # no type written without the mode


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            f'cards:\n  "{L40S_PF}": {{L40S-24Q: 1, L40S-12Q: 1}}\n',
            "one type per card ({L40S-12Q: 4}), or several with 'heterogeneous: true'",
        ),
        (
            f'cards:\n  "{L40S_PF}": {{L40S-24Q: 1, heterogeneous: yes please}}\n',
            "heterogeneous: true or false, not 'yes please'",
        ),
        (
            f'cards:\n  "{L40S_PF}": {{L40S-24Q: 2, L40S-12Q: 1, heterogeneous: true}}\n',
            f"{L40S_PF}: 2 x L40S-24Q + 1 x L40S-12Q is 60 GB of framebuffer; the card has 48 GB",
        ),
    ],
)
def test_a_layout_heterogeneous_mode_cannot_take_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    root = l40s_root(tmp_path)
    before = tree(root)
    argv = ["vgpu", "apply", "--root", str(root), "--layout", layout(tmp_path, text)]
    assert main([*argv, "--run-root-tools"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert message in line, line
    assert tree(root) == before and not (root / "var/lib/passthrough").exists()


def test_a_card_that_cannot_do_heterogeneous_mode_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mixed = "{A2-4C: 1, A2-8C: 1, heterogeneous: true}"
    a2 = a2_root(tmp_path / "a2")
    argv = ["vgpu", "apply", "--root", str(a2), "--run-root-tools", "--layout"]
    assert main([*argv, layout(tmp_path, f'cards:\n  "{A2_PF}": {mixed}\n')]) == 2
    assert capsys.readouterr().err.strip() == (
        f"passthrough: error: {A2_PF}: heterogeneous mode is set on vendor-VFIO cards only "
        "(SR-IOV VFs with nvidia/current_vgpu_type); this card is mdev-vf"
    )
    # a root without nvidia-smi: not the vGPU host driver's
    l40s = l40s_root(tmp_path / "l40s")
    (l40s / "usr/bin/nvidia-smi").unlink()
    argv = ["vgpu", "apply", "--root", str(l40s), "--run-root-tools", "--layout"]
    assert main([*argv, layout(tmp_path)]) == 2
    assert "heterogeneous mode is set with nvidia-smi, and /usr/bin/nvidia-smi is not there" in (
        capsys.readouterr().err
    )
    # a card holding vGPUs already: the mode comes before the first type write
    held = l40s_root(tmp_path / "held")
    (held / "sys/bus/pci/devices" / VFS[0] / "nvidia/current_vgpu_type").write_text("1153\n")
    argv = ["vgpu", "apply", "--root", str(held), "--run-root-tools", "--layout"]
    assert main([*argv, layout(tmp_path)]) == 2
    assert "holds vGPUs already (0000:26:00.4 " in capsys.readouterr().err


def test_a_driver_that_refuses_the_mode_rolls_the_apply_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path, enabled=False)
    (root / "run").mkdir(exist_ok=True)
    (root / "run/standin-no-heterogeneous").write_text("")
    before = tree(root)
    argv = ["vgpu", "apply", "--root", str(root), "--layout", layout(tmp_path)]
    assert main([*argv, "--run-root-tools"]) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "nvidia-smi vgpu -shm 1 -i 0000:26:00.0: exit 3: Setting vGPU heterogeneous" in err
    assert "rolled back" in err
    assert tree(root) == before  # the VFs disabled again, no type written
    assert Journal.load(HostRoot(str(root))).transactions[0].state is TxState.UNDONE


def test_undo_through_the_api_keeps_the_order(tmp_path: Path) -> None:
    root = l40s_root(tmp_path, enabled=False)
    before = tree(root)
    r = HostRoot(str(root))
    kernel = driver()
    plan = plan_card(card(root), [("L40S-16Q", 1), ("L40S-4Q", 3)], heterogeneous=True)
    apply_layout(r, plan, tool=tool_runner(r, True), kernel=kernel, unit_command="/bin/true")
    assert [current(root, vf) for vf in VFS] == ["1154", "1150", "1150", "1150"]
    count, _ = undo_layouts(r, tool=tool_runner(r, True), kernel=kernel)
    assert count == 1 and tree(root) == before


def test_the_host_role_refuses_a_heterogeneous_entry_in_one_line(tmp_path: Path) -> None:
    """The host role applies one type per card: a heterogeneous entry is refused there, with
    nothing changed, and named as what `vgpu apply --layout` takes."""
    from passthrough.vgpu.converge import plan_host

    root = l40s_root(tmp_path)
    before = tree(root)
    wanted = {L40S_PF: {"L40S-24Q": 1, "L40S-12Q": 1, "heterogeneous": True}}
    with pytest.raises(LayoutRefused) as refused:
        plan_host(HostRoot(str(root)), wanted, "passthrough_host_vgpu_layout")
    assert str(refused.value) == (
        f"passthrough_host_vgpu_layout: {L40S_PF}: heterogeneous layouts are applied by "
        "`passthrough vgpu apply --layout`, not by the host role yet: one type per card here"
    )
    assert tree(root) == before
