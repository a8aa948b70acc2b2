"""The lab host image: Debian 12 from Debian's packages only, cached outside the repository
and rebuilt when its recipe changes.

A real Debian userland with systemd, sshd and python3 on an ext4 image made straight from
the directory (``mkfs.ext4 -d``: no loop devices, no mounts). The kernel and initramfs
come from the image's own ``linux-image-amd64``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

CACHE = Path(os.environ.get("PASSTHROUGH_LAB_CACHE", "/var/cache/passthrough-lab"))
MIRROR = os.environ.get("PASSTHROUGH_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = (
    "linux-image-amd64,systemd-sysv,udev,kmod,initramfs-tools,openssh-server,python3,"
    "pciutils,iproute2,ca-certificates"
)
NETWORK = "[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n"
RECIPE = f"debootstrap --variant=minbase --include={PACKAGES} bookworm {MIRROR}\n{NETWORK}\nrev 1"


def _run(argv: list[str], timeout: int = 1800) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}…: {r.stderr.strip()[-1500:]}")
    return r.stdout


def tree() -> Path:
    """The debootstrapped tree (cached)."""
    path = CACHE / f"tree-{hashlib.sha256(RECIPE.encode()).hexdigest()[:12]}"
    if (path / ".complete").exists():
        return path
    tmp = path.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    _run(
        ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm", str(tmp), MIRROR]
    )
    (tmp / "etc/hostname").write_text("lab-host\n")
    (tmp / "etc/fstab").write_text("/dev/vda / ext4 defaults,errors=remount-ro 0 1\n")
    (tmp / "etc/systemd/network").mkdir(parents=True, exist_ok=True)
    (tmp / "etc/systemd/network/20-wired.network").write_text(NETWORK)
    wants = tmp / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "systemd-networkd.service"
    if not link.exists():
        link.symlink_to("/lib/systemd/system/systemd-networkd.service")
    (tmp / ".complete").write_text(RECIPE + "\n")
    tmp.rename(path)
    return path


def image(work: Path, public_key: str, size: str = "3G") -> tuple[Path, Path, Path]:
    """An ext4 image of the tree with ``public_key`` for root; returns (image, kernel, initrd)."""
    src = tree()
    work.mkdir(parents=True, exist_ok=True)
    staging = work / "root"
    shutil.rmtree(staging, ignore_errors=True)
    _run(["cp", "-a", str(src), str(staging)])
    (staging / ".complete").unlink()
    ssh = staging / "root/.ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh / "authorized_keys").write_text(public_key.strip() + "\n")
    (ssh / "authorized_keys").chmod(0o600)
    img = work / "lab.img"
    img.unlink(missing_ok=True)
    _run(["mkfs.ext4", "-q", "-F", "-L", "labroot", "-d", str(staging), str(img), size])
    kernel = sorted(src.glob("boot/vmlinuz-*"))[-1]
    initrd = sorted(src.glob("boot/initrd.img-*"))[-1]
    shutil.rmtree(staging)
    return img, kernel, initrd
