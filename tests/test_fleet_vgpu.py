# SPDX-License-Identifier: Apache-2.0
"""The host role's vGPU layout (``passthrough_host_vgpu_layout``) over a fleet: real
ansible-playbook (through ansible-runner and ``passthrough provision``) against sample hosts
reached with the local connection, as tests/test_ansible.py runs them.

The hosts are roots built from the real L40S capture in ../shared/realworld/vgpu/ (read at
run time) by tests/vgpu_standin.py. STAND-INS, named as such: the root's ``sriov-manage`` is
that module's script (it moves VF directories in and out of the root's sysfs); the kernel
driver is not stood in for here (the role runs in Ansible's own process): a type write is a
plain file write, read back as written, and the catalog does not shrink after it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from passthrough.cli import main
from passthrough.provision.runner import run, summary_table
from tests.test_ansible import _inventory

from .test_vgpu_realworld import tree
from .vgpu_standin import L40S_PF, L40S_VF, l40s_root

pytestmark = [
    pytest.mark.fleet,
    pytest.mark.realworld,
    pytest.mark.skipif(not L40S_VF.is_dir(), reason="../shared/realworld/vgpu absent"),
]

VFS = ["0000:26:00.4", "0000:26:00.5", "0000:26:00.6", "0000:26:00.7"]
CURRENT = "sys/bus/pci/devices/{}/nvidia/current_vgpu_type"


def _types(root: Path) -> list[str]:
    """Each VF's current_vgpu_type ("-" where the VF does not exist)."""
    out = []
    for vf in VFS:
        path = root / CURRENT.format(vf)
        out.append(path.read_text().strip() if path.exists() else "-")
    return out


def _host(root: Path, layout: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"passthrough_root": str(root), "passthrough_host_vgpu_layout": layout, **more}


def test_two_hosts_get_their_layouts_in_one_run_then_nothing_then_undo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """host-a's VFs exist already: two L40S-12Q. host-b's VFs are not enabled: the role runs
    the root's (stand-in) sriov-manage, then one L40S-24Q. A check run writes nothing; one
    run applies both layouts and the summary names each (card, type, count, VFs); a second
    run reports both unchanged; state absent takes both back byte for byte."""
    a = l40s_root(tmp_path / "a")
    b = l40s_root(tmp_path / "b", enabled=False)
    inv = _inventory(
        tmp_path,
        {
            "host-a": _host(a, {L40S_PF: {"L40S-12Q": 2}}),
            "host-b": _host(
                b, {L40S_PF: {"NVIDIA L40S-24Q": 1}}, passthrough_host_vgpu_run_root_tools=True
            ),
        },
    )
    before = {"a": tree(a), "b": tree(b)}

    check = run(str(inv), "host.yml", check=True)
    assert check.ok, summary_table(check)
    assert {h.status for h in check.hosts.values()} == {"would change"}, summary_table(check)
    assert {"a": tree(a), "b": tree(b)} == before  # check mode: a plan only
    assert "vgpu host-a: 0000:26:00.0 2 x L40S-12Q on 0000:26:00.4, 0000:26:00.5: would be " in (
        summary_table(check)
    )

    log = ["--log", str(tmp_path / "run.log")]
    assert main(["provision", "-i", str(inv), "--playbook", "host.yml", "--json", *log]) == 0
    report = json.loads(capsys.readouterr().out)["hosts"]
    assert _types(a) == ["1153", "1153", "0", "0"]  # L40S-12Q's id in the captured catalog
    assert _types(b) == ["1155", "0", "0", "0"]  # the VFs made by sriov-manage, then L40S-24Q
    for name, vfs, kind, count in (
        ("host-a", VFS[:2], "L40S-12Q", 2),
        ("host-b", VFS[:1], "L40S-24Q", 1),
    ):
        assert report[name]["status"] == "applied" and not report[name]["reboot_required"]
        ((card,),) = [report[name]["vgpu"]]
        assert (card["card"], card["type"], card["count"], card["vfs"]) == (
            L40S_PF,
            kind,
            count,
            vfs,
        )
        assert card["mode"] == "vendor-vfio" and card["state"] == "applied"
    for root in (a, b):  # the boot unit and the record it re-applies, as the CLI's apply writes
        assert (root / "etc/systemd/system/passthrough-vgpu.service").is_file()
        assert (
            L40S_PF in json.loads((root / "etc/passthrough/vgpu-layout.json").read_text())["cards"]
        )
    # no whole card went to vfio-pci: a vGPU card stays on the nvidia driver
    assert not (a / "etc/default/grub.d/99-passthrough.cfg").exists()

    applied = {"a": tree(a), "b": tree(b)}
    again = run(str(inv), "host.yml")
    assert again.ok, summary_table(again)
    assert {h.status for h in again.hosts.values()} == {"unchanged"}, summary_table(again)
    assert {h.changed for h in again.hosts.values()} == {0}
    assert {"a": tree(a), "b": tree(b)} == applied
    table = summary_table(again)
    assert "vgpu host-a: 0000:26:00.0 2 x L40S-12Q on 0000:26:00.4, 0000:26:00.5: in place, " in (
        table
    )
    assert "vgpu host-b: 0000:26:00.0 1 x L40S-24Q on 0000:26:00.4: in place, unchanged" in table

    undone = run(str(inv), "host.yml", extravars={"passthrough_host_state": "absent"})
    assert undone.ok, summary_table(undone)
    assert {h.status for h in undone.hosts.values()} == {"applied"}, summary_table(undone)
    # the types back to 0, host-b's VFs disabled again, the record and the unit gone
    assert {"a": tree(a), "b": tree(b)} == before


def test_a_bad_layout_fails_its_host_alone_with_one_line_and_nothing_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Batches of two after the canary ([good] [typo, shape] [later]): the canary's layout
    is applied; a type the card does not offer and a count that is no number each fail their
    host with one line naming the variable and the problem (exit 2: nothing changed, the
    roots byte for byte as before); the failed batch stops the rolling play, so the host
    after it is not started."""
    roots = {name: l40s_root(tmp_path / name) for name in ("good", "typo", "shape", "later")}
    layouts: dict[str, dict[str, Any]] = {
        "good": {L40S_PF: {"L40S-12Q": 2}},
        "typo": {L40S_PF: {"L40S-13Q": 2}},
        "shape": {L40S_PF: {"L40S-12Q": "two"}},
        "later": {L40S_PF: {"L40S-12Q": 2}},
    }
    inv = _inventory(tmp_path, {n: _host(roots[n], layouts[n]) for n in roots})
    before = {n: tree(r) for n, r in roots.items()}
    argv = ["provision", "-i", str(inv), "--playbook", "host.yml", "--json"]
    argv += ["-e", "passthrough_batch=2", "--log", str(tmp_path / "run.log")]
    assert main(argv) == 4  # a host failed under Ansible
    hosts = json.loads(capsys.readouterr().out)["hosts"]
    assert [hosts[n]["status"] for n in roots] == ["applied", "failed", "failed", "not started"]
    assert _types(roots["good"]) == ["1153", "1153", "0", "0"]
    typo, shape = hosts["typo"]["reason"], hosts["shape"]["reason"]
    assert "\n" not in typo and "\n" not in shape
    assert "passthrough_host_vgpu_layout: --type 'L40S-13Q': 0000:26:00.0 offers no such " in typo
    assert "it offers: L40S-1B, L40S-2B" in typo and typo.endswith("(exit 2)"), typo
    assert "passthrough_host_vgpu_layout: 0000:26:00.0: expected TYPE: COUNT, got " in shape
    assert "'L40S-12Q': 'two'" in shape and shape.endswith("(exit 2)"), shape
    for name in ("typo", "shape", "later"):
        assert tree(roots[name]) == before[name], f"{name} was changed"
