# SPDX-License-Identifier: Apache-2.0
"""snapshot → scan --root <snapshot> gives the same report as scanning the source."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from passthrough import fakehost

from .cli_process import run_cli

PT = [sys.executable, "-m", "passthrough"]


def _scan(root: str) -> dict[str, Any]:
    r = run_cli(["scan", "--root", root, "--json"])
    assert r.returncode == 0, r.stderr
    data: dict[str, Any] = json.loads(r.stdout)
    data.pop("root")
    return data


def _snapshot(root: str, out: Path) -> None:
    r = run_cli(["snapshot", "--root", root, "-o", str(out)])
    assert r.returncode == 0, r.stderr
    assert out.exists()


def test_live_host_equals_its_own_snapshot(tmp_path: Path) -> None:
    """The machine running the tests, scanned live (pyudev) and from its snapshot."""
    archive = tmp_path / "live.tar.gz"
    _snapshot("/", archive)
    live = _scan("/")
    snap = _scan(str(archive))
    # Reading as a user that cannot open some files records "permission denied"; the
    # snapshot carries those lines in its metadata file instead.
    live.pop("problems")
    snap.pop("problems")
    assert live == snap
    assert live["host"]["pci_functions"] > 0


@pytest.mark.parametrize("name", fakehost.sample_names())
def test_fixture_equals_its_snapshot(name: str, hosts: dict[str, Path], tmp_path: Path) -> None:
    archive = tmp_path / f"{name}.tar.gz"
    _snapshot(str(hosts[name]), archive)
    assert _scan(str(hosts[name])) == _scan(str(archive))


def test_snapshot_holds_no_config_space_and_no_full_pci_ids(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    archive = tmp_path / "s.tar.gz"
    _snapshot(str(hosts["hgx-h100"]), archive)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        ids = tar.extractfile("usr/share/misc/pci.ids")
        assert ids is not None
        text = ids.read().decode()
    assert not any(n.endswith("/config") for n in names)
    assert "GH100 [H100 SXM5 80GB]" in text and len(text) < 20_000
    assert "passthrough-snapshot.json" in names
    assert any(n.startswith("sys/kernel/iommu_groups/") for n in names)


def test_unsafe_archive_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../escape")
        tar.addfile(info)
    r = run_cli(["scan", "--root", str(evil)])
    assert r.returncode == 2 and "unsafe member" in r.stderr
    assert not (tmp_path.parent / "escape").exists()


def test_snapshot_into_missing_directory_fails_cleanly(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    r = run_cli(
        [
            "snapshot",
            "--root",
            str(hosts["consumer-intel"]),
            "-o",
            str(tmp_path / "no/such/x.tar.gz"),
        ]
    )
    assert r.returncode == 2 and "no such directory" in r.stderr
    # an existing directory as the output: named as given, no temporary file left behind
    target = tmp_path / "a-directory"
    target.mkdir()
    r = run_cli(["snapshot", "--root", str(hosts["consumer-intel"]), "-o", str(target)])
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"passthrough: error: snapshot: cannot write {target}: Is a directory"
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".snapshot-")]


def test_snapshot_carries_iommufd_nodes(tmp_path: Path) -> None:
    """/dev/iommu, sys/module/iommufd, each vfio-dev/vfioN and /dev/vfio/devices/vfioN
    travel in the archive: the check reads the same from it."""
    from .conftest import build_variant

    root = build_variant(
        tmp_path,
        "acs-override-proxmox",
        kernel={"config": {"CONFIG_IOMMUFD": "m", "CONFIG_VFIO_DEVICE_CDEV": "y"}},
        packages={"qemu-system-x86": "1:10.0.2+ds-1", "libvirt-daemon": "12.1.0-1"},
        iommufd={"dev_iommu": True, "vfio_dev": True},
    )
    archive = tmp_path / "ready.tar.gz"
    _snapshot(str(root), archive)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"dev/iommu", "dev/vfio/devices/vfio0", "dev/vfio/devices/vfio1"} <= names
    assert any(n.endswith("0000:24:00.0/vfio-dev/vfio0") for n in names)
    live, snap = _scan(str(root)), _scan(str(archive))
    assert live == snap
    check = next(c for c in snap["checks"] if c["id"] == "iommufd")
    assert check["level"] == "PASS"
    assert snap["host"]["iommu"]["vfio_cdevs"][1] == {
        "address": "0000:24:00.1",
        "name": "vfio1",
        "dev_node": True,
    }
