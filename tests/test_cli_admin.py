# SPDX-License-Identifier: Apache-2.0
"""The CLI on a host an admin runs it on (issue 22 item 5): plan and apply tell the same
story, an IOMMU-only plan, earlier cards kept, verify on any host."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from passthrough.cli import main

from .cli_process import run_cli
from .conftest import bind_to_vfio, tree_hash


@pytest.fixture
def host(hosts: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of consumer-intel (Debian 12, GRUB, initramfs-tools): not a full OS tree,
    so apply lists its commands instead of running them."""
    root = tmp_path / "host"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    return root


def test_plan_and_apply_name_the_same_pending_commands(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["apply", "--root", str(host), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["commands_not_run"]
    assert listed, "a sample root lists its commands"
    assert main(["apply", "--root", str(host), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["changed"] is False and again["pending"] == listed
    assert main(["plan", "--root", str(host), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["actions"] == [] and plan["pending"] == listed
    assert main(["plan", "--root", str(host)]) == 0
    text = capsys.readouterr().out
    assert "Nothing to do" in text and "Still pending from an earlier apply" in text
    assert "update-initramfs -u -k all" in text


def test_verify_on_a_host_prepared_by_hand(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # acs-override-proxmox: its GPU was put on vfio-pci by hand (no journal of ours)
    assert main(["verify", "--root", str(hosts["acs-override-proxmox"]), "--json"]) == 0
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["origin"]["level"] == "SKIP"
    assert "prepared by hand or by another tool" in checks["origin"]["summary"]
    bound = [i for i, c in checks.items() if i.startswith("vfio ") and c["level"] == "PASS"]
    assert bound, checks
    assert checks["host-devices"]["level"] == "PASS"


def test_verify_names_what_did_not_come_from_us(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["apply", "--root", str(host)]) == 0
    capsys.readouterr()
    # after the reboot: the card on vfio-pci, and a USB controller the admin bound by hand
    for fn in ("0000:01:00.0", "0000:01:00.1", "0000:00:14.0"):
        bind_to_vfio(host, fn)
    main(["verify", "--root", str(host), "--json"])
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["vfio 0000:01:00.0"]["summary"] == "10de:2684 bound to vfio-pci"
    assert checks["vfio 0000:00:14.0"]["summary"].endswith("bound to vfio-pci (not by passthrough)")
    assert "origin" not in checks


def _plan(root: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, object]:
    assert main(["plan", "--root", str(root), "--json", *flags]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def _cards(plan: dict[str, object]) -> list[str]:
    return [c["address"] for c in plan["cards"]]  # type: ignore[attr-defined,index]


def test_a_second_plan_keeps_the_cards_an_earlier_apply_bound(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "hgx"
    shutil.copytree(hosts["hgx-h100"], root, symlinks=True)
    assert main(["apply", "--root", str(root), "--gpu", "18:00.0"]) == 0
    capsys.readouterr()
    plan = _plan(root, capsys, "--gpu", "0000:19:00.0")
    assert _cards(plan) == ["0000:19:00.0", "0000:18:00.0"]
    assert any("0000:18:00.0: kept from the earlier apply" in n for n in plan["notes"])  # type: ignore[attr-defined]
    # a plain plan after an apply means the same cards again, not every viable one
    assert _cards(_plan(root, capsys)) == ["0000:18:00.0"]
    plan = _plan(root, capsys, "--gpu", "19:00.0", "--release", "18:00.0")
    assert _cards(plan) == ["0000:19:00.0"]
    assert any("released" in n for n in plan["notes"])  # type: ignore[attr-defined]
    before = tree_hash(root)
    assert main(["plan", "--root", str(root), "--release", "18:00.0"]) == 2
    assert "that is `passthrough undo`" in capsys.readouterr().err
    assert main(["plan", "--root", str(root), "--release", "1b:00.0"]) == 2
    assert "not a card an earlier apply bound (0000:18:00.0)" in capsys.readouterr().err
    assert tree_hash(root) == before


def test_an_iommu_only_plan_on_a_host_whose_iommu_is_off(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = hosts["iommu-off"]
    plan = _plan(root, capsys, "--iommu-only")
    assert _cards(plan) == [] and plan["functions"] == []
    written = [a["path"] for a in plan["actions"] if a["kind"] == "write"]  # type: ignore[attr-defined,index]
    # the bootloader's file only: nothing for vfio-pci, no initramfs
    assert written and all(p.startswith("/etc/default/grub") for p in written), written
    assert plan["kernel_args"]["set"] == ["intel_iommu=on", "iommu=pt"]  # type: ignore[index]
    assert plan["notes"] == ["IOMMU only: no card is bound"]
    assert main(["plan", "--root", str(root), "--iommu-only", "--gpu", "01:00.0"]) == 2
    assert "leave out --gpu" in capsys.readouterr().err


def test_udev_yes_on_another_root_refuses_rather_than_mix_machines(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("UMOCKDEV_DIR", raising=False)
    assert main(["scan", "--root", str(hosts["consumer-intel"]), "--udev", "yes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "udev enumerates this machine's devices" in err
    assert main(["scan", "--root", str(hosts["consumer-intel"]), "--json"]) == 0  # auto: sysfs


def test_notes_are_notes_and_quiet_hides_them(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # hgx-h100: the address planner explains its window for the 128 GiB BARs
    render = ["render", "--root", str(hosts["hgx-h100"]), "--name", "g", "--gpu", "18:00.0"]
    assert main(render) == 0
    err = capsys.readouterr().err
    assert err and all(line.startswith(("note: ", "warning: ")) for line in err.splitlines())
    assert "passthrough:" not in err  # that prefix is for errors only
    assert main([*render, "-q"]) == 0
    quiet = capsys.readouterr().err
    assert "note:" not in quiet
    assert [ln for ln in err.splitlines() if ln.startswith("warning: ")] == quiet.splitlines()


def test_verbose_names_each_file_and_command(host: Path) -> None:
    import subprocess

    def apply(*flags: str) -> subprocess.CompletedProcess[str]:
        return run_cli(["apply", "--root", str(host), *flags])

    first = apply("-v")
    assert first.returncode == 0, first.stderr
    logged = [line for line in first.stderr.splitlines() if line.startswith("  | ")]
    written = [line for line in logged if line.startswith("  | wrote ")]
    assert written and all(str(host) in line for line in written), first.stderr
    assert not any(line.startswith("  | read ") for line in logged), "-vv only"
    again = apply("-vv")  # nothing left to change: the read is logged, no file written
    assert again.returncode == 0, again.stderr
    assert any(line.startswith(f"  | read {host}") for line in again.stderr.splitlines())
    assert not any(line.startswith("  | wrote ") for line in again.stderr.splitlines())
    plain = run_cli(["undo", "--root", str(host)])
    assert plain.returncode == 0 and "  | " not in plain.stderr, plain.stderr


def test_a_second_apply_still_names_what_the_first_could_only_list(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An image prepared in two applies: the second changes GRUB only, yet the first one's
    initramfs rebuild is still owed, and both the text and the JSON say so."""
    assert main(["apply", "--root", str(host), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["commands_not_run"]
    assert ["update-initramfs", "-u", "-k", "all"] in first
    assert main(["apply", "--root", str(host), "--hugepages-1g", "2", "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["changed"] and ["update-grub"] in second["commands_not_run"]
    assert ["update-initramfs", "-u", "-k", "all"] in second["pending"], second
    assert not any(argv in second["commands_not_run"] for argv in second["pending"])
    assert main(["undo", "--root", str(host), "--json"]) == 0
    capsys.readouterr()
    assert main(["apply", "--root", str(host)]) == 0
    assert main(["apply", "--root", str(host), "--hugepages-1g", "2"]) == 0
    text = capsys.readouterr().out
    assert "Still pending from an earlier apply" in text, text
    assert "update-initramfs -u -k all" in text.split("Still pending from an earlier apply")[1]


def test_verbose_in_one_process_neither_doubles_nor_lingers(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() twice with -v logs each line once; a later call without -v logs nothing."""
    assert main(["apply", "--root", str(host), "-v"]) == 0
    capsys.readouterr()
    assert main(["undo", "--root", str(host), "-v"]) == 0
    removed = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("  | removed ")]
    assert removed and len(removed) == len(set(removed)), removed
    assert main(["apply", "--root", str(host)]) == 0
    assert "  | " not in capsys.readouterr().err
