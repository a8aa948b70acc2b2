# SPDX-License-Identifier: Apache-2.0
"""vGPU on roots built from the real captures in ../shared/realworld/vgpu/ (an L40S VF's
``nvidia/`` directory with its 23-type catalog; an A2 VF in mdev mode), with the
STAND-INS of tests/vgpu_standin.py for NVIDIA's sriov-manage and kernel driver (which
cannot run here)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

from passthrough.cli import main
from passthrough.host.discover import discover
from passthrough.host.root import HostRoot
from passthrough.journal.journal import Journal, StepKind, StepState, TxState
from passthrough.vgpu.apply import VgpuFailed, apply_layout, tool_runner, undo_layouts
from passthrough.vgpu.discover import read_vgpu
from passthrough.vgpu.plan import LayoutRefused, find_card, plan_layout
from passthrough.vgpu.unit import LAYOUT, UNIT

from .vgpu_standin import A2_PF, L40S_PF, L40S_VF, StandinDriver, a2_root, l40s_root

pytestmark = pytest.mark.skipif(not L40S_VF.is_dir(), reason="../shared/realworld/vgpu absent")
REPO = Path(__file__).parents[1]
SCHEMA = json.loads((REPO / "passthrough/schemas/vgpu-v1.schema.json").read_text())
VFS = ["0000:26:00.4", "0000:26:00.5", "0000:26:00.6", "0000:26:00.7"]


def tree(root: Path) -> dict[str, str]:
    """Every file and link under the root (our state directory aside), by content."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            p = os.path.join(d, name)
            rel = os.path.relpath(p, root)
            if rel.startswith("var/lib/passthrough"):
                continue
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            else:
                out[rel] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


def card(root: Path, pf: str = L40S_PF):  # type: ignore[no-untyped-def]
    r = HostRoot(str(root))
    return find_card(read_vgpu(r, discover(r)), pf)


def current(root: Path, vf: str) -> str:
    return (root / "sys/bus/pci/devices" / vf / "nvidia/current_vgpu_type").read_text().strip()


def driver() -> StandinDriver:
    return StandinDriver((L40S_VF / "creatable_vgpu_types").read_text())


def apply(root: Path, type_name: str, count: int, kernel: StandinDriver | None, pf: str = L40S_PF):  # type: ignore[no-untyped-def]
    r = HostRoot(str(root))
    plan = plan_layout(card(root, pf), type_name, count)
    return apply_layout(r, plan, tool=tool_runner(r, True), kernel=kernel, unit_command="/bin/true")


# -- discovery --------------------------------------------------------------------------------


def test_scan_json_names_the_vendor_vfio_mode_its_vfs_and_the_captured_catalog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path)
    assert main(["scan", "--root", str(root), "--json"]) == 0
    (l40s,) = json.loads(capsys.readouterr().out)["vgpu"]
    jsonschema.validate(l40s, {**SCHEMA["$defs"]["card"], "$defs": SCHEMA["$defs"]})
    assert l40s["mode"] == "vendor-vfio" and l40s["free_vfs"] == 4
    assert [v["address"] for v in l40s["vfs"]] == VFS
    catalog = l40s["vfs"][0]["creatable"]
    assert len(catalog) == 23  # the capture's header line is not a type
    assert {"id": 1153, "name": "NVIDIA L40S-12Q"} in catalog
    assert catalog[-1] == {"id": 2164, "name": "NVIDIA L40S-3B"}


def test_scan_json_names_the_mdev_mode_of_the_captured_a2_vf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = a2_root(tmp_path)
    assert main(["scan", "--root", str(root), "--json"]) == 0
    (a2,) = json.loads(capsys.readouterr().out)["vgpu"]
    assert a2["mode"] == "mdev-vf" and a2["address"] == A2_PF
    types = {t["id"]: t for t in a2["vfs"][1]["creatable"]}
    assert sorted(types) == list(range(742, 757))
    assert types[754]["name"] == "NVIDIA A2-4C" and types[754]["available"] == 1
    assert "framebuffer=4096M" in types[754]["description"]


def test_check_reports_the_mode_and_a_card_whose_vfs_are_not_enabled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path / "a")
    main(["check", "--root", str(root), "--json"])
    lines = [
        c["summary"] for c in json.loads(capsys.readouterr().out)["checks"] if c["id"] == "vgpu"
    ]
    assert lines == [
        f"{L40S_PF}: vGPU mode vendor-vfio (4 VFs with nvidia/creatable_vgpu_types "
        "(vendor VFIO)); 4 of 4 free, 23 types creatable"
    ]
    off = l40s_root(tmp_path / "b", enabled=False)
    main(["check", "--root", str(off), "--json"])
    (line,) = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["id"] == "vgpu"]
    assert line["level"] == "INFO" and "no VF is enabled" in line["summary"]
    assert "sriov-manage -e 0000:26:00.0" in line["summary"]


# -- vendor VFIO: apply, the driver's answers, undo ------------------------------------------------


def test_apply_and_undo_round_trip_a_layout_with_the_vfs_enabled_by_sriov_manage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path, enabled=False)
    before = tree(root)
    kernel = driver()
    done = apply(root, "L40S-12Q", 2, kernel)
    assert [current(root, vf) for vf in VFS] == ["1153", "1153", "0", "0"]
    # the catalog shrank: the configured VFs offer nothing, the free ones only 12 GB types
    now = card(root)
    assert now.vfs[0].catalog == () and now.vfs[0].type_name == "NVIDIA L40S-12Q"  # from siblings
    assert [t.short for t in now.vfs[2].catalog] == ["L40S-12Q", "L40S-12A"]
    # the journal: sriov-manage, then (PF, VF, id, name) of each write
    tx = Journal.load(HostRoot(str(root))).transactions[-1]
    assert tx.id == done.tx.id and tx.state is TxState.COMPLETE
    assert tx.steps[0].argv == ["/usr/lib/nvidia/sriov-manage", "-e", L40S_PF]
    writes = [s for s in tx.steps if s.kind is StepKind.SYSFS]
    assert [s.argv[:6] for s in writes] == [
        [
            f"sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type",
            "1153",
            f"pf={L40S_PF}",
            "mode=vendor-vfio",
            f"vf={vf}",
            "type_id=1153",
        ]
        for vf in VFS[:2]
    ]
    assert all("type_name=NVIDIA L40S-12Q" in s.argv for s in writes)
    assert (root / UNIT).is_file() and json.loads((root / LAYOUT).read_text())["cards"][L40S_PF]
    # another size on the same card is refused: the catalog offers only 12 GB now
    with pytest.raises(LayoutRefused, match="offers no such type; it offers: L40S-12Q, L40S-12A"):
        plan_layout(card(root), "L40S-24Q", 1)
    count, _ = undo_layouts(
        HostRoot(str(root)), tool=tool_runner(HostRoot(str(root)), True), kernel=kernel
    )
    assert count == 1
    assert tree(root) == before  # types 0, full catalogs, VFs gone, layout and unit removed
    assert Journal.load(HostRoot(str(root))).transactions[0].state is TxState.UNDONE


def test_a_write_the_driver_resets_to_0_is_retried(tmp_path: Path) -> None:
    root = l40s_root(tmp_path)
    kernel = StandinDriver((L40S_VF / "creatable_vgpu_types").read_text(), resets=1)
    apply(root, "L40S-24Q", 2, kernel)
    assert [current(root, vf) for vf in VFS[:2]] == ["1155", "1155"]
    first = [w for w in kernel.writes if w[0].endswith("current_vgpu_type")]
    assert [v for _, v in first] == ["1155", "1155", "1155"]  # the first VF's twice
    tx = Journal.load(HostRoot(str(root))).transactions[-1]
    states = [s.state for s in tx.steps if s.kind is StepKind.SYSFS]
    assert states == [StepState.FAILED, StepState.DONE, StepState.DONE]


def test_a_write_the_driver_will_not_take_rolls_the_layout_back(tmp_path: Path) -> None:
    root = l40s_root(tmp_path, enabled=False)
    before = tree(root)
    kernel = StandinDriver((L40S_VF / "creatable_vgpu_types").read_text(), resets=0)
    calls = {"n": 0}

    def refuse_second(root_: HostRoot, rel: str, value: str) -> None:
        kernel(root_, rel, value)
        if rel.endswith("current_vgpu_type") and value != "0":
            calls["n"] += 1
            if calls["n"] >= 2:  # the second VF: reset every time
                Path(root_.real(rel)).write_text("0\n")
                kernel._catalogs(root_)

    r = HostRoot(str(root))
    plan = plan_layout(card(root), "L40S-12Q", 2)
    with pytest.raises(
        VgpuFailed, match=r"0000:26:00.5: the driver did not take type 1153 .*rolled back"
    ):
        apply_layout(
            r, plan, tool=tool_runner(r, True), kernel=refuse_second, unit_command="/bin/true"
        )
    assert tree(root) == before  # the first VF back to 0, the VFs disabled again, no files
    txs = Journal.load(r).transactions
    assert [t.state for t in txs] == [TxState.UNDONE, TxState.COMPLETE]


def test_sriov_manage_failing_on_the_unbind_lock_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path, enabled=False)
    (root / "run").mkdir(exist_ok=True)
    (root / "run/standin-nvml-holder").write_text("nv-hostengine\n")
    before = tree(root)
    argv = ["vgpu", "apply", "--root", str(root), "--card", L40S_PF, "--type", "L40S-12Q"]
    assert main([*argv, "--count", "2", "--run-root-tools"]) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "Cannot obtain unbindLock for 0000:26:00.0" in err and "rolled back" in err
    assert tree(root) == before


def test_an_nvml_client_holding_the_card_is_named_before_anything_is_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path, enabled=False)
    info = root / "proc/driver/nvidia/gpus" / L40S_PF / "information"
    info.parent.mkdir(parents=True)
    info.write_text("Model: NVIDIA L40S\nDevice Minor: 0\n")
    fd = root / "proc/4242/fd"
    fd.mkdir(parents=True)
    (fd / "5").symlink_to("/dev/nvidia0")
    (root / "proc/4242/comm").write_text("nv-hostengine\n")
    before = tree(root)
    argv = ["vgpu", "apply", "--root", str(root), "--card", L40S_PF, "--type", "L40S-12Q"]
    assert main([*argv, "--count", "1", "--run-root-tools"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nv-hostengine (pid 4242) holds /dev/nvidia0" in err
    assert tree(root) == before and not (root / "var/lib/passthrough").exists()


def test_a_card_with_a_running_vgpu_guest_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path)
    running = root / "run/libvirt/qemu"
    running.mkdir(parents=True)
    (running / "desk1.xml").write_text(
        "<domstatus state='running'><domain type='kvm'><name>desk1</name><devices>"
        "<hostdev mode='subsystem' type='pci' managed='no'><source>"
        "<address domain='0x0000' bus='0x26' slot='0x00' function='0x4'/></source></hostdev>"
        "</devices></domain></domstatus>"
    )
    (root / "sys/bus/pci/devices/0000:26:00.4/nvidia/current_vgpu_type").write_text("1153\n")
    before = tree(root)
    argv = ["vgpu", "apply", "--root", str(root), "--card", L40S_PF, "--type", "L40S-12Q"]
    assert main([*argv, "--count", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "passthrough: error: 0000:26:00.0: vGPU guest(s) running on it (desk1): stop them first "
        "(a changed layout under a running guest is not taken)"
    )
    assert tree(root) == before


def test_the_generic_undo_takes_a_vgpu_layout_back_too(tmp_path: Path) -> None:
    root = l40s_root(tmp_path)
    before = tree(root)
    apply(root, "L40S-4Q", 3, driver())
    assert main(["undo", "--root", str(root)]) == 0
    # the catalogs are the driver's to refill (no stand-in driver under the CLI): the rest is back
    assert {k: v for k, v in tree(root).items() if not k.endswith("creatable_vgpu_types")} == {
        k: v for k, v in before.items() if not k.endswith("creatable_vgpu_types")
    }


# -- mdev on VFs ------------------------------------------------------------------------------


def test_mdev_layout_round_trips_by_uuid(tmp_path: Path) -> None:
    root = a2_root(tmp_path)
    before = tree(root)
    kernel = driver()
    with pytest.raises(LayoutRefused, match="room for 2 more A2-4C, not 3"):
        plan_layout(card(root, A2_PF), "A2-4C", 3)
    done = apply(root, "NVIDIA A2-4C", 2, kernel, pf=A2_PF)
    uuids = [p.uuid for p in done.placements]
    assert all(uuids) and len(set(uuids)) == 2
    for p in done.placements:
        assert (root / "sys/bus/mdev/devices" / str(p.uuid)).is_dir()
        assert (
            root / f"sys/bus/pci/devices/{p.vf}/mdev_supported_types/nvidia-754/create"
        ).read_text() == f"{p.uuid}\n"
    seen = card(root, A2_PF)
    assert [m.type_name for vf in seen.vfs for m in vf.mdevs] == ["NVIDIA A2-4C"] * 2
    entry = json.loads((root / LAYOUT).read_text())["cards"][A2_PF]
    assert entry["mode"] == "mdev-vf" and entry["enable_vfs"] is True  # VFs are gone at boot
    recorded = entry["vgpus"]
    assert sorted(v["uuid"] for v in recorded) == sorted(str(u) for u in uuids)
    undo_layouts(HostRoot(str(root)), tool=None, kernel=kernel)
    assert not list((root / "sys/bus/mdev/devices").iterdir())
    after = tree(root)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    # what stays: the create attributes (sysfs write-only files here are plain files)
    assert all(k.endswith("/create") or k.endswith("available_instances") for k in changed)


# -- the boot unit -----------------------------------------------------------------------------


def exec_start(root: Path) -> list[str]:
    line = next(x for x in (root / UNIT).read_text().splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def test_the_boot_unit_re_applies_the_recorded_layout(tmp_path: Path) -> None:
    root = l40s_root(tmp_path, enabled=False)
    r = HostRoot(str(root))
    from passthrough.vgpu.unit import unit_command

    plan = plan_layout(card(root), "L40S-12Q", 2)
    apply_layout(r, plan, tool=tool_runner(r, True), kernel=driver(), unit_command=unit_command())
    unit = (root / UNIT).read_text()
    assert "After=nvidia-vgpud.service nvidia-vgpu-mgr.service" in unit
    assert "Before=libvirtd.service virtqemud.service libvirt-guests.service" in unit
    assert "Type=oneshot" in unit
    # a reboot: no VFs, no types (the stand-in sriov-manage takes the VFs away, types reset)
    for vf in VFS:
        (root / "sys/bus/pci/devices" / vf / "nvidia/current_vgpu_type").write_text("0\n")
    env = dict(os.environ, PASSTHROUGH_ROOT=str(root))
    subprocess.run([str(root / "usr/lib/nvidia/sriov-manage"), "-d", L40S_PF], check=True, env=env)
    assert not (root / "sys/bus/pci/devices/0000:26:00.4").exists()
    argv = [*exec_start(root), "--root", str(root), "--run-root-tools"]
    ran = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
    assert ran.returncode == 0, ran.stderr
    assert [current(root, vf) for vf in VFS] == ["1153", "1153", "0", "0"]
    assert ran.stdout.splitlines() == [
        f"{L40S_PF}: enabling its VFs",
        "0000:26:00.4: NVIDIA L40S-12Q (id 1153) set",
        "0000:26:00.5: NVIDIA L40S-12Q (id 1153) set",
    ]
    again = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
    assert again.returncode == 0 and "already there" in again.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    root = l40s_root(tmp_path)
    r = HostRoot(str(root))
    from passthrough.vgpu.unit import unit_command

    apply_layout(r, plan_layout(card(root), "L40S-1Q", 1), tool=None, unit_command=unit_command())
    unit = tmp_path / "passthrough-vgpu.service"
    shutil.copy(root / UNIT, unit)
    ran = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    problems = [x for x in ran.stderr.splitlines() if "passthrough-vgpu" in x]
    assert ran.returncode == 0 and problems == [], ran.stderr


# -- guests: render --vgpu, validate, libvirt's schema -----------------------------------------


def schema_valid(path: Path) -> None:
    ran = subprocess.run(["virt-xml-validate", str(path), "domain"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr


@pytest.mark.skipif(shutil.which("virt-xml-validate") is None, reason="no virt-xml-validate")
def test_render_vgpu_vf_passes_validate_and_libvirts_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path)
    apply(root, "L40S-12Q", 1, driver())
    out = tmp_path / "v1.xml"
    assert (
        main(["render", "--root", str(root), "--name", "v1", "--vgpu", VFS[0], "-o", str(out)]) == 0
    )
    xml = out.read_text()
    assert (
        "<hostdev mode='subsystem' type='pci' managed='no'>\n      <source>\n"
        "        <address domain='0x0000' bus='0x26' slot='0x00' function='0x4'/>" in xml
    )
    assert "<driver name='vfio'/>" not in xml
    schema_valid(out)
    assert main(["validate", "--host-root", str(root), str(out)]) == 0
    capsys.readouterr()
    # the same VF given back to libvirt to manage, or a vfio driver element: an error
    for wrong in ("managed='yes'>", "managed='no'>\n      <driver name='vfio'/>"):
        bad = tmp_path / "bad.xml"
        bad.write_text(xml.replace("managed='no'>", wrong))
        schema_valid(bad)  # libvirt's schema takes it: only the host layer knows
        assert main(["validate", "--host-root", str(root), str(bad)]) == 1
        assert "error host-vgpu-vf-rebound" in capsys.readouterr().out
    # a VF without a type yet is refused: nothing written
    again = tmp_path / "v2.xml"
    assert (
        main(["render", "--root", str(root), "--name", "v2", "--vgpu", VFS[1], "-o", str(again)])
        == 2
    )
    assert "no vGPU type on it yet" in capsys.readouterr().err and not again.exists()


@pytest.mark.skipif(shutil.which("virt-xml-validate") is None, reason="no virt-xml-validate")
def test_render_vgpu_mdev_names_its_uuid(tmp_path: Path) -> None:
    root = a2_root(tmp_path)
    done = apply(root, "A2-4C", 1, driver(), pf=A2_PF)
    (p,) = done.placements
    out = tmp_path / "m1.xml"
    assert (
        main(["render", "--root", str(root), "--name", "m1", "--vgpu", str(p.vf), "-o", str(out)])
        == 0
    )
    xml = out.read_text()
    assert (
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'>\n      <source>\n"
        f"        <address uuid='{p.uuid}'/>" in xml
    )
    schema_valid(out)
    assert main(["validate", "--host-root", str(root), str(out)]) == 0


def test_a_snapshot_carries_the_vgpu_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path)
    apply(root, "L40S-12Q", 1, driver())
    assert main(["scan", "--root", str(root), "--json"]) == 0
    live = json.loads(capsys.readouterr().out)["vgpu"]
    snap = tmp_path / "host.tar.gz"
    assert main(["snapshot", "--root", str(root), "-o", str(snap)]) == 0
    capsys.readouterr()
    assert main(["scan", "--root", str(snap), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["vgpu"] == live
    assert live[0]["vfs"][0]["type_name"] == "NVIDIA L40S-12Q"


def test_kubevirt_render_permits_an_mdev_by_name_and_says_what_pci_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    a2 = a2_root(tmp_path / "a2")
    (m,) = apply(a2, "A2-4C", 1, driver(), pf=A2_PF).placements
    out = tmp_path / "a2.yaml"
    argv = ["kubevirt", "render", "--root", str(a2), "--name", "m1", "-o", str(out)]
    assert main([*argv, "--vgpu", str(m.uuid)]) == 0
    (patch,) = list(yaml.safe_load_all(out.read_text()))
    assert patch["spec"]["configuration"]["permittedHostDevices"] == {
        "mediatedDevices": [
            {"mdevNameSelector": "NVIDIA A2-4C", "resourceName": "nvidia.com/NVIDIA_A2-4C"}
        ]
    }
    assert "warning" not in capsys.readouterr().err
    assert main(["kubevirt", "validate", str(out), "--root", str(a2)]) == 0
    l40s = l40s_root(tmp_path / "l40s")
    apply(l40s, "L40S-12Q", 1, driver())
    argv = ["kubevirt", "render", "--root", str(l40s), "--name", "v1", "-o", str(out)]
    assert main([*argv, "--vgpu", VFS[0]]) == 0
    (patch,) = list(yaml.safe_load_all(out.read_text()))
    assert patch["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"] == [
        {
            "pciVendorSelector": "10DE:26B9",
            "resourceName": "nvidia.com/AD102GL_L40S",
            "externalResourceProvider": True,
        }
    ]
    warned = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
    assert warned == [
        "warning: vendor-VFIO vGPU VFs all carry the card's vendor:device id (10DE:26B9): "
        "pciHostDevices cannot tell their types apart, so nvidia.com/AD102GL_L40S is any VF of "
        "the card whatever its type (one resource per profile needs NVIDIA's device plugin to "
        "publish them by type)"
    ]


def test_every_vgpu_json_output_is_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path, enabled=False)
    layout = ["--card", L40S_PF, "--type", "L40S-12Q", "--count", "2"]
    runs = [
        ["vgpu", "list"],
        ["vgpu", "plan", *layout],
        ["vgpu", "apply", *layout, "--run-root-tools"],
        ["vgpu", "list"],
        ["vgpu", "undo", "--run-root-tools"],
    ]
    outputs = []
    for argv in runs:
        assert main([*argv, "--root", str(root), "--json"]) == 0, argv
        out = json.loads(capsys.readouterr().out)
        jsonschema.validate(out, SCHEMA)
        outputs.append(out)
    assert outputs[1]["enable_vfs"] is True and outputs[1]["vgpus"] == []  # VFs picked later
    assert [v["vf"] for v in outputs[2]["vgpus"]] == VFS[:2]
    assert outputs[2]["commands_not_run"] == [["systemctl", "enable", "passthrough-vgpu.service"]]
    assert [v["type_id"] for v in outputs[3]["cards"][0]["vfs"]] == [1153, 1153, 0, 0]
    assert outputs[4]["undone"] == 1 and outputs[0]["cards"][0]["mode"] == "none"


# -- a vGPU card is never planned as a whole-card passthrough ----------------------------------


def test_a_vgpu_vf_and_its_card_are_never_bound_to_vfio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the VFs enabled (the captured ``nvidia/`` directory on each), binding a VF to
    vfio-pci would destroy its vGPU and binding the card would take every VF away: scan
    judges neither viable (code vgpu-vf), the default plan leaves them alone, and naming one
    is refused with one line and nothing written."""
    root = l40s_root(tmp_path, enabled=True)
    before = tree(root)
    capsys.readouterr()
    assert main(["scan", "--root", str(root), "--json"]) == 0
    gpus = {g["address"]: g for g in json.loads(capsys.readouterr().out)["gpus"]}
    for address in [L40S_PF, *VFS]:
        assert gpus[address]["viable"] is False, gpus[address]
        assert "vgpu-vf" in [f["code"] for f in gpus[address]["findings"]]
    for gpu in (VFS[0], L40S_PF):
        assert main(["plan", "--root", str(root), "--gpu", gpu]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "vGPU" in err, err
    assert main(["apply", "--root", str(root), "--gpu", VFS[0]]) == 2
    assert tree(root) == before and not (root / "var/lib/passthrough").exists()
