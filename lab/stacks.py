# SPDX-License-Identifier: Apache-2.0
"""Two more boot stacks on a real boot, both from Debian 12's archive:

  dracut        Debian + dracut as the initramfs tool, GRUB as the bootloader
  systemd-boot  Debian + systemd-boot (kernel-install, /etc/kernel/cmdline, BLS entries on
                the ESP), initramfs-tools

    python lab/stacks.py STACK [--keep WORKDIR] [--artifacts DIR] [--json]

Each stack's image is lean: Debian minbase with the kernel, systemd, sshd, python3 and the
toolkit's Python dependencies, and only that stack's boot tools (cached, rebuilt when its
recipe changes). The stages, each timed:
  image   the stack's cached tree → a GPT disk (ESP + root) that boots through OVMF
  boot    UEFI boot, SSH as root, the toolkit copied in (as lab/run.py's stage one)
  apply   `passthrough plan` then `apply --yes` with the card by address: the stack's own
          regeneration (dracut / update-initramfs, update-grub / kernel-install) inside
  reboot  our arguments in /proc/cmdline, vfio-pci in the initramfs listing, both functions
          of the card on vfio-pci right after boot, `passthrough verify` passes
  undo    `undo --yes`: /etc byte-identical for every file apply touched, our files out of
          the initramfs and our arguments out of the boot entry
  clean   after a reboot: our arguments gone, the card's own drivers back
On failure the console log and every command's output stay in the artifacts directory.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import image
from labcore import CARD, CARD_FUNCTIONS, LabFailed
from run import Lab, lab_main, parser

# What `passthrough plan/apply/verify/undo` needs on a Debian host, nothing of the lab's
# libvirt or QEMU: the kernel, systemd, sshd for the lab to reach it, and the toolkit's
# Python dependencies from Debian (the library is put on the path, as pip would)
BASE = (
    "systemd-sysv,udev,kmod,openssh-server,python3,sudo,pciutils,iproute2,"
    "python3-yaml,python3-jinja2,python3-pyudev"
)
ESP_FSTAB = f"LABEL={image.ESP_LABEL} /boot/efi vfat umask=0077 0 2\n"
# no_timer_check as the GRUB images have it (image.GRUB_DEFAULTS: a loaded TCG boot once
# panicked on the IO-APIC timer check)
KERNEL_CMDLINE = "root=LABEL=labroot ro console=ttyS0 no_timer_check quiet\n"
# A fixed machine ID: kernel-install names the loader entry and its folder on the ESP after
# it, and a first boot that made up a new one would write where systemd-boot never looks
MACHINE_ID = "5ab1ab0a7f3e4c1b9d2e6f8a0b1c2d3e\n"


@contextlib.contextmanager
def _mounted(what: list[str], where: Path) -> Iterator[None]:
    subprocess.run(["mount", *what, str(where)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _proc(tree: Path) -> contextlib.AbstractContextManager[None]:
    """/proc in the chroot while Debian's package scripts run (dracut and kernel-install
    read it)."""
    return _mounted(["-t", "proc", "proc"], tree / "proc")


def _chroot(tree: Path, *argv: str) -> str:
    env = "DEBIAN_FRONTEND=noninteractive"
    return image._run(["chroot", str(tree), "env", env, *argv])


def _prepare_dracut(tmp: Path) -> None:
    """Debian's kernel wants `initramfs-tools | linux-initramfs-tool` and debootstrap takes
    the first alternative, so the kernel comes after dracut, with apt: dracut then builds the
    first boot's initramfs through its kernel hook (generic, in the chroot; the lab machine's
    own builds are host-only and quick)."""
    image.prepare_base(tmp)
    (tmp / "etc/default/grub").write_text(image.GRUB_DEFAULTS)
    conf = tmp / "etc/dracut.conf.d/90-lab.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text('hostonly="no"\n')
    with _proc(tmp):
        _chroot(tmp, "apt-get", "update")
        _chroot(tmp, "apt-get", "install", "-y", "--no-install-recommends", "linux-image-amd64")
    conf.write_text('hostonly="yes"\n')


def _prepare_systemd_boot(tmp: Path) -> None:
    """The first loader entry as kernel-install writes it (bls layout on the ESP mounted at
    /boot/efi), systemd-boot's own files beside it; the ESP's files are taken out of /boot/efi
    into the ESP image when the disk is made."""
    image.prepare_base(tmp)
    with open(tmp / "etc/fstab", "a") as fstab:
        fstab.write(ESP_FSTAB)
    (tmp / "etc/machine-id").write_text(MACHINE_ID)
    (tmp / "etc/kernel").mkdir(exist_ok=True)
    (tmp / "etc/kernel/cmdline").write_text(KERNEL_CMDLINE)
    release = image.release_of(tmp)
    esp = tmp / "boot/efi"
    esp.mkdir(parents=True)
    made = tmp / "boot/efi.made"
    # the ESP a file system of its own while kernel-install writes, as in the guest: the
    # entry's paths are relative to its mount point
    with _proc(tmp), _mounted(["-t", "tmpfs", "esp"], esp):
        (esp / MACHINE_ID.strip()).mkdir()
        (esp / "loader/entries").mkdir(parents=True)
        _chroot(
            tmp,
            "kernel-install",
            "add",
            release,
            f"/boot/vmlinuz-{release}",
            f"/boot/initrd.img-{release}",
        )
        shutil.copytree(esp, made)
    esp.rmdir()
    made.rename(esp)
    (esp / "loader/loader.conf").write_text("timeout 0\n")
    efi = (tmp / "usr/lib/systemd/boot/efi/systemd-bootx64.efi").read_bytes()
    for rel in ("EFI/systemd/systemd-bootx64.efi", "EFI/BOOT/BOOTX64.EFI"):
        (esp / rel).parent.mkdir(parents=True, exist_ok=True)
        (esp / rel).write_bytes(efi)
    entry = esp / f"loader/entries/{MACHINE_ID.strip()}-{release}.conf"
    if not entry.exists():
        raise RuntimeError(f"kernel-install wrote no loader entry {entry.name}")


def _esp_from_boot_efi(staging: Path, work: Path) -> Path:
    """The ESP's files as the tree keeps them under /boot/efi, moved out (the root keeps an
    empty mount point)."""
    esp = work / "esp"
    shutil.rmtree(esp, ignore_errors=True)
    (staging / "boot/efi").rename(esp)
    (staging / "boot/efi").mkdir()
    return esp


def _dracut_tune(staging: Path) -> None:
    """Nothing to tune: the tree's dracut is host-only already."""


@dataclass(frozen=True)
class Stack:
    name: str
    packages: str
    prepare: Callable[[Path], None]
    tune: Callable[[Path], None]
    esp_tree: Callable[[Path, Path], Path]
    esp_mib: int
    listing: str  # the command that lists the initramfs of the running kernel
    rev: int  # the tree's own revision: a change to ``prepare`` rebuilds it

    @property
    def recipe(self) -> str:
        """What the cached tree is made of: a change to any of it rebuilds the tree (the
        files ``prepare`` writes from constants included)."""
        return (
            f"{self.name}\n{self.packages}\n{image.NETWORK}\n{image.GRUB_DEFAULTS}\n"
            f"{KERNEL_CMDLINE}rev {self.rev}"
        )

    def tree(self) -> Path:
        return image.cached_debootstrap(
            image.CACHE, f"stack-{self.name}", self.packages, self.recipe, self.prepare
        )


STACKS = {
    "dracut": Stack(
        "dracut",
        BASE + ",dracut,grub-efi-amd64-bin,grub2-common",
        _prepare_dracut,
        _dracut_tune,
        image.grub_esp,
        64,
        "lsinitrd",
        1,
    ),
    "systemd-boot": Stack(
        "systemd-boot",
        BASE + ",linux-image-amd64,initramfs-tools,systemd-boot",
        _prepare_systemd_boot,
        image.modules_dep,
        _esp_from_boot_efi,
        256,
        "lsinitramfs",
        3,
    ),
}


class StackLab(Lab):
    """One boot stack through apply, a reboot, undo and a reboot, as root over SSH with the
    CLI itself (no Ansible: the full chain in lab/run.py covers that)."""

    def __init__(
        self, stack: Stack, work: Path, artifacts: Path, say: Callable[[str], None] = print
    ) -> None:
        super().__init__(work, artifacts, say)
        self.stack = stack
        self.before: dict[str, str] = {}  # the card's drivers on the first boot
        self.ours: list[str] = []  # the arguments apply added

    def build(self) -> tuple[Path, Path]:  # type: ignore[override]
        key = self._key()
        s = self.stack
        disk = image.disk(
            self.work,
            (self.work / "id_lab.pub").read_text(),
            src=s.tree(),
            tune=s.tune,
            esp_tree=s.esp_tree,
            esp_mib=s.esp_mib,
            users=("root",),
        )
        return disk, key

    def cmdline(self) -> list[str]:
        return self.sh("cat /proc/cmdline").stdout.split()

    def initramfs(self) -> str:
        """The running kernel's initramfs, as the stack's own tool lists it."""
        r = self.sh(f"{self.stack.listing} /boot/initrd.img-$(uname -r)")
        if r.returncode != 0:
            raise LabFailed(f"{self.stack.listing}: {r.stderr.strip()[-500:]}")
        return r.stdout

    def first_boot(self) -> dict[str, Any]:
        """The stack as Debian left it: discovery must name its bootloader and initramfs
        tool; the baseline of /etc and /boot, and the card's own drivers."""
        cmdline = self.cmdline()
        if "iommu=pt" in cmdline or any("vfio" in a for a in cmdline):
            raise LabFailed(f"the first boot already has our arguments: {cmdline}")
        self.baseline = self.sh(self.FILES).stdout
        self.before = self.drivers(CARD_FUNCTIONS)
        if any(d in ("", "vfio-pci") for d in self.before.values()):
            raise LabFailed(f"the card is not on its own drivers at first: {self.before}")
        r = self.pt("scan --json")
        if r.returncode != 0:
            raise LabFailed(f"scan: {r.stderr.strip()[-800:]}")
        boot = json.loads(r.stdout)["host"]["boot"]
        return {"cmdline": cmdline, "drivers": self.before, "boot": boot}

    def apply(self) -> dict[str, Any]:
        r = self.pt(f"plan --gpu {CARD} --json")
        if r.returncode != 0:
            raise LabFailed(f"plan: {r.stderr.strip()[-800:]}")
        plan: dict[str, Any] = json.loads(r.stdout)
        self.ours = list(plan["kernel_args"]["set"])
        commands = [a["argv"] for a in plan["actions"] if "argv" in a]
        r = self.pt(f"apply --yes --gpu {CARD} --json")
        if r.returncode != 0:
            raise LabFailed(f"apply: rc={r.returncode} {r.stderr.strip()[-1500:]}")
        return {
            "bootloader": plan["bootloader"],
            "initramfs": plan["initramfs"],
            "binding": plan["binding"],
            "args": self.ours,
            "commands": commands,
        }

    def applied(self) -> dict[str, Any]:
        """After the reboot: our arguments on the kernel's command line, vfio-pci in the
        initramfs, both functions on vfio-pci, verify content."""
        cmdline = self.cmdline()
        missing = [a for a in self.ours if a not in cmdline]
        if not self.ours or missing:
            raise LabFailed(f"after apply and a reboot /proc/cmdline lacks {missing}: {cmdline}")
        listing = self.initramfs()
        # lsinitramfs prints paths, lsinitrd `ls -l` lines: the name is the last word's tail
        names = {ln.split()[-1].rsplit("/", 1)[-1] for ln in listing.splitlines() if ln.split()}
        in_initramfs = sorted(n for n in names if "vfio" in n or "passthrough" in n)
        if not any(n.startswith("vfio-pci.ko") for n in in_initramfs):
            raise LabFailed(f"no vfio-pci.ko in the initramfs: {in_initramfs}")
        drivers = self.drivers(CARD_FUNCTIONS)
        if any(d != "vfio-pci" for d in drivers.values()):
            raise LabFailed(f"after apply and a reboot the card is on {drivers}")
        r = self.pt("verify --json")
        data = json.loads(r.stdout) if r.stdout.strip() else {}
        if r.returncode != 0 or not data.get("ok"):
            raise LabFailed(f"verify: {r.stdout.strip()[-1500:]} {r.stderr.strip()[-500:]}")
        return {
            "cmdline": cmdline,
            "initramfs": in_initramfs,
            "drivers": drivers,
        }

    def undo(self) -> dict[str, Any]:  # type: ignore[override]
        r = self.pt("undo --yes --json")
        if r.returncode != 0:
            raise LabFailed(f"undo: rc={r.returncode} {r.stderr.strip()[-1500:]}")
        differ, _ = self.changed_since_baseline()
        if differ:
            raise LabFailed(f"undo left files changed: {differ[:10]}")
        listing = self.initramfs()
        left = [ln for ln in listing.splitlines() if "passthrough" in ln]
        if left:
            raise LabFailed(f"undo's rebuild left our files in the initramfs: {left}")
        entry = self.boot_entry()
        if any(a in entry.split() for a in self.ours):
            raise LabFailed(f"undo left our arguments in the boot entry: {entry}")
        return {"boot_entry": entry}

    def boot_entry(self) -> str:
        """The command line the next boot takes: the default GRUB entry's linux line, or
        the options of systemd-boot's loader entry for this kernel."""
        if self.stack.esp_tree is image.grub_esp:
            return " ".join(self.default_linux())
        entry = f"/boot/efi/loader/entries/{MACHINE_ID.strip()}-$(uname -r).conf"
        text = self.sh(f"cat {entry}").stdout.splitlines()
        return next((ln.strip() for ln in text if ln.split()[:1] == ["options"]), "")

    def clean(self) -> dict[str, Any]:
        cmdline = self.cmdline()
        left = [a for a in self.ours if a in cmdline]
        if left:
            raise LabFailed(f"after undo and a reboot /proc/cmdline still has {left}: {cmdline}")
        drivers = self.drivers(CARD_FUNCTIONS)
        if drivers != self.before:
            raise LabFailed(f"after undo and a reboot the card is on {drivers}, was {self.before}")
        return {"cmdline": cmdline, "drivers": drivers}

    def run(self) -> dict[str, Any]:
        def stages() -> dict[str, Any]:
            disk, key = self.stage("image", self.build)
            self.stage(
                "boot (UEFI)", lambda: self.boot(disk, None, None, key, tree=self.stack.tree)
            )
            first = self.stage("first boot: discovery, baseline", self.first_boot)
            applied = self.stage("apply", self.apply)
            entry = self.boot_entry()
            self.stage("reboot after apply", self.reboot)
            on = self.stage("vfio-pci from the initramfs, verify", self.applied)
            undone = self.stage("undo", self.undo)
            self.stage("reboot after undo", self.reboot)
            off = self.stage("clean", self.clean)
            return {
                "ok": True,
                "stack": self.stack.name,
                "accel": self.accel,
                "timings": self.timings,
                "first": first,
                "apply": {**applied, "boot_entry": entry},
                "applied": on,
                "undo": undone,
                "clean": off,
            }

        return self._guarded(stages)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("stack", choices=sorted(STACKS))
    args = ap.parse_args()
    stack = STACKS[args.stack]
    return lab_main(
        args,
        f"lab: {stack.name}",
        lambda work, artifacts, say: StackLab(stack, work, artifacts, say).run(),
    )


if __name__ == "__main__":
    raise SystemExit(main())
