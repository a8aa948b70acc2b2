# SPDX-License-Identifier: Apache-2.0
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
from collections.abc import Callable
from pathlib import Path

CACHE = Path(os.environ.get("PASSTHROUGH_LAB_CACHE", "/var/cache/passthrough-lab"))
MIRROR = os.environ.get("PASSTHROUGH_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = (
    "linux-image-amd64,systemd-sysv,udev,kmod,initramfs-tools,openssh-server,python3,"
    "pciutils,iproute2,ca-certificates,grub-efi-amd64-bin,grub2-common,"
    # Ansible logs in as an ordinary user and becomes root through sudo
    "sudo,"
    # the lab host's own libvirt + QEMU + OVMF for a nested guest, and the toolkit's
    # Python dependencies from Debian (the library itself is not in the image: the full
    # chain's host play installs it into a venv that sees these; stage one copies it in)
    "dbus,libpam-systemd,libvirt-daemon-system,libvirt-clients,qemu-system-x86,ovmf,python3-libvirt,"
    "python3-jinja2,python3-lxml,python3-yaml,python3-pyudev,python3-pycdlib,"
    # the nested guest's initramfs: one static shell and its applets
    "busybox-static"
)
NETWORK = "[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n"
# as Debian's installer writes it: sudo resolves the host's own name (without the line it
# warns "unable to resolve host lab-host" on every command)
HOSTS = "127.0.0.1\tlocalhost\n127.0.1.1\tlab-host\n"
# The user Ansible logs in as: no password (key only), root through sudo without one, as a
# cloud image's default user; root's own key stays for the lab's inspection
USER = "lab"
SUDOERS = f"{USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"
# GRUB as Debian's installer leaves it, plus a serial console for the lab's log and
# no_timer_check (as Fedora's and RHEL's cloud images have it): under TCG on a loaded machine the
# kernel's early check that the IO-APIC timer ticks can miss its window, and with interrupt
# remapping on that is a panic ("timer doesn't work through Interrupt-remapped IO-APIC",
# seen on the lab host's reboot at load 6)
GRUB_DEFAULTS = (
    "GRUB_DEFAULT=0\nGRUB_TIMEOUT=0\n"
    "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
    'GRUB_CMDLINE_LINUX="console=ttyS0 no_timer_check"\n'
    "GRUB_TERMINAL=serial\n"
)
RECIPE = (
    f"debootstrap --variant=minbase --include={PACKAGES} bookworm {MIRROR}\n{NETWORK}\n"
    f"useradd {USER}\n{SUDOERS}{HOSTS}{GRUB_DEFAULTS}rev 6"
)
ROOT_FSTAB = "LABEL=labroot / ext4 defaults,errors=remount-ro 0 1\n"
ESP_LABEL = "LABESP"
ROOT_GIB = 3
ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
LINUX_TYPE = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"


def _run(argv: list[str], timeout: int = 1800) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}…: {r.stderr.strip()[-1500:]}")
    return r.stdout


def cached_debootstrap(
    cache: Path,
    prefix: str,
    packages: str,
    recipe: str,
    prepare: Callable[[Path], None],
    suite: str = "bookworm",
) -> Path:
    """A Debian tree (``suite``, Debian 12 by default) debootstrapped once into ``cache``
    and kept under a name derived from ``recipe``, so changing the recipe rebuilds it.
    ``prepare`` finishes the tree before it is marked complete (an interrupted build is
    started over)."""
    path = cache / f"{prefix}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    if (path / ".complete").exists():
        return path
    tmp = path.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    _run(["debootstrap", "--variant=minbase", f"--include={packages}", suite, str(tmp), MIRROR])
    prepare(tmp)
    (tmp / ".complete").write_text(recipe + "\n")
    tmp.rename(path)
    return path


def prepare_base(tmp: Path) -> None:
    """What every lab tree needs to boot and be reached: its name, its root by label,
    DHCP on the wired interface through systemd-networkd."""
    (tmp / "etc/hostname").write_text("lab-host\n")
    (tmp / "etc/fstab").write_text(ROOT_FSTAB)
    (tmp / "etc/systemd/network").mkdir(parents=True, exist_ok=True)
    (tmp / "etc/systemd/network/20-wired.network").write_text(NETWORK)
    wants = tmp / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "systemd-networkd.service"
    if not link.exists():
        link.symlink_to("/lib/systemd/system/systemd-networkd.service")


def _prepare_lab(tmp: Path) -> None:
    prepare_base(tmp)
    (tmp / "etc/hosts").write_text(HOSTS)
    (tmp / "etc/default/grub").write_text(GRUB_DEFAULTS)
    # '*': no password can match, yet the account is not locked (sshd accepts its key)
    _run(["chroot", str(tmp), "useradd", "--create-home", "--shell", "/bin/bash", "-p", "*", USER])
    sudoers = tmp / f"etc/sudoers.d/{USER}"
    sudoers.write_text(SUDOERS)
    sudoers.chmod(0o440)


def tree() -> Path:
    """The lab host's debootstrapped tree (cached)."""
    return cached_debootstrap(CACHE, "tree", PACKAGES, RECIPE, _prepare_lab)


def _authorize(staging: Path, user: str, public_key: str) -> None:
    """``public_key`` in ``user``'s authorized_keys, owned by them (the tree's own uid/gid:
    mkfs.ext4 -d keeps owners as they are)."""
    entry = next(
        line.split(":")
        for line in (staging / "etc/passwd").read_text().splitlines()
        if line.split(":", 1)[0] == user
    )
    uid, gid, home = int(entry[2]), int(entry[3]), entry[5]
    ssh = staging / home.lstrip("/") / ".ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys = ssh / "authorized_keys"
    keys.write_text(public_key.strip() + "\n")
    keys.chmod(0o600)
    for path in (ssh, keys):
        os.chown(path, uid, gid)


def _staging(
    src: Path, work: Path, public_key: str, users: tuple[str, ...] = ("root", USER)
) -> Path:
    """A private copy of the cached tree that ``users`` (root and the lab user) log into
    with ``public_key``."""
    work.mkdir(parents=True, exist_ok=True)
    staging = work / "root"
    shutil.rmtree(staging, ignore_errors=True)
    _run(["cp", "-a", str(src), str(staging)])
    (staging / ".complete").unlink()
    for user in users:
        _authorize(staging, user, public_key)
    return staging


def image(work: Path, public_key: str, size: str = "3G") -> tuple[Path, Path, Path]:
    """An ext4 image of the tree with ``public_key`` for root and the lab user; returns
    (image, kernel, initrd)."""
    src = tree()
    staging = _staging(src, work, public_key)
    img = work / "lab.img"
    img.unlink(missing_ok=True)
    _run(["mkfs.ext4", "-q", "-F", "-L", "labroot", "-d", str(staging), str(img), size])
    kernel = sorted(src.glob("boot/vmlinuz-*"))[-1]
    initrd = sorted(src.glob("boot/initrd.img-*"))[-1]
    shutil.rmtree(staging)
    return img, kernel, initrd


def modules_dep(staging: Path) -> None:
    """initramfs for this machine's own hardware: update-initramfs under TCG takes minutes
    with Debian's default MODULES=most; the lab tests that it runs, not how much it packs."""
    (staging / "etc/initramfs-tools/conf.d/lab.conf").write_text("MODULES=dep\n")


def release_of(tree: Path) -> str:
    """The newest kernel release installed in ``tree``."""
    return sorted(p.name[len("vmlinuz-") :] for p in (tree / "boot").glob("vmlinuz-*"))[-1]


def grub_esp(staging: Path, work: Path) -> Path:
    """An ESP tree holding a standalone GRUB that reads /boot/grub/grub.cfg from the root
    partition, so what update-grub writes there is what the next boot uses; and the first
    boot's grub.cfg."""
    release = release_of(staging)
    (staging / "boot/grub").mkdir(parents=True, exist_ok=True)
    # the first boot's menu; update-grub inside the lab replaces it
    (staging / "boot/grub/grub.cfg").write_text(
        "set timeout=0\nserial --unit=0 --speed=115200\nterminal_output serial\n"
        "menuentry 'Debian (lab first boot)' {\n  search --no-floppy --label labroot --set=root\n"
        f"  linux /boot/vmlinuz-{release} root=LABEL=labroot ro console=ttyS0 no_timer_check quiet\n"
        f"  initrd /boot/initrd.img-{release}\n}}\n"
    )
    early = work / "early.cfg"
    early.write_text(
        # modules come from the image's own memdisk ($prefix stays there); the menu from the disk
        "insmod part_gpt\ninsmod ext2\ninsmod configfile\ninsmod normal\ninsmod linux\n"
        "search --no-floppy --label labroot --set=root\nconfigfile ($root)/boot/grub/grub.cfg\n"
    )
    esp = work / "esp"
    shutil.rmtree(esp, ignore_errors=True)
    (esp / "EFI/BOOT").mkdir(parents=True)
    _run(
        [
            "grub-mkstandalone",
            "-O",
            "x86_64-efi",
            "-o",
            str(esp / "EFI/BOOT/BOOTX64.EFI"),
            f"boot/grub/grub.cfg={early}",
        ]
    )
    return esp


def disk(
    work: Path,
    public_key: str,
    src: Path | None = None,
    tune: Callable[[Path], None] = modules_dep,
    esp_tree: Callable[[Path, Path], Path] = grub_esp,
    esp_mib: int = 64,
    users: tuple[str, ...] = ("root", USER),
) -> Path:
    """A GPT disk that boots through OVMF: an ESP (its files from ``esp_tree``, which may
    take them out of the staged root) and the root partition, ``src`` (the lab tree by
    default) as ``tune`` leaves it. By default the ESP holds a standalone GRUB reading
    /boot/grub/grub.cfg from the root, as on a physical host."""
    staging = _staging(src or tree(), work, public_key, users)
    tune(staging)
    esp_dir = esp_tree(staging, work)
    esp = work / "esp.img"
    esp.unlink(missing_ok=True)
    _run(["mkfs.vfat", "-n", ESP_LABEL, "-C", str(esp), str(esp_mib * 1024)])
    _run(["mcopy", "-s", "-i", str(esp), *map(str, sorted(esp_dir.iterdir())), "::/"])
    shutil.rmtree(esp_dir)
    out = work / "disk.img"
    out.unlink(missing_ok=True)
    esp_start, esp_sectors = 2048, esp_mib * 2048
    root_start = esp_start + esp_sectors
    root_sectors = ROOT_GIB << 21
    with open(out, "wb") as fh:
        fh.truncate((root_start + root_sectors + 2048) * 512)
    layout = (
        "label: gpt\n"
        f"start={esp_start}, size={esp_sectors}, type={ESP_TYPE}\n"
        f"start={root_start}, size={root_sectors}, type={LINUX_TYPE}\n"
    )
    r = subprocess.run(
        ["sfdisk", "-q", str(out)], input=layout, capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        raise RuntimeError(f"sfdisk: {r.stderr.strip()}")
    _run(
        [
            "dd",
            f"if={esp}",
            f"of={out}",
            "bs=512",
            f"seek={esp_start}",
            "conv=notrunc,sparse",
            "status=none",
        ]
    )
    # the root file system made in place, at its partition's offset (no copy of it)
    _run(
        [
            "mkfs.ext4",
            "-q",
            "-F",
            "-L",
            "labroot",
            "-E",
            f"offset={root_start * 512}",
            "-d",
            str(staging),
            str(out),
            f"{ROOT_GIB}G",
        ]
    )
    shutil.rmtree(staging)
    esp.unlink()
    return out
