"""Preflight: processes holding a card's device nodes, in check and bind (sample trees)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from passthrough.cli import main
from passthrough.host.holders import Holder, find_holders
from passthrough.host.root import HostRoot

CARD = "0000:01:00.0"


def _held(hosts: dict[str, Path], tmp_path: Path) -> Path:
    """consumer-intel with nvidia-persistenced (a service) holding /dev/nvidia0 and a loose
    CUDA job holding the card's render node; another process holds an unrelated file."""
    root = tmp_path / "root"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    info = root / "proc/driver/nvidia/gpus" / CARD
    info.mkdir(parents=True)
    (info / "information").write_text("Model: \t\t NVIDIA GeForce\nDevice Minor: \t 0\n")
    drm = root / "sys/bus/pci/devices" / CARD / "drm"
    drm.mkdir(parents=True, exist_ok=True)
    (drm / "card1").mkdir()
    (drm / "renderD128").mkdir()
    for pid, comm, cgroup, targets in (
        (
            812,
            "nvidia-persist",
            "0::/system.slice/nvidia-persistenced.service\n",
            ["/dev/nvidia0", "/dev/nvidiactl"],
        ),
        (
            4242,
            "python3",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            ["/dev/dri/renderD128"],
        ),
        (99, "bash", "0::/user.slice\n", ["/dev/null", "/dev/nvidia1"]),
    ):
        proc = root / "proc" / str(pid)
        (proc / "fd").mkdir(parents=True)
        (proc / "comm").write_text(comm + "\n")
        (proc / "cgroup").write_text(cgroup)
        for n, target in enumerate(targets):
            os.symlink(target, proc / "fd" / str(n + 3))
    return root


def test_holders_are_named_with_pid_and_unit(hosts: dict[str, Path], tmp_path: Path) -> None:
    root = _held(hosts, tmp_path)
    found = find_holders(HostRoot(str(root)), [CARD, "0000:01:00.1"])
    assert found == {
        CARD: [
            Holder(812, "nvidia-persist", "nvidia-persistenced.service", "/dev/nvidia0"),
            Holder(4242, "python3", None, "/dev/dri/renderD128"),
        ]
    }


def test_no_holders_on_an_untouched_sample(hosts: dict[str, Path]) -> None:
    assert find_holders(HostRoot(str(hosts["consumer-intel"])), [CARD]) == {}


def test_check_reports_a_held_card_with_the_fix(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _held(hosts, tmp_path)
    main(["check", "--root", str(root), "--json"])
    data = json.loads(capsys.readouterr().out)
    checks = data["checks"]
    held = [c for c in checks if c["id"] == "gpu-held"]
    assert len(held) == 1, held
    assert held[0]["level"] == "WARN"
    assert (
        "nvidia-persist (pid 812, unit nvidia-persistenced.service) holds /dev/nvidia0"
        in (held[0]["summary"])
    )
    assert "systemctl stop nvidia-persistenced.service" in held[0]["fix"]
    assert "end python3 (pid 4242)" in held[0]["fix"]


def test_check_has_no_held_finding_without_holders(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    main(["check", "--root", str(hosts["consumer-intel"]), "--json"])
    assert '"gpu-held"' not in capsys.readouterr().out


def test_bind_refuses_a_held_card_naming_the_holders(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _held(hosts, tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    assert main(["bind", "--root", str(root), "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{CARD}: held open, an unbind would hang" in err
    assert "nvidia-persist (pid 812, unit nvidia-persistenced.service)" in err
    assert "python3 (pid 4242)" in err
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    assert after == before
