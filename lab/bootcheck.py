# SPDX-License-Identifier: Apache-2.0
"""The fast boot check of a boot stack (lab/stacks.py's dracut and systemd-boot trees, and the
lab's own tree with upstream GRUB as lab/grub_upstream.py makes it): what the next boot
really gets after `apply --root` and after `undo --root`, without SSH or a running system.

    python lab/bootcheck.py dracut|systemd-boot|upstream-grub [--keep WORKDIR]
                            [--artifacts DIR] [--json]

The stages, each timed:
  tree     the stack's cached tree (lab/stacks.py's recipe; the lab's tree with upstream's
           grub-mkconfig and no update-grub for upstream-grub) copied to the work directory; a
           small checking init as the admin's own kernel argument (``init=``, with the root by
           label) in the stack's baseline command line (GRUB_CMDLINE_LINUX or
           /etc/kernel/cmdline); the lab's emulated card described under the copy's /sys
           (the same IDs, classes and functions QEMU presents, lab/machine.py STAND_INS)
  apply    `passthrough plan --root COPY` and `apply --root COPY --yes` with the card by
           address (upstream-grub: `--iommu-only`, our line in /etc/default/grub), natively,
           as root: the stack's own tools (dracut and update-grub, update-initramfs and
           kernel-install, grub-mkconfig) run in the toolkit's sandbox
  boot     one UEFI boot through OVMF and the stack's own bootloader and initramfs with the
           lab's QEMU devices; the checking init prints /proc/cmdline, each function's bound
           driver and whether vfio-pci was loaded (nothing after the initramfs loads a
           module), then powers off. Every argument the plan added is on the command line,
           both card functions are on vfio-pci (--iommu-only: neither is)
  undo     `undo --root COPY --yes`: /etc byte-identical to before apply
  boot     the same boot: none of our arguments, the card not on vfio-pci
On failure the console logs and every command's output stay in the artifacts directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import image
import machine
from grub_upstream import MARKER, REGENERATE, upstream_tune
from labcore import ADMIN_ARG, ADMIN_GRUB, CARD, CARD_FUNCTIONS, REPO, LabFailed, with_admin_edit
from run import lab_main, parser
from stacks import STACKS, _esp_from_boot_efi, _mounted

sys.path.insert(0, str(REPO))
from passthrough import fakehost
from passthrough.journal.sandbox import chroot_argv

CHECK_INIT = "/usr/local/sbin/lab-check"
BEGIN, END = "LAB-CHECK-BEGIN", "LAB-CHECK-END"
# PID 1 of the checked boot: what the initramfs left, printed between markers on the serial
# console; it loads nothing itself, so a vfio_pci module it sees came from the initramfs
CHECK_SCRIPT = f"""#!/bin/sh
mount -t proc proc /proc 2>/dev/null
mount -t sysfs sysfs /sys 2>/dev/null
echo {BEGIN}
printf 'cmdline %s\n' "$(cat /proc/cmdline)"
for f in /sys/bus/pci/devices/*; do
  d=none
  [ -e "$f/driver" ] && d=$(basename "$(readlink "$f/driver")")
  echo "driver ${{f##*/}} $d"
done
[ -d /sys/module/vfio_pci ] && echo "module vfio_pci"
echo {END}
# the serial port drains before the power-off (its kernel message would cut into the text)
sleep 2
echo o > /proc/sysrq-trigger
while :; do sleep 60; done
"""
# the admin's own arguments the check boots with: the root by label (update-grub in a tree
# names the build machine's device) and the checking init; apply must keep both
ADMIN_ARGS = f"root=LABEL=labroot init={CHECK_INIT}"
BOOT_TIMEOUT = 900.0
KERNEL_MESSAGE = re.compile(r"\[\s*\d+\.\d+\] [^\n]*\n")

# The lab machine's PCI devices as QEMU presents them (lab/machine.py STAND_INS): the card
# (qxl display + qemu-xhci, one slot behind its own root port), and the negative case (a
# second qxl with an e1000 behind a PCIe-to-PCI bridge, one group)
LAB_PCI: list[dict[str, Any]] = [
    {"addr": "00:00.0", "id": "8086:29c0", "class": "host-bridge", "group": 0},
    {
        "addr": "00:05.0",
        "id": "1b36:000c",
        "class": "bridge",
        "driver": "pcieport",
        "group": 1,
        "children": [
            {"addr": "01:00.0", "id": "1b36:0100", "class": "vga", "driver": "qxl", "group": 2},
            {
                "addr": "01:00.1",
                "id": "1b36:000d",
                "class": "usb",
                "driver": "xhci_hcd",
                "group": 2,
            },
        ],
    },
    {
        "addr": "00:06.0",
        "id": "1b36:000e",
        "class": "bridge",
        "group": 3,
        "group_children": True,
        "children": [
            {"addr": "02:01.0", "id": "1b36:0100", "class": "vga", "driver": "qxl"},
            {"addr": "02:02.0", "id": "8086:100e", "class": "ethernet", "driver": "e1000"},
        ],
    },
]


# dracut's modules a generic image of the lab's machine (a virtio disk with ext4, a serial
# console) does not need; the largest is drm with every GPU driver of the kernel. An admin's
# own choice, as any dracut.conf.d file is: our drop-in still adds vfio-pci to the image
LAB_OMIT = (
    "plymouth drm i18n bluetooth lvm dm dmraid mdraid crypt multipath btrfs nvdimm nvmf biosdevname"
)


def _dracut_generic(root: Path) -> None:
    """dracut's own images host-only in a tree would be made for the build machine (the
    sandbox's /sys is empty): generic, as the tree's first image was made, without the
    dracut modules the lab's machine does not use (a smaller image: less to build and to
    load under TCG)."""
    (root / "etc/dracut.conf.d/90-lab.conf").write_text(
        f'hostonly="no"\nomit_dracutmodules+=" {LAB_OMIT} "\n'
    )


def _as_is(root: Path) -> None:
    """Nothing to change: initramfs-tools' default MODULES=most needs no /sys."""


@dataclass(frozen=True)
class Target:
    """What one boot check applies to and how."""

    name: str
    tree: Callable[[], Path]  # the cached tree
    grub: bool  # the lab's standalone GRUB on the ESP; else systemd-boot from /boot/efi
    esp_mib: int
    initramfs: str  # the tree's initramfs tool (the sysfs description names it)
    tune: Callable[[Path], None]  # the copy, before its baseline
    plan: tuple[str, ...]  # what plan and apply are asked for
    binds: bool  # whether the plan binds the card to vfio-pci
    # the admin's own edit of /etc/default/grub after apply and their grub-mkconfig
    # (lab/labcore.py ADMIN_ARG): it boots with ours, undo keeps it
    admin_edit: bool = False


def _stack(name: str, initramfs: str, tune: Callable[[Path], None]) -> Target:
    """A boot stack of lab/stacks.py, its tree, bootloader and ESP as the full run has them,
    the card bound by address."""
    s = STACKS[name]
    grub = s.esp_tree is image.grub_esp
    return Target(name, s.tree, grub, s.esp_mib, initramfs, tune, ("--gpu", CARD), True)


TARGETS = {
    "dracut": _stack("dracut", "dracut", _dracut_generic),
    "systemd-boot": _stack("systemd-boot", "initramfs-tools", _as_is),
    # the lab's tree with upstream's grub-mkconfig (reads /etc/default/grub only) and no
    # update-grub, as lab/grub_upstream.py boots it; kernel arguments only
    "upstream-grub": Target(
        "upstream-grub",
        image.tree,
        True,
        64,
        "initramfs-tools",
        upstream_tune,
        ("--iommu-only",),
        False,
        admin_edit=True,
    ),
}


def _sha_tree(root: Path, top: str) -> dict[str, str]:
    """Every regular file under ``root/top`` by its hash (links and all)."""
    out: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(root / top):
        for name in files:
            p = Path(dirpath) / name
            key = str(p.relative_to(root))
            out[key] = (
                f"link {os.readlink(p)}"
                if p.is_symlink()
                else hashlib.sha256(p.read_bytes()).hexdigest()
            )
    return out


def parse_check(console: str) -> dict[str, Any]:
    """What the checking init printed: the command line, each function's driver, whether
    vfio_pci was loaded."""
    if BEGIN not in console or END not in console.split(BEGIN, 1)[1]:
        raise LabFailed(f"the checking init did not report; the console ends: {console[-1500:]}")
    # a kernel message can land inside a line of the init's output on the shared console
    body = KERNEL_MESSAGE.sub("", console.split(BEGIN, 1)[1].split(END, 1)[0])
    cmdline: list[str] = []
    drivers: dict[str, str] = {}
    vfio = False
    for raw in body.splitlines():
        line = raw.strip()
        if line.startswith("cmdline "):
            cmdline = line.split()[1:]
        elif line.startswith("driver "):
            words = line.split()
            if len(words) != 3:
                raise LabFailed(f"the checking init's line is garbled: {line!r}")
            drivers[words[1]] = words[2]
        elif line == "module vfio_pci":
            vfio = True
    return {"cmdline": cmdline, "drivers": drivers, "vfio_pci_module": vfio}


class BootCheck:
    """One stack: its tree applied and undone by the CLI natively, each state booted once."""

    def __init__(
        self, stack: Target, work: Path, artifacts: Path, say: Callable[[str], None] = print
    ) -> None:
        self.stack = stack
        self.work = work
        self.artifacts = artifacts
        self.say = say
        self.timings: dict[str, float] = {}
        self.log: list[str] = []
        self.root = work / "tree"
        self.grub = stack.grub
        self.ours: list[str] = []
        self.etc: dict[str, str] = {}
        self.original_grub = ""  # /etc/default/grub as the baseline has it

    def stage(self, name: str, fn: Callable[[], Any]) -> Any:
        self.say(f"[lab] {name} ...")
        started = time.monotonic()
        try:
            return fn()
        finally:
            self.timings[name] = time.monotonic() - started
            self.say(f"[lab] {name} took {self.timings[name]:.1f}s")

    # -- the tree -------------------------------------------------------------------------
    def tree(self) -> dict[str, Any]:
        src = self.stack.tree()
        shutil.rmtree(self.root, ignore_errors=True)
        image._run(["cp", "-a", str(src), str(self.root)])
        init = self.root / CHECK_INIT.lstrip("/")
        init.write_text(CHECK_SCRIPT)
        init.chmod(0o755)
        self.stack.tune(self.root)
        if self.grub:
            # where update-grub writes the menu (grub-install makes it on a real host)
            (self.root / "boot/grub").mkdir(exist_ok=True)
            grub = self.root / "etc/default/grub"
            text = grub.read_text()
            old = 'GRUB_CMDLINE_LINUX="console=ttyS0 no_timer_check"'
            if old not in text:
                raise LabFailed(f"/etc/default/grub has no {old}: {text}")
            grub.write_text(text.replace(old, f'{old[:-1]} {ADMIN_ARGS}"'))
            baseline = grub.read_text()
        else:
            cmdline = self.root / "etc/kernel/cmdline"
            cmdline.write_text(f"{cmdline.read_text().strip()} init={CHECK_INIT}\n")
            baseline = cmdline.read_text()
        release = image.release_of(self.root)
        self.describe(release)
        self.etc = _sha_tree(self.root, "etc")
        if self.grub:
            self.original_grub = (self.root / ADMIN_GRUB.lstrip("/")).read_text()
        return {"release": release, "baseline": baseline.strip()}

    def describe(self, release: str) -> None:
        """The lab machine's PCI devices, IOMMU and firmware under the copy's /sys and
        /proc, as fakehost writes a sample host (its boot and /etc files stay the tree's)."""
        name = f"lab-{self.stack.name}"
        data = {
            "name": name,
            "cpu": {"vendor": "intel", "model": "QEMU TCG CPU", "cpus": 2},
            "memory_gib": 3,
            "kernel": {
                "release": release,
                "cmdline": f"BOOT_IMAGE=/boot/vmlinuz-{release} root=LABEL=labroot ro "
                "console=ttyS0 no_timer_check quiet",
            },
            "boot": {
                "uefi": True,
                "bootloader": "grub" if self.grub else "systemd-boot",
                "initramfs": self.stack.initramfs,
            },
            "kvm": False,
            "pci": LAB_PCI,
        }
        facts = self.work / "facts"
        shutil.rmtree(facts, ignore_errors=True)
        fakehost.build(fakehost.Description(data, name), facts)
        for part in ("sys", "proc"):
            shutil.rmtree(self.root / part, ignore_errors=True)
            shutil.copytree(facts / part, self.root / part, symlinks=True)

    # -- the CLI, natively --------------------------------------------------------------------
    def pt(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The CLI on the copy, its ESP a mount of its own at /boot/efi as on the booted
        host (kernel-install writes an entry's paths relative to the ESP's mount point; in a
        plain folder they would start with /boot/efi, which systemd-boot cannot find)."""
        argv = [sys.executable, "-m", "passthrough", *args]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with contextlib.nullcontext() if self.grub else self._esp_mounted():
            r = subprocess.run(
                argv, capture_output=True, text=True, timeout=1800, check=False, cwd=REPO, env=env
            )
        self.log.append(f"$ {' '.join(argv)}\n[rc={r.returncode}]\n{r.stdout}\n{r.stderr}")
        return r

    @contextlib.contextmanager
    def _esp_mounted(self) -> Iterator[None]:
        """The copy's /boot/efi a file system of its own while the CLI runs (a tmpfs with
        its files, put back after): kernel-install's loader entry names its files relative
        to ``stat -c %m`` of the ESP, which a bind mount on itself does not change."""
        esp = self.root / "boot/efi"
        side = self.work / "esp-files"
        shutil.rmtree(side, ignore_errors=True)
        esp.rename(side)
        esp.mkdir()
        try:
            with _mounted(["-t", "tmpfs", "esp"], esp):
                shutil.copytree(side, esp, symlinks=True, dirs_exist_ok=True)
                yield
                shutil.rmtree(side)
                shutil.copytree(esp, side, symlinks=True)
        finally:
            esp.rmdir()
            side.rename(esp)

    def apply(self) -> dict[str, Any]:
        root = str(self.root)
        r = self.pt("plan", "--root", root, *self.stack.plan, "--json")
        if r.returncode != 0:
            raise LabFailed(f"plan: rc={r.returncode} {r.stderr.strip()[-800:]}")
        plan: dict[str, Any] = json.loads(r.stdout)
        self.ours = list(plan["kernel_args"]["set"])
        commands = [a["argv"] for a in plan["actions"] if "argv" in a]
        r = self.pt("apply", "--root", root, *self.stack.plan, "--yes", "--json")
        if r.returncode != 0:
            raise LabFailed(f"apply: rc={r.returncode} {r.stderr.strip()[-1500:]}")
        if not self.ours:
            raise LabFailed(f"the plan adds no kernel arguments: {plan['kernel_args']}")
        dropin = self.root / "etc/default/grub.d/99-passthrough.cfg"
        grub = self.root / "etc/default/grub"
        return {
            "bootloader": plan["bootloader"],
            "initramfs": plan["initramfs"],
            "binding": plan["binding"],
            "args": self.ours,
            "commands": commands,
            "writes": [a["path"] for a in plan["actions"] if a["kind"] == "write"],
            "grub_dropin": dropin.exists(),
            "grub_marker": self.grub and MARKER in grub.read_text(),
        }

    def admin(self) -> dict[str, Any]:
        """The admin's sed on /etc/default/grub as apply left it (``ADMIN_ARG`` at the end of
        GRUB_CMDLINE_LINUX_DEFAULT) and their grub-mkconfig, in the sandbox as apply runs it;
        after undo the file must be the original with that edit."""
        grub = self.root / ADMIN_GRUB.lstrip("/")
        grub.write_text(with_admin_edit(grub.read_text()))
        # what undo must leave: the first file with the admin's edit
        self.etc[ADMIN_GRUB.lstrip("/")] = hashlib.sha256(
            with_admin_edit(self.original_grub).encode()
        ).hexdigest()
        r = subprocess.run(
            chroot_argv(str(self.root), tuple(REGENERATE)),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        self.log.append(f"$ {' '.join(REGENERATE)}\n[rc={r.returncode}]\n{r.stdout}\n{r.stderr}")
        if r.returncode != 0:
            raise LabFailed(f"the admin's grub-mkconfig: {r.stderr.strip()[-800:]}")
        return {"default_grub": grub.read_text()}

    def undo(self) -> dict[str, Any]:
        r = self.pt("undo", "--root", str(self.root), "--yes", "--json")
        if r.returncode != 0:
            raise LabFailed(f"undo: rc={r.returncode} {r.stderr.strip()[-1500:]}")
        now = _sha_tree(self.root, "etc")
        differ = sorted(k for k in set(now) | set(self.etc) if now.get(k) != self.etc.get(k))
        if differ:
            raise LabFailed(f"undo left files under /etc changed: {differ[:10]}")
        return {"etc_files": len(now)}

    # -- the boot -----------------------------------------------------------------------------
    def _grub_esp(self, staging: Path, work: Path) -> Path:
        """The lab's standalone GRUB on the ESP, with the menu apply's update-grub wrote
        (image.grub_esp writes a first boot's menu in its place)."""
        menu = staging / "boot/grub/grub.cfg"
        ours = menu.read_bytes()
        esp = image.grub_esp(staging, work)
        menu.write_bytes(ours)
        return esp

    def boot(self, tag: str) -> dict[str, Any]:
        """The copy as a GPT disk (ESP + root), booted once through OVMF with the lab's
        devices until the checking init powers it off."""
        work = self.work / f"boot-{tag}"
        shutil.rmtree(work, ignore_errors=True)
        s = self.stack
        disk = image.disk(
            work,
            "",
            src=self.root,
            tune=lambda _staging: None,
            esp_tree=self._grub_esp if self.grub else _esp_from_boot_efi,
            esp_mib=s.esp_mib,
            users=(),
        )
        m = machine.LabMachine(work, disk, None, None, "", work / "no-key", "tcg")
        m.start()
        assert m.proc is not None
        started = time.monotonic()
        try:
            m.proc.wait(timeout=BOOT_TIMEOUT)
        except subprocess.TimeoutExpired:
            m.stop()
        finally:
            seconds = time.monotonic() - started
            console = m.console.read_text(errors="replace") if m.console.exists() else ""
            (self.work / f"console-{tag}.log").write_text(console)
            m.stop()
            (work / "bigbar.mem").unlink(missing_ok=True)
            disk.unlink(missing_ok=True)
        result = parse_check(console)
        result["seconds"] = round(seconds, 1)
        return result

    def applied(self) -> dict[str, Any]:
        got = self.boot("applied")
        missing = [a for a in self.ours if a not in got["cmdline"]]
        if self.stack.admin_edit and ADMIN_ARG not in got["cmdline"]:
            missing.append(ADMIN_ARG)
        if missing or f"init={CHECK_INIT}" not in got["cmdline"]:
            raise LabFailed(f"the applied boot's /proc/cmdline lacks {missing}: {got['cmdline']}")
        on = {a: got["drivers"].get(a, "absent") for a in CARD_FUNCTIONS}
        bound = all(d == "vfio-pci" for d in on.values()) and got["vfio_pci_module"]
        if self.stack.binds and not bound:
            raise LabFailed(f"the applied boot has the card on {on}: {got}")
        if not self.stack.binds and ("vfio-pci" in on.values() or got["vfio_pci_module"]):
            raise LabFailed(f"kernel arguments only, yet the card is on {on}: {got}")
        return got

    def undone(self) -> dict[str, Any]:
        got = self.boot("undone")
        left = [a for a in self.ours if a in got["cmdline"]]
        kept = [f"init={CHECK_INIT}"] + ([ADMIN_ARG] if self.stack.admin_edit else [])
        lost = [a for a in kept if a not in got["cmdline"]]
        if left or lost:
            raise LabFailed(
                f"the undone boot's /proc/cmdline has {left}, lacks {lost}: {got['cmdline']}"
            )
        on = {a: got["drivers"].get(a, "absent") for a in CARD_FUNCTIONS}
        if "absent" in on.values() or "vfio-pci" in on.values() or got["vfio_pci_module"]:
            raise LabFailed(f"the undone boot has the card on {on}, vfio_pci loaded: {got}")
        return got

    def keep_artifacts(self) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        for log in self.work.glob("console-*.log"):
            shutil.copy(log, self.artifacts / log.name)
        (self.artifacts / "commands.log").write_text("\n".join(self.log))
        self.say(f"[lab] artifacts kept in {self.artifacts}")

    def run(self) -> dict[str, Any]:
        try:
            tree = self.stage("tree: copy, checking init, the card's sysfs", self.tree)
            applied = self.stage("plan, apply --root", self.apply)
            if self.stack.admin_edit:
                applied["admin"] = self.stage(
                    "admin edits /etc/default/grub, grub-mkconfig", self.admin
                )
            on = self.stage("boot after apply", self.applied)
            undone = self.stage("undo --root", self.undo)
            off = self.stage("boot after undo", self.undone)
        except Exception:
            self.keep_artifacts()
            raise
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
        return {
            "ok": True,
            "stack": self.stack.name,
            "timings": self.timings,
            "tree": tree,
            "apply": applied,
            "applied": on,
            "undo": undone,
            "undone": off,
        }


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("stack", choices=sorted(TARGETS))
    args = ap.parse_args()
    stack = TARGETS[args.stack]
    return lab_main(
        args,
        f"lab: boot check {stack.name}",
        lambda work, artifacts, say: BootCheck(stack, work, artifacts, say).run(),
    )


if __name__ == "__main__":
    raise SystemExit(main())
