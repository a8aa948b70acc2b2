"""apply / undo on a real debootstrapped Debian 12 tree: the real update-grub and
update-initramfs run through chroot (in a private mount namespace).

The tree is cached outside the repository (PASSTHROUGH_TEST_CACHE, default
/var/cache/passthrough-test) and rebuilt when its recipe changes. The host facts
(sysfs, /proc) of a sample host are laid over it, so the planner sees a GPU.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from passthrough import fakehost
from passthrough.apply import chroot_argv
from passthrough.cli import main

from .conftest import run_ok as _run

# the debootstrap tier: minutes on a cold cache (README "Tests": the fast loop skips it)
pytestmark = pytest.mark.slow


def _files(root: Path, top: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, _dirs, files in os.walk(root / top):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


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

    assert main(["undo", "--root", str(root)]) == 0
    now = {**_files(root, "etc"), **_files(root, "boot")}
    differ = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    assert differ == [], differ
