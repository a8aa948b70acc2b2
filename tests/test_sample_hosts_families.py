# SPDX-License-Identifier: Apache-2.0
"""The sample hosts of the other boot families, through the CLI as a user meets them:
``sample build``, ``plan``, ``apply``, ``undo`` (each in a process of its own, run_cli).

- ``arch-grub-desktop``: upstream GRUB. Its ``/usr/sbin/grub-mkconfig`` is replaced by the
  real one of this machine made upstream's (Debian's script without its grub.d loop, as
  tests/test_boot_families.py makes it), so discovery reads the real script; the kernel
  line is what a real ``bash`` gets by sourcing what that script sources.
- ``opensuse-tumbleweed-apu``: the same script as ``grub2-mkconfig``, /boot/grub2.
- ``arch-systemd-boot-entries``: hand-written loader entries for two kernels.
- ``nixos-desktop``: refused with the configuration.nix lines, nothing written.

The samples are sample trees: apply lists the regeneration commands (no full OS to chroot
into), so what the next boot gets is judged from the files here.
"""

from __future__ import annotations

import json
from pathlib import Path

from passthrough.boot.grub import MARKER

from .cli_process import run_cli
from .test_apply import changed, snapshot_tree
from .test_boot_families import _script, kernel_line, upstream_text


def sample(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    out = run_cli(["sample", "build", name, str(root)])
    assert out.returncode == 0, out.stderr
    return root


def plan(root: Path) -> dict:  # type: ignore[type-arg]
    out = run_cli(["plan", "--root", str(root), "--json"])
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def apply_cli(root: Path) -> None:
    out = run_cli(["apply", "--root", str(root), "--yes"])
    assert out.returncode == 0, out.stderr


def undo(root: Path) -> None:
    out = run_cli(["undo", "--root", str(root), "--yes"])
    assert out.returncode == 0, out.stderr


def test_every_family_sample_is_listed() -> None:
    out = run_cli(["sample", "list", "--json"])
    assert out.returncode == 0, out.stderr
    names = out.stdout
    for name in (
        "arch-grub-desktop",
        "arch-systemd-boot-entries",
        "opensuse-tumbleweed-apu",
        "nixos-desktop",
    ):
        assert f'"{name}"' in names


def _upstream_grub(tmp_path: Path, name: str, script: str, ours: list[str]) -> None:
    root = sample(tmp_path, name)
    _script(root, upstream_text(), script)  # the real script, upstream's reading
    main = root / "etc/default/grub"
    original = main.read_bytes()
    before = snapshot_tree(root)
    got = plan(root)
    assert got["bootloader"] == "grub"
    assert [a["path"] for a in got["actions"] if a["kind"] == "write"][-1] == "/etc/default/grub"
    cfg = "/boot/grub2/grub.cfg" if script == "grub2-mkconfig" else "/boot/grub/grub.cfg"
    assert [script, "-o", cfg] in [a.get("argv") for a in got["actions"]]
    assert not any("grub.d" in a.get("path", "") for a in got["actions"])
    apply_cli(root)
    lines = main.read_text().splitlines()
    assert lines[-2] == MARKER and all(arg in lines[-1] for arg in ours)
    assert not (root / "etc/default/grub.d").exists()  # nothing that nothing reads
    line = kernel_line(root, dropins=False)
    assert [a for a in line if a in ours] == ours, line
    undo(root)
    assert main.read_bytes() == original  # byte for byte
    assert changed(before, snapshot_tree(root)) == []


def test_arch_upstream_grub_gets_marked_lines_in_default_grub(tmp_path: Path) -> None:
    _upstream_grub(
        tmp_path,
        "arch-grub-desktop",
        "grub-mkconfig",
        ["iommu=pt", "vfio-pci.ids=10de:2684,10de:22ba"],
    )


def test_opensuse_runs_grub2_mkconfig_on_default_grub(tmp_path: Path) -> None:
    _upstream_grub(
        tmp_path,
        "opensuse-tumbleweed-apu",
        "grub2-mkconfig",
        ["iommu=pt", "vfio-pci.ids=10de:2504,10de:228e", "rd.driver.pre=vfio-pci"],
    )


def test_arch_systemd_boot_every_entry_default_first(tmp_path: Path) -> None:
    root = sample(tmp_path, "arch-systemd-boot-entries")
    entries = root / "boot/loader/entries"
    assert "default arch.conf" in (root / "boot/loader/loader.conf").read_text()
    assert not (root / "etc/kernel/cmdline").exists()
    before = snapshot_tree(root)
    got = plan(root)
    written = [
        a["path"]
        for a in got["actions"]
        if a["kind"] == "write" and a["path"].startswith("/boot/loader/entries/")
    ]
    assert written[0] == "/boot/loader/entries/arch.conf"
    assert sorted(written) == sorted("/boot/loader/entries/" + p.name for p in entries.iterdir())
    assert len(written) == 4  # linux and linux-lts, each with its fallback
    apply_cli(root)
    ours = "iommu=pt vfio-pci.ids=10de:1e87,10de:10f8,10de:1ad8,10de:1ad9"
    for entry in entries.iterdir():
        (options,) = [ln for ln in entry.read_text().splitlines() if ln.startswith("options")]
        assert options.endswith(ours), (entry.name, options)
    undo(root)
    assert changed(before, snapshot_tree(root)) == []


def test_nixos_refuses_with_configuration_lines_and_writes_nothing(tmp_path: Path) -> None:
    root = sample(tmp_path, "nixos-desktop")
    before = snapshot_tree(root)
    for command in (["plan"], ["apply", "--yes"]):
        out = run_cli([*command, "--root", str(root)])
        assert out.returncode == 2, out.stderr
        lines = out.stderr.splitlines()
        assert lines[0].startswith("passthrough: error: NixOS generates /etc")
        assert "/etc/nixos/configuration.nix" in lines[0]
        assert lines[1] == (
            '  boot.kernelParams = [ "iommu=pt" "vfio-pci.ids=10de:2684,10de:22ba" ];'
        )
        assert lines[2] == '  boot.initrd.kernelModules = [ "vfio_pci" "vfio" "vfio_iommu_type1" ];'
        assert "    options vfio-pci ids=10de:2684,10de:22ba" in lines
        assert out.stdout == ""
    assert changed(before, snapshot_tree(root)) == []
