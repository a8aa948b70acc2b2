# SPDX-License-Identifier: Apache-2.0
"""apply / undo on a real debootstrapped Debian 12 tree: the real update-grub and
update-initramfs run through chroot (in a private mount namespace).

The tree is cached outside the repository (PASSTHROUGH_TEST_CACHE, default
/var/cache/passthrough-test) and rebuilt when its recipe changes. The host facts
(sysfs, /proc) of a sample host are laid over it, so the planner sees a GPU.

Between apply and undo a second kernel package is installed: undo must regenerate grub.cfg
and every initramfs for the kernels installed then, never put back the pre-apply bytes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from passthrough import fakehost
from passthrough.cli import main
from passthrough.journal.sandbox import chroot_argv

from .conftest import CACHE
from .conftest import run_ok as _run

# the debootstrap tier: minutes on a cold cache (docs/testing.md: the fast loop skips it)
pytestmark = pytest.mark.slow


def _files(root: Path, top: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, _dirs, files in os.walk(root / top):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


def _initrd(root: Path, release: str) -> str:
    return _run(chroot_argv(str(root), ("lsinitramfs", f"/boot/initrd.img-{release}"))).stdout


def _second_kernel(root: Path, release: str) -> str:
    """Install Debian's cloud flavour of the same kernel ABI: a second kernel package, with
    its maintainer scripts run in the tree (the initramfs hook builds its image with the
    configuration apply left). The .deb is fetched from the mirror once and cached."""
    new = release.replace("-amd64", "-cloud-amd64")
    package = f"linux-image-{new}"
    debs = CACHE / "debs"
    cached = sorted(debs.glob(f"{package}_*.deb"))
    if not cached:
        debs.mkdir(parents=True, exist_ok=True)
        # apt drops to its _apt user to fetch; the tree's user namespace maps one user (root)
        # only, where setgroups and seteuid to _apt fail: fetch as root there
        apt = "apt-get -q -o APT::Sandbox::User=root"
        _run(chroot_argv(str(root), ("sh", "-c", f"{apt} update")))
        _run(chroot_argv(str(root), ("sh", "-c", f"cd /tmp && {apt} download {package}")))
        for deb in (root / "tmp").glob(f"{package}_*.deb"):
            shutil.copy(deb, debs / deb.name)
        cached = sorted(debs.glob(f"{package}_*.deb"))
    assert cached, f"could not fetch {package}"
    shutil.copy(cached[-1], root / "tmp" / cached[-1].name)
    # its postinst runs update-grub through /etc/kernel/postinst.d: grub's sandbox
    _run(chroot_argv(str(root), ("dpkg", "-i", f"/tmp/{cached[-1].name}"), "grub"))
    (root / "tmp" / cached[-1].name).unlink()
    # what the kernel's postinst does through grub's hook on an installed system
    _run(chroot_argv(str(root), ("update-grub",)))
    return new


def test_apply_and_undo_on_a_debootstrapped_debian(debian_tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "debian"
    _run(["cp", "-a", str(debian_tree), str(root)])
    release = next(p.name[len("vmlinuz-") :] for p in (root / "boot").glob("vmlinuz-*"))
    desc = fakehost.load("consumer-intel")
    data = {
        **desc.data,
        "kernel": {
            "release": release,
            "cmdline": f"BOOT_IMAGE=/boot/vmlinuz-{release} root=/dev/vda ro quiet",
        },
    }
    facts = fakehost.build(fakehost.Description(data, "consumer-intel"), tmp_path / "facts")
    for part in ("sys", "proc"):
        shutil.rmtree(root / part, ignore_errors=True)
        shutil.copytree(facts / part, root / part, symlinks=True)
    (root / "dev/kvm").write_bytes(b"")
    before = {**_files(root, "etc"), **_files(root, "boot")}
    assert "vfio-pci.ko" not in _initrd(root, release)  # so "no vfio" after undo means something

    assert main(["apply", "--root", str(root)]) == 0
    grub_cfg = (root / "boot/grub/grub.cfg").read_text()
    # Debian's kernel enables the Intel IOMMU by default (except for an iGPU): no intel_iommu=on
    assert (
        f"/boot/vmlinuz-{release} root=/dev/vda ro  quiet iommu=pt vfio-pci.ids=10de:2684,10de:22ba"
        in grub_cfg
    )
    assert "intel_iommu" not in grub_cfg
    listing = _run(chroot_argv(str(root), ("lsinitramfs", f"/boot/initrd.img-{release}"))).stdout
    assert "kernel/drivers/vfio/pci/vfio-pci.ko" in listing
    assert "etc/modprobe.d/passthrough-vfio.conf" in listing
    conf = (root / "etc/modprobe.d/passthrough-vfio.conf").read_text()
    # derived from the real modules.alias of Debian's kernel
    assert "softdep nouveau pre: vfio-pci" in conf and "softdep snd_hda_intel pre: vfio-pci" in conf

    after_apply = {**_files(root, "etc"), **_files(root, "boot")}
    assert main(["apply", "--root", str(root)]) == 0  # a second apply is a no-op
    assert {**_files(root, "etc"), **_files(root, "boot")} == after_apply
    by_apply = sorted(
        k for k in after_apply if k.startswith("etc/") and before.get(k) != after_apply[k]
    )
    assert by_apply, "apply changed nothing under /etc"

    # a kernel update between apply and undo: a second kernel, its initramfs built with vfio
    new = _second_kernel(root, release)
    assert f"/boot/vmlinuz-{new}" in (root / "boot/grub/grub.cfg").read_text()
    assert "kernel/drivers/vfio/pci/vfio-pci.ko" in _initrd(root, new)
    after_kernel = _files(root, "etc")

    assert main(["undo", "--root", str(root)]) == 0
    # grub.cfg is regenerated, not restored: both kernels keep their entries
    grub_cfg = (root / "boot/grub/grub.cfg").read_text()
    for k in (release, new):
        assert f"/boot/vmlinuz-{k} root=/dev/vda ro  quiet" in grub_cfg, k
    assert "vfio" not in grub_cfg
    # both images rebuilt without vfio (update-initramfs -u -k all ran again)
    for k in (release, new):
        listing = _initrd(root, k)
        assert "vfio-pci.ko" not in listing and "passthrough-vfio.conf" not in listing, k
    now = _files(root, "etc")
    assert [k for k in by_apply if now.get(k) != before.get(k)] == []
    # and nothing else under /etc moved but what the kernel package itself installed
    moved = sorted(
        k for k in set(before) | set(now) if k.startswith("etc/") and before.get(k) != now.get(k)
    )
    assert all(after_kernel.get(k) != after_apply.get(k) for k in moved), moved
