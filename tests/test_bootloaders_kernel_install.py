# SPDX-License-Identifier: Apache-2.0
"""The kernel-install command systemd-boot's plan runs: the kernel image and the initramfs
where the distribution really keeps them (the lab's Debian + systemd-boot boot found the
path the plan used missing there, and an entry given no initramfs does not boot)."""

from __future__ import annotations

from pathlib import Path

from passthrough import fakehost
from passthrough.host.discover import discover
from passthrough.host.root import HostRoot
from passthrough.model import BootloaderKind
from passthrough.plan.build import PlanOptions, make_plan


def _kernel_install(path: Path) -> list[str]:
    host = discover(str(path))
    assert host.boot.bootloader is BootloaderKind.SYSTEMD_BOOT
    plan, _ = make_plan(HostRoot(str(path)), host, PlanOptions())
    data = plan.to_json(HostRoot(str(path)))
    runs = [a["argv"] for a in data["actions"] if a.get("argv", [""])[0] == "kernel-install"]
    assert len(runs) == 1, data["actions"]
    argv: list[str] = runs[0]
    return argv


NAMES = ("vmlinuz", "initrd.img")


def _host(tmp_path: Path, *files: str) -> tuple[Path, str]:
    """A Debian host on systemd-boot with ``files`` (``{}`` the running release)."""
    desc = fakehost.load("consumer-intel")
    boot = {"bootloader": "systemd-boot", "initramfs": "initramfs-tools"}
    path = fakehost.build(
        fakehost.Description({**desc.data, "boot": boot}, "consumer-intel"), tmp_path / "root"
    )
    release = discover(str(path)).kernel.release
    for name in files:
        (path / name.format(release)).parent.mkdir(parents=True, exist_ok=True)
        (path / name.format(release)).write_bytes(b"made up")
    return path, release


def test_debian_kernel_and_initramfs_in_boot(tmp_path: Path) -> None:
    """Debian 12: /boot/vmlinuz-R and /boot/initrd.img-R, no /usr/lib/modules/R/vmlinuz."""
    path, release = _host(tmp_path, "boot/vmlinuz-{}", "boot/initrd.img-{}")
    argv = _kernel_install(path)
    assert argv == ["kernel-install", "add", release, *(f"/boot/{n}-{release}" for n in NAMES)]


def test_kernel_in_usr_lib_modules_leaves_the_initramfs_to_the_plugins(tmp_path: Path) -> None:
    """Arch and Fedora: the image in /usr/lib/modules, kernel-install's plugins make the
    initramfs (a stale /boot image beside it is not passed)."""
    path, release = _host(
        tmp_path, "usr/lib/modules/{}/vmlinuz", "boot/vmlinuz-{}", "boot/initrd.img-{}"
    )
    argv = _kernel_install(path)
    assert argv == ["kernel-install", "add", release, f"/usr/lib/modules/{release}/vmlinuz"]


def test_debian_kernel_without_an_initramfs(tmp_path: Path) -> None:
    path, release = _host(tmp_path, "boot/vmlinuz-{}")
    assert _kernel_install(path)[3:] == [f"/boot/vmlinuz-{release}"]
