# SPDX-License-Identifier: Apache-2.0
"""apply / undo / verify on host trees: atomic, journaled, idempotent (faults at every
point of apply and undo: tests/test_faults.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from passthrough import fakehost
from passthrough.actions import Binding, Run
from passthrough.cli import main
from passthrough.host.discover import discover
from passthrough.host.root import HostRoot
from passthrough.journal import apply as apply_mod
from passthrough.journal.apply import ApplyError, Busy, apply, last_applied, locked
from passthrough.journal.journal import StepKind, StepState, Transaction, TxState
from passthrough.journal.undo import undo
from passthrough.model import BootloaderKind
from passthrough.plan.build import PlanOptions, make_plan

from .test_plan import build


def snapshot_tree(root: Path) -> dict[str, bytes | str]:
    """Every file (bytes) and link (target) outside our own state directory."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir.startswith("var/lib/passthrough"):
            continue
        for name in filenames + dirnames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            elif os.path.isfile(p):
                out[rel] = Path(p).read_bytes()
    return out


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def _apply(path: Path, opts: PlanOptions | None = None, runner: Any = None) -> Transaction | None:
    root = HostRoot(str(path))
    plan, _ = make_plan(root, discover(str(path)), opts or PlanOptions())
    if runner is None:
        return apply(root, plan, plan.record())
    return apply(root, plan, plan.record(), runner=runner)


def test_apply_then_plan_is_empty_then_undo_restores_every_byte(tmp_path: Path) -> None:
    path = build(tmp_path, "consumer-intel", {})
    before = snapshot_tree(path)
    tx = _apply(path)
    assert tx is not None and tx.state is TxState.COMPLETE
    after = snapshot_tree(path)
    assert changed(before, after) == [
        "etc/default/grub.d/99-passthrough.cfg",
        "etc/initramfs-tools/modules",
        "etc/modprobe.d/passthrough-vfio.conf",
    ]
    # commands were listed, not run: this tree is not a full OS
    assert [s.state for s in tx.steps if s.kind is StepKind.RUN] == [StepState.LISTED] * 2
    root = HostRoot(str(path))
    replan, _ = make_plan(root, discover(str(path)), PlanOptions())
    assert replan.empty
    assert _apply(path) is None  # nothing to do
    restored = undo(root).restored
    assert "etc/initramfs-tools/modules" in restored
    assert changed(before, snapshot_tree(path)) == []
    assert not (path / "etc/default/grub.d/99-passthrough.cfg").exists()
    assert undo(root).changed == []  # nothing left to undo


def test_two_applies_then_undo_returns_to_the_original(tmp_path: Path) -> None:
    path = build(tmp_path, "hgx-h100", {})
    before = snapshot_tree(path)
    _apply(path, PlanOptions(gpus=("18:00.0",)))
    _apply(path, PlanOptions(gpus=("18:00.0", "19:00.0"), hugepages_1g=8))
    # six identical H100s stay with the host: IDs cannot tell them apart
    conf = (path / "etc/modprobe.d/passthrough-vfio.conf").read_text()
    assert "options vfio-pci ids=" not in conf
    rule = (path / "etc/udev/rules.d/40-passthrough-vfio.rules").read_text()
    assert 'KERNEL=="0000:18:00.0"' in rule and 'KERNEL=="0000:19:00.0"' in rule
    assert "hugepages=8" in (path / "etc/default/grub.d/99-passthrough.cfg").read_text()
    undo(HostRoot(str(path)))
    assert changed(before, snapshot_tree(path)) == []


@pytest.mark.parametrize(
    ("name", "opts", "rebuild"),
    [
        ("hgx-h100", PlanOptions(gpus=("18:00.0",)), "update-initramfs"),
        ("epyc-v100", PlanOptions(gpus=("03:00.0", "04:00.0")), "dracut"),
        ("root-nvme-in-group", PlanOptions(gpus=("0a:00.0",), allow_boot_gpu=True), "mkinitcpio"),
    ],
)
def test_initramfs_is_rebuilt_when_only_modprobe_or_udev_files_change(
    tmp_path: Path, name: str, opts: PlanOptions, rebuild: str
) -> None:
    """Every initramfs tool copies /etc/modprobe.d into the image, and initramfs-tools the
    custom udev rules too (the lab saw the driver_override rule run inside the initramfs):
    a plan that changes only those files must still rebuild it, or the next boot runs the
    old binding. A plan that changes nothing stays empty, for each tool."""
    path = build(tmp_path, name, {})
    tx = _apply(path, opts)
    assert tx is not None and tx.state is TxState.COMPLETE
    root = HostRoot(str(path))

    def files_and_rebuilds() -> list[tuple[str, str]]:
        # (bootloader commands are only listed on a fixture tree, so grubby's reappear)
        replan, _ = make_plan(root, discover(str(path)), opts)
        return [
            (type(a).__name__, getattr(a, "path", None) or a.argv[0])
            for a in replan.actions
            if not isinstance(a, Run) or a.argv[0] == rebuild
        ]

    assert files_and_rebuilds() == []
    conf = path / "etc/modprobe.d/passthrough-vfio.conf"
    conf.write_text(conf.read_text() + "# an edit by hand\n")
    assert files_and_rebuilds() == [
        ("WriteFile", "etc/modprobe.d/passthrough-vfio.conf"),
        ("Run", rebuild),
    ]


def test_adding_a_card_rebuilds_the_initramfs_for_its_udev_rule(tmp_path: Path) -> None:
    path = build(tmp_path, "hgx-h100", {})
    _apply(path, PlanOptions(gpus=("18:00.0",)))
    tx = _apply(path, PlanOptions(gpus=("18:00.0", "19:00.0")))
    assert tx is not None
    steps = [(s.kind.value, (s.argv or [""])[0]) for s in tx.steps]
    assert ("write", "") in steps and ("run", "update-initramfs") in steps, steps


def test_failed_regeneration_stops_and_undo_restores(tmp_path: Path) -> None:
    path = build(tmp_path, "consumer-intel", {})
    before = snapshot_tree(path)
    root = HostRoot(str(path))
    plan, _ = make_plan(root, discover(str(path)), PlanOptions())

    def failing(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "update-initramfs: failed to write /boot\n")

    apply_mod_mode = apply_mod.command_mode
    apply_mod.command_mode = lambda _root: "host"  # type: ignore[assignment]
    try:
        with pytest.raises(ApplyError) as info:
            apply(root, plan, plan.record(), runner=failing)
    finally:
        apply_mod.command_mode = apply_mod_mode  # type: ignore[assignment]
    assert "update-initramfs -u -k all` failed with exit 1" in str(info.value)
    assert "passthrough undo" in str(info.value)
    journal = json.loads((path / "var/lib/passthrough/journal.json").read_text())
    assert journal["transactions"][-1]["state"] == "failed"
    assert not (path / "etc/default/grub.d/99-passthrough.cfg").exists()  # stopped before it
    undo(root)
    assert changed(before, snapshot_tree(path)) == []


def test_second_apply_while_one_runs_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "consumer-intel", {})
    root = HostRoot(str(path))
    with locked(root):
        with pytest.raises(Busy):
            _apply(path)
        assert main(["apply", "--root", str(path)]) == 2
        assert "another apply or undo is running" in capsys.readouterr().err
    assert not (path / "etc/modprobe.d/passthrough-vfio.conf").exists()


def test_unwritable_target_gives_one_line_and_undo_restores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "consumer-intel", {})
    # a file where a directory should be: the write cannot happen, whoever runs it
    (path / "etc/default/grub.d").write_text("not a directory\n")
    before = snapshot_tree(path)
    assert main(["apply", "--root", str(path)]) == 3  # a host step failed part-way
    err = capsys.readouterr().err.splitlines()
    errors = [line for line in err if line.startswith("passthrough: error:")]
    assert len(errors) == 1 and "grub.d" in errors[0] and "run `passthrough undo`" in errors[0]
    assert all(line.startswith("  · ") for line in err if line not in errors)  # progress lines
    # status tells what the cut-off apply did: the step that failed wrote nothing
    assert main(["status", "--root", str(path), "--json"]) == 0
    (tx,) = json.loads(capsys.readouterr().out)["transactions"]
    drift = {f["path"]: f["drift"] for f in tx["files"]}
    assert tx["state"] == "failed"
    assert drift["/etc/default/grub.d/99-passthrough.cfg"] == "not-written"
    assert main(["status", "--root", str(path)]) == 0
    text = capsys.readouterr().out
    assert "/etc/default/grub.d/99-passthrough.cfg  [not-written]" in text
    assert "kernel args (planned; see the files above) +vfio-pci.ids=" in text
    assert main(["undo", "--root", str(path)]) == 0
    assert changed(before, snapshot_tree(path)) == []


def test_verify_after_a_simulated_reboot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "consumer-intel", {})
    # nothing applied yet: verify reads what the host has (nothing on vfio-pci: exit 1)
    assert main(["verify", "--root", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    levels = {c["id"]: c["level"] for c in report["checks"]}
    assert levels["origin"] == "SKIP" and levels["vfio"] == "FAIL"
    assert main(["apply", "--root", str(path)]) == 0
    capsys.readouterr()
    assert main(["verify", "--root", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    failing = {c["id"] for c in report["checks"] if c["level"] == "FAIL"}
    # the apply only listed its commands (no full OS tree): they are named first, and the
    # card's fix points at them rather than at the softdeps they would have carried
    assert failing == {"pending", "kernel-args", "vfio 0000:01:00.0", "vfio 0000:01:00.1"}
    assert report["checks"][0]["id"] == "pending"
    fixes = {c["id"]: c["fix"] for c in report["checks"]}
    assert "the pending commands above never ran" in fixes["vfio 0000:01:00.1"]
    # what the reboot does on this host: the new command line, the cards on vfio-pci
    # (written by the test in place of the kernel — a stand-in named as such)
    cmdline = path / "proc/cmdline"
    cmdline.write_text(cmdline.read_text().strip() + " vfio-pci.ids=10de:2684,10de:22ba\n")
    for addr in ("0000:01:00.0", "0000:01:00.1"):
        dev = path / "sys/bus/pci/devices" / addr
        real = dev.resolve()
        (real / "driver").unlink()
        (real / "driver").symlink_to(os.path.relpath(path / "sys/bus/pci/drivers/vfio-pci", real))
        uevent = real / "uevent"
        uevent.write_text(
            "".join(
                "DRIVER=vfio-pci\n" if line.startswith("DRIVER=") else line + "\n"
                for line in uevent.read_text().splitlines()
            )
        )
    assert main(["verify", "--root", str(path)]) == 0
    assert "0 failed" in capsys.readouterr().out


def test_verify_points_a_per_device_binding_at_its_udev_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "hgx-h100", {})
    assert main(["apply", "--root", str(path), "--gpu", "18:00.0"]) == 0
    capsys.readouterr()
    assert main(["verify", "--root", str(path), "--json"]) == 1
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["vfio 0000:18:00.0"]["level"] == "FAIL"
    assert (
        "/etc/udev/rules.d/40-passthrough-vfio.rules has a line for 0000:18:00.0"
        in checks["vfio 0000:18:00.0"]["fix"]
    )


# The plan record as journals stored it before it was typed: v2 under "record", v1 inline.
OLD_RECORD = {
    "cards": [
        {
            "address": "0000:01:00.0",
            "name": "NVIDIA Corporation AD102 [GeForce RTX 4090]",
            "functions": ["0000:01:00.0", "0000:01:00.1"],
        }
    ],
    "functions": ["0000:01:00.0", "0000:01:00.1"],
    "kernel_args": {"set": ["vfio-pci.ids=10de:2684,10de:22ba"], "remove": ["nouveau.modeset"]},
    "binding": "driver_override",
    "bootloader": "grub",
}
OLD_JOURNALS = {
    "v2": {
        "schema": "passthrough.journal/v2",
        "version": 2,
        "transactions": [
            {
                "id": "20250101T000000-0",
                "kind": "apply",
                "state": "complete",
                "started": 1735689600.0,
                "finished": 1735689601.0,
                "undone": None,
                "record": OLD_RECORD,
                "args_set": ["vfio-pci.ids=10de:2684,10de:22ba"],
                "args_dropped": [],
                "undid": [],
                "restored": [],
                "steps": [],
            }
        ],
    },
    "v1": {
        "schema": "passthrough.journal/v1",
        "transactions": [
            {
                "id": "20250101T000000-0",
                "started": 1735689600.0,
                "finished": 1735689601.0,
                "state": "complete",
                "steps": [],
                **OLD_RECORD,
            }
        ],
    },
}


@pytest.mark.parametrize("version", sorted(OLD_JOURNALS))
def test_verify_reads_the_plan_record_an_older_journal_stored(
    version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "consumer-intel", {})
    journal = path / "var/lib/passthrough/journal.json"
    journal.parent.mkdir(parents=True)
    journal.write_text(json.dumps(OLD_JOURNALS[version]))
    cmdline = path / "proc/cmdline"
    cmdline.write_text(cmdline.read_text().strip() + " nouveau.modeset=0\n")
    record = last_applied(HostRoot(str(path)))
    assert record is not None
    assert record.binding is Binding.DRIVER_OVERRIDE and record.bootloader is BootloaderKind.GRUB
    assert record.cards[0].functions == ("0000:01:00.0", "0000:01:00.1")
    assert record.to_json() == OLD_RECORD  # written back in the shape it was read
    assert main(["verify", "--root", str(path), "--json"]) == 1
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    # the arguments to set and the key to drop both come from the old record
    assert "vfio-pci.ids=10de:2684,10de:22ba" in checks["kernel-args"]["summary"]
    assert "still has nouveau.modeset" in checks["kernel-args"]["summary"]
    # its binding decides the advice: a per-device binding points at the udev rule
    assert "40-passthrough-vfio.rules" in checks["vfio 0000:01:00.0"]["fix"]


def test_the_journal_stores_the_plan_record_it_reads_back(tmp_path: Path) -> None:
    path = build(tmp_path, "hgx-h100", {})
    root = HostRoot(str(path))
    plan, _ = make_plan(root, discover(str(path)), PlanOptions(gpus=("18:00.0",)))
    assert plan.binding is Binding.DRIVER_OVERRIDE
    tx = apply(root, plan, plan.record())
    assert tx is not None
    stored = json.loads((path / "var/lib/passthrough/journal.json").read_text())
    assert stored["transactions"][-1]["record"]["binding"] == "driver_override"
    assert stored["transactions"][-1]["record"]["functions"] == plan.functions
    assert last_applied(root) == plan.record()


def test_cli_plan_json_and_apply_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = build(tmp_path, "two-gpus-one-group", {})
    both = ["--root", str(path), "--gpu", "01:00.0", "--gpu", "02:00.0", "--allow-boot-gpu"]
    assert main(["plan", *both, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["schema"] == "passthrough.plan/v1" and plan["reboot_required"] is True
    assert main(["apply", *both, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["changed"] is True
    grubby = [c for c in result["commands_not_run"] if c[0] == "grubby"]
    assert grubby == [
        [
            "grubby",
            "--update-kernel=ALL",
            "--args=iommu=pt vfio-pci.ids=10de:2204,10de:1aef,10de:1e84,10de:10f8,10de:1ad8,10de:1ad9 "
            "rd.driver.pre=vfio-pci initcall_blacklist=sysfb_init",
        ]
    ]


def test_fakehost_describes_what_we_edit(tmp_path: Path) -> None:
    """The sample's bootloader files agree with its running command line (no phantom diff)."""
    path = build(tmp_path, "consumer-intel", {})
    grub = (path / "etc/default/grub").read_text()
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=on iommu=pt"' in grub
    assert fakehost.load("consumer-intel").cmdline.endswith("intel_iommu=on iommu=pt")


def test_mkinitcpio_conf_changes_only_its_modules_line(tmp_path: Path) -> None:
    """The planner edits the MODULES=() line and nothing else: the file's other lines and
    its final newline come back byte for byte (the file was once read stripped)."""
    path = build(tmp_path, "turing-desktop", {})
    conf = path / "etc/mkinitcpio.conf"
    before = conf.read_bytes()
    assert before.endswith(b"\n")
    tx = _apply(path, PlanOptions())
    assert tx is not None and tx.state is TxState.COMPLETE
    after = conf.read_bytes()
    old, new = before.decode().splitlines(True), after.decode().splitlines(True)
    differing = [(a, b) for a, b in zip(old, new, strict=True) if a != b]
    assert len(differing) == 1 and differing[0][1].startswith("MODULES=(vfio_pci vfio ")
    assert after.endswith(b"\n")
