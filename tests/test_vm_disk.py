# SPDX-License-Identifier: Apache-2.0
"""Issue 19 item 5: ``vm define --base-image`` (and the VM module) never replaces a disk
it did not create unless told, and says what it did.

Real components: real ``qemu-img`` images (a base and an overlay holding a guest's data,
written with real ``qemu-io``), the real CLI in a subprocess, the real VM module run as
Ansible runs it, and libvirt's ``test:///default`` driver (which defines without root)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from passthrough import fakehost

from .cli_process import run_cli
from .test_options_ansible import _run_module

PT = [sys.executable, "-m", "passthrough"]
DATA = "0xab"  # the byte the guest's "data" is written with


def sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def holds_data(image: Path) -> bool:
    """Whether the guest's data is still in ``image`` (qemu-io verifies the pattern)."""
    r = sh("qemu-io", "-r", "-f", "qcow2", "-c", f"read -P {DATA} 0 64k", str(image))
    return r.returncode == 0 and "Pattern verification failed" not in r.stdout


def backing(image: Path) -> str:
    info = json.loads(sh("qemu-img", "info", "--output=json", str(image)).stdout)
    return str(info.get("backing-filename", ""))


def used_overlay(base: Path, path: Path) -> Path:
    """An overlay on ``base`` that a guest has written its data to."""
    assert (
        sh(
            "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(path)
        ).returncode
        == 0
    )
    assert sh("qemu-io", "-f", "qcow2", "-c", f"write -P {DATA} 0 64k", str(path)).returncode == 0
    assert holds_data(path)
    return path


@pytest.fixture
def images(tmp_path: Path) -> Path:
    d = tmp_path / "images"
    d.mkdir()
    assert (
        sh("qemu-img", "create", "-q", "-f", "qcow2", str(d / "base.qcow2"), "16M").returncode == 0
    )
    return d


def domain(tmp_path: Path, disk: Path, name: str = "diskguest") -> Path:
    xml = tmp_path / f"{name or 'noname'}.xml"
    named = f"<name>{name}</name>" if name else ""
    xml.write_text(
        f"<domain type='test'>{named}<memory unit='MiB'>64</memory><os><type>hvm</type></os>"
        f"<devices><disk type='file' device='disk'><driver name='qemu' type='qcow2'/>"
        f"<source file='{disk}'/><target dev='vda' bus='virtio'/></disk></devices></domain>\n"
    )
    return xml


def define(xml: Path, base: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        [
            "vm",
            "define",
            str(xml),
            "--connect",
            "test:///default",
            "--base-image",
            str(base),
            *flags,
        ]
    )


def one_error(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("passthrough: error: "), r.stderr
    return lines[0]


def test_an_existing_disk_is_refused_and_kept(images: Path, tmp_path: Path) -> None:
    disk = used_overlay(images / "base.qcow2", images / "guest.qcow2")
    before, listing = digest(disk), sorted(os.listdir(images))
    r = define(domain(tmp_path, disk), images / "base.qcow2")
    assert r.returncode == 2
    line = one_error(r)
    assert str(disk) in line and "--reuse-disk" in line and "--overwrite-disk" in line
    assert digest(disk) == before and holds_data(disk)
    assert sorted(os.listdir(images)) == listing  # no temporary image left


def test_reuse_keeps_it_as_it_is_and_says_so(images: Path, tmp_path: Path) -> None:
    disk = used_overlay(images / "base.qcow2", images / "guest.qcow2")
    before = digest(disk)
    r = define(domain(tmp_path, disk), images / "base.qcow2", "--reuse-disk")
    assert r.returncode == 0, r.stderr
    assert f"disk {disk}: kept as it was" in r.stdout
    assert digest(disk) == before and holds_data(disk)
    r = define(domain(tmp_path, disk), images / "base.qcow2", "--reuse-disk", "--json")
    assert json.loads(r.stdout)["disk"] == {
        "path": str(disk),
        "base": str(images / "base.qcow2"),
        "action": "reused",
    }


def test_overwrite_replaces_it_with_a_new_overlay(images: Path, tmp_path: Path) -> None:
    disk = used_overlay(images / "base.qcow2", images / "guest.qcow2")
    r = define(domain(tmp_path, disk), images / "base.qcow2", "--overwrite-disk", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["disk"]["action"] == "overwritten"
    assert not holds_data(disk)  # the old data is gone: a fresh overlay
    assert backing(disk) == str(images / "base.qcow2")
    assert sorted(os.listdir(images)) == ["base.qcow2", "guest.qcow2"]


def test_a_new_disk_is_created_and_said(images: Path, tmp_path: Path) -> None:
    disk = images / "guest.qcow2"
    r = define(domain(tmp_path, disk), images / "base.qcow2")
    assert r.returncode == 0, r.stderr
    assert f"disk {disk}: a new overlay on {images / 'base.qcow2'}" in r.stdout
    assert backing(disk) == str(images / "base.qcow2")


def test_a_refused_domain_leaves_the_old_disk(images: Path, tmp_path: Path) -> None:
    """libvirt refuses a domain without a name: the new overlay never replaces the old one."""
    disk = used_overlay(images / "base.qcow2", images / "guest.qcow2")
    before, listing = digest(disk), sorted(os.listdir(images))
    r = define(domain(tmp_path, disk, name=""), images / "base.qcow2", "--overwrite-disk")
    assert r.returncode == 4, r.stderr
    assert "refused the domain" in one_error(r)
    assert digest(disk) == before and holds_data(disk)
    assert sorted(os.listdir(images)) == listing


def test_the_base_image_itself_is_never_overwritten(images: Path, tmp_path: Path) -> None:
    base = images / "base.qcow2"
    before = digest(base)
    r = define(domain(tmp_path, base), base, "--overwrite-disk")
    assert r.returncode == 2 and "the base image itself" in one_error(r)
    assert digest(base) == before


def test_a_link_at_the_path_is_replaced_not_its_target(images: Path, tmp_path: Path) -> None:
    target = used_overlay(images / "base.qcow2", tmp_path / "elsewhere.qcow2")
    before = digest(target)
    disk = images / "guest.qcow2"
    disk.symlink_to(target)
    r = define(domain(tmp_path, disk), images / "base.qcow2", "--overwrite-disk")
    assert r.returncode == 0, r.stderr
    assert not disk.is_symlink() and digest(target) == before


@pytest.mark.parametrize("flag", ["--reuse-disk", "--overwrite-disk"])
def test_disk_flags_go_with_base_image(flag: str, images: Path, tmp_path: Path) -> None:
    xml = domain(tmp_path, images / "guest.qcow2")
    r = run_cli(["vm", "define", str(xml), "--connect", "test:///default", flag])
    assert r.returncode == 2 and "goes with --base-image" in one_error(r)
    assert not (images / "guest.qcow2").exists()


def test_both_disk_flags_are_refused(images: Path, tmp_path: Path) -> None:
    r = define(
        domain(tmp_path, images / "g.qcow2"),
        images / "base.qcow2",
        "--reuse-disk",
        "--overwrite-disk",
    )
    assert r.returncode == 2 and "not allowed with argument" in r.stderr


# -- the VM module: the same choice as existing_disk ----------------------------------


@pytest.fixture(scope="module")
def hgx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fakehost.build(fakehost.load("hgx-h100"), tmp_path_factory.mktemp("hgx") / "root")


def module(hgx: Path, images: Path, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return _run_module(
        tmp_path,
        root=str(hgx),
        uri="test:///default",
        name="modguest",
        gpus=["0000:18:00.0"],
        require_handed_over=False,
        base_image=str(images / "base.qcow2"),
        image_dir=str(images),
        virt_type="qemu",
        state="defined",
        **extra,
    )


def test_module_refuses_reuses_or_overwrites_as_told(
    hgx: Path, images: Path, tmp_path: Path
) -> None:
    """After ``state: absent`` the guest's overlay stays behind; defining again reaches it."""
    disk = used_overlay(images / "base.qcow2", images / "modguest.qcow2")
    before = digest(disk)
    predicted = module(hgx, images, tmp_path, _ansible_check_mode=True)
    assert predicted.get("failed") and "existing_disk" in predicted["msg"], predicted
    predicted = module(hgx, images, tmp_path, _ansible_check_mode=True, existing_disk="overwrite")
    assert predicted["changed"] and predicted["disk"]["action"] == "overwritten", predicted
    assert digest(disk) == before and holds_data(disk)  # check mode: nothing done
    refused = module(hgx, images, tmp_path)
    assert refused.get("failed"), refused
    assert str(disk) in refused["msg"] and "existing_disk" in refused["msg"]
    assert digest(disk) == before
    reused = module(hgx, images, tmp_path, existing_disk="reuse")
    assert not reused.get("failed"), reused
    assert reused["changed"] and reused["disk"]["action"] == "reused"
    assert digest(disk) == before and holds_data(disk)
    overwritten = module(hgx, images, tmp_path, existing_disk="overwrite")
    assert not overwritten.get("failed"), overwritten
    assert overwritten["disk"]["action"] == "overwritten" and not holds_data(disk)
    assert sorted(os.listdir(images)) == ["base.qcow2", "modguest.qcow2"]
