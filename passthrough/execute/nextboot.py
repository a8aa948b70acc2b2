# SPDX-License-Identifier: Apache-2.0
"""What the next boot gets, read from what apply's regeneration produced, before "reboot".

A file of ours that the host's boot tool never reads (upstream grub-mkconfig and
/etc/default/grub.d, a kernel-install without our command line) would leave the next boot
without passthrough while apply said "reboot". So after the regeneration commands ran,
each source the boot reads is checked, one function each:

- ``check_grub``: the ``linux`` line of the entry grub.cfg's ``default`` names
  (``GRUB_DEFAULT`` as grub-mkconfig wrote it: a number, a title or id, a ``>`` path into
  submenus, ``saved`` from grubenv, whose ``next_entry`` wins for the next boot), read by
  :mod:`.nextboot_grub`; a default it cannot resolve is named as not checked;
- ``check_loader_entries``: every loader entry that can boot (the BLS ``options`` lines,
  written by us or by kernel-install from /etc/kernel/cmdline) and every unified kernel
  image's ``.cmdline`` section in ``EFI/Linux`` (:mod:`.nextboot_pe`);
- ``check_kernelstub``: kernelstub's configuration and the loader entries it wrote;
- ``check_proxmox``: each ESP of /etc/kernel/proxmox-boot-uuids, its loader entries
  where it is mounted (/var/tmp/espmounts/UUID), named as not read where it is not;
- ``check_initramfs``: each new image's listing by the root's own tool (``lsinitramfs``,
  ``lsinitrd``, ``lsinitcpio``): the vfio-pci module and our modprobe.d file inside.

A source that is not there, or whose tool the root lacks, is named as not checked; only
what is there and lacks ours is a failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from passthrough.errors import EXIT_NEXT_BOOT, PassthroughError
from passthrough.execute import nextboot_grub, nextboot_pe, readback_target
from passthrough.execute.apply import Runner, _default_runner, command_mode
from passthrough.execute.journal import StepState, Transaction
from passthrough.execute.sandbox import chroot_argv
from passthrough.host.boot import read_grub
from passthrough.host.root import HostRoot
from passthrough.model import BootloaderKind, InitramfsKind
from passthrough.plan import loaderentries
from passthrough.plan.actions import Plan, PlanRecord
from passthrough.plan.kargs import key_of
from passthrough.plan.vfio import MODPROBE

# the listing tool of each initramfs generator, and where its images are (dracut names
# them initrd.img-R beside Debian's kernels); a rescue image is built once, never again
LISTERS = {
    InitramfsKind.INITRAMFS_TOOLS: ("lsinitramfs", ("boot/initrd.img-*",)),
    InitramfsKind.DRACUT: ("lsinitrd", ("boot/initramfs-*.img", "boot/initrd.img-*")),
    InitramfsKind.MKINITCPIO: ("lsinitcpio", ("boot/initramfs-*.img",)),
}
RESCUE = "-rescue-"
VFIO_MODULES = ("vfio-pci.ko", "vfio_pci.ko")


@dataclass
class NextBoot:
    missing: list[str] = field(default_factory=list)  # "/boot/grub/grub.cfg: iommu=pt"
    checked: list[str] = field(default_factory=list)  # what was read
    unchecked: list[str] = field(default_factory=list)  # what could not be, and why
    not_run: list[list[str]] = field(default_factory=list)  # regenerations that did not run
    ran: list[list[str]] = field(default_factory=list)  # regenerations that ran: what they wrote


def lacking(args: list[str], record: PlanRecord) -> list[str]:
    """The arguments of ``record`` that ``args`` does not give the kernel: one of ours
    missing or overridden by a later value, or a key we dropped still there."""
    last: dict[str, str] = {}
    for arg in args:
        last[key_of(arg)] = arg
    out = [a for k, a in record.kernel_args.set.items() if last.get(k) != a]
    return out + [f"(not {k})" for k in sorted(record.kernel_args.drop) if k in last]


def check_grub(root: HostRoot, record: PlanRecord, out: NextBoot) -> None:
    # the file the regeneration wrote (its -o, update-grub's), never a guess among places
    target, why = readback_target.grub_target(out.ran, read_grub(root).regenerate)
    for rel in [target] if target else []:
        text, grubenv, unread = readback_target.read_cfg(root, rel)
        if text is None:
            out.unchecked.append(unread)
            return
        choice = nextboot_grub.choose(text, grubenv)
        if choice.args is None:
            # a grub.cfg that reads BLS entries (blscfg), a default naming no entry or a
            # submenu: not ours to guess, and named as not checked
            out.unchecked.append(f"/{rel} (could not tell which entry boots: {choice.unclear})")
            return
        if gone := lacking(choice.args, record):
            out.missing.append(f"/{rel} ({choice.entry}): {' '.join(gone)}")
        out.checked.append("/" + rel)
        return
    out.unchecked.append(why)


def check_entries(
    root: HostRoot, entries: list[loaderentries.Entry], record: PlanRecord, out: NextBoot
) -> None:
    for entry in entries:
        if gone := lacking(entry.arguments(), record):
            out.missing.append(f"/{entry.path}: {' '.join(gone)}")
        out.checked.append("/" + entry.path)


def check_ukis(root: HostRoot, record: PlanRecord, out: NextBoot) -> bool:
    """Each unified kernel image in ``EFI/Linux`` of an ESP: the command line its
    ``.cmdline`` section carries (kernel-install built it in from /etc/kernel/cmdline).
    True when there was one."""
    images = sorted(
        {i for m in loaderentries.ESP_MOUNTS for i in root.glob(f"{m}/EFI/Linux/*.efi")}
    )
    for image in images:
        try:
            args = nextboot_pe.cmdline(root.real(image))
        except (OSError, nextboot_pe.NotPE) as exc:
            out.unchecked.append(f"/{image} (not a readable PE image: {exc})")
            continue
        if args is None:
            out.unchecked.append(f"/{image} (no .cmdline section: the loader gives the line)")
            continue
        if gone := lacking(args, record):
            out.missing.append(f"/{image} (.cmdline): {' '.join(gone)}")
        out.checked.append("/" + image)
    return bool(images)


def check_loader_entries(root: HostRoot, record: PlanRecord, out: NextBoot) -> None:
    entries = loaderentries.bootable(root)
    ukis = check_ukis(root, record, out)
    if not entries and not ukis:
        # entries whose kernel is not where the loader looks (relative to the entry's own
        # partition): kernel-install run in a tree whose ESP is a plain folder, not a mount
        # point, names its files from the tree's / (``linux /boot/efi/...``) -- nothing boots
        stranded = [e for e in loaderentries.all_entries(root) if e.kernel is not None]
        for e in stranded:
            out.missing.append(
                f"/{e.path}: its kernel {e.kernel} is not on the partition at /{e.mount}, "
                "so the loader cannot boot it"
            )
        if not stranded:
            out.unchecked.append("loader entries (none on /efi, /boot or /boot/efi)")
        return
    check_entries(root, entries, record, out)


KERNELSTUB = "etc/kernelstub/configuration"
# the entries kernelstub writes, named after the OS: Pop_OS-current.conf, Pop_OS-oldkern.conf
KERNELSTUB_ENTRIES = ("*-current.conf", "*-oldkern.conf")


def check_kernelstub(root: HostRoot, record: PlanRecord, out: NextBoot) -> None:
    """kernelstub's configuration (``user.kernel_options``, what ``kernelstub -a`` saved)
    and the loader entries it wrote from it on its ESP (``user.esp_path``)."""
    text = root.read(KERNELSTUB)
    try:
        user = json.loads(text or "")["user"]
        options, esp = user["kernel_options"], user.get("esp_path", "/boot/efi")
        if not isinstance(options, list) or not isinstance(esp, str):
            raise TypeError
    except (ValueError, KeyError, TypeError, AttributeError):
        out.unchecked.append(f"/{KERNELSTUB} (absent or not kernelstub's JSON)")
        return
    if gone := lacking([str(o) for o in options], record):
        out.missing.append(f"/{KERNELSTUB} (user kernel_options): {' '.join(gone)}")
    out.checked.append("/" + KERNELSTUB)
    mount = esp.strip("/")
    entries = [
        loaderentries.Entry(path, mount, root.read(path) or "")
        for pattern in KERNELSTUB_ENTRIES
        for path in sorted(root.glob(f"{mount}/loader/entries/{pattern}"))
    ]
    if not entries:
        out.unchecked.append(f"kernelstub's loader entries (none in {esp}/loader/entries)")
    check_entries(root, entries, record, out)


PROXMOX_UUIDS = "etc/kernel/proxmox-boot-uuids"
# where proxmox-boot-tool mounts each ESP it syncs, in a mount namespace of its own: after
# a refresh it is unmounted again, and the ESP is read only where it is mounted there
ESPMOUNTS = "var/tmp/espmounts"


def check_proxmox(root: HostRoot, record: PlanRecord, out: NextBoot) -> None:
    """Each ESP proxmox-boot-tool keeps in sync (/etc/kernel/proxmox-boot-uuids): its
    loader entries where it is mounted, and named as not read where it is not."""
    text = root.read(PROXMOX_UUIDS)
    esps = [line.split() for line in (text or "").split("\n") if line.strip()]
    if not esps:
        out.unchecked.append(f"the ESPs (no /{PROXMOX_UUIDS})")
        return
    for words in esps:
        uuid, mode = words[0], (words[1:] or ["systemd-boot"])[0]
        folder = f"{ESPMOUNTS}/{uuid}/loader/entries"
        if mode == "grub":
            out.unchecked.append(f"ESP {uuid} (synced for GRUB: its grub.cfg is the root's)")
        elif not root.isdir(folder):
            out.unchecked.append(
                f"ESP {uuid} (not mounted at /{ESPMOUNTS}/{uuid}: its loader entries were not read)"
            )
        else:
            paths = sorted(root.glob(f"{folder}/*.conf"))
            mount = f"{ESPMOUNTS}/{uuid}"
            check_entries(
                root,
                [loaderentries.Entry(p, mount, root.read(p) or "") for p in paths],
                record,
                out,
            )
            if not paths:
                out.unchecked.append(f"ESP {uuid} (mounted, no loader entries)")


def _listing(root: HostRoot, argv: tuple[str, ...], runner: Runner) -> str | None:
    full = list(argv) if command_mode(root) == "host" else chroot_argv(root.path, argv)
    try:
        result = runner(full)
    except FileNotFoundError:
        return None
    return result.stdout if result.returncode == 0 else None


def listed_paths(listing: str) -> list[str]:
    """The paths of a listing: lsinitramfs and lsinitcpio print one a line, lsinitrd an
    ``ls -l`` line ending in it (a link's ``-> target`` left out)."""
    out: list[str] = []
    for line in listing.split("\n"):
        line = line.split(" -> ", 1)[0].strip()
        if line:
            out.append(line.split()[-1].lstrip("./"))
    return out


def builtin_vfio(root: HostRoot) -> bool:
    """vfio-pci is built into an installed kernel (modules.builtin names it): no image
    carries it as a module then."""
    return any(
        "/vfio-pci.ko" in (root.read(f"lib/modules/{release}/modules.builtin") or "")
        for release in root.listdir("lib/modules")
    )


def image_lacks(paths: list[str], modprobe: bool, builtin: bool = False) -> list[str]:
    names = [p.rsplit("/", 1)[-1] for p in paths]
    gone = []
    if not builtin and not any(n.split(".ko")[0] + ".ko" in VFIO_MODULES for n in names):
        gone.append("vfio-pci module")
    if modprobe and MODPROBE not in paths:
        gone.append("/" + MODPROBE)
    return gone


def check_initramfs(root: HostRoot, kind: InitramfsKind, runner: Runner, out: NextBoot) -> None:
    """Every image the regeneration rebuilt (each command rebuilds them all: ``-k all``,
    ``--regenerate-all``, ``-P``), listed by the root's own tool."""
    lister = LISTERS.get(kind)
    if lister is None:
        return
    tool, patterns = lister
    images = sorted({i for p in patterns for i in root.glob(p) if RESCUE not in i})
    if not images:
        out.unchecked.append("the initramfs (no " + " or ".join(f"/{p}" for p in patterns) + ")")
        return
    modprobe = root.exists(MODPROBE)
    builtin = builtin_vfio(root)
    for image in images:
        listing = _listing(root, (tool, "/" + image), runner)
        if listing is None:
            out.unchecked.append(f"/{image} ({tool} is not in the root, or failed)")
            continue
        if gone := image_lacks(listed_paths(listing), modprobe, builtin):
            out.missing.append(f"/{image}: {', '.join(gone)}")
        out.checked.append("/" + image)


CHECKS: dict[BootloaderKind, Callable[[HostRoot, PlanRecord, NextBoot], None]] = {
    BootloaderKind.GRUB: check_grub,
    BootloaderKind.SYSTEMD_BOOT: check_loader_entries,
    BootloaderKind.PROXMOX: check_proxmox,
    BootloaderKind.KERNELSTUB: check_kernelstub,
}


class NextBootLacks(PassthroughError):
    """apply made every change, but what the next boot reads lacks it (exit 5)."""

    exit_code = EXIT_NEXT_BOOT

    def __init__(self, missing: list[str]) -> None:
        super().__init__(
            "apply is done, but the next boot would not get it: "
            + "; ".join(missing)
            + "; the journal holds every step: `passthrough undo` puts everything back"
        )


def check(
    root: HostRoot, tx: Transaction, initramfs: InitramfsKind, runner: Runner = _default_runner
) -> NextBoot:
    """What the next boot reads after ``tx``, an apply; nothing is read while one of its
    regeneration commands has not run (listed, failed): ``not_run`` names them."""
    not_run = [s.argv for s in tx.steps if s.regenerate and s.state is not StepState.DONE]
    if tx.record is None:
        return NextBoot(not_run=not_run)
    ran = [s.argv for s in tx.steps if s.regenerate and s.state is StepState.DONE]
    return check_record(root, tx.record, initramfs, not_run, runner, ran=ran)


def check_record(
    root: HostRoot,
    record: PlanRecord,
    initramfs: InitramfsKind,
    not_run: list[list[str]] | None = None,
    runner: Runner = _default_runner,
    ran: list[list[str]] | None = None,
) -> NextBoot:
    """What the next boot reads, against what ``record`` (a plan) says it must have;
    nothing is read while a regeneration is still owed (``not_run``). ``ran``: the
    regenerations this run made, whose output is what is read."""
    out = NextBoot(not_run=list(not_run or []), ran=list(ran or []))
    if out.not_run:
        return out
    by_loader = CHECKS.get(record.bootloader)
    if by_loader is None:
        out.unchecked.append(f"{record.bootloader.value}'s own configuration (not read here)")
    elif record.kernel_args.set or record.kernel_args.drop:
        by_loader(root, record, out)
    if record.functions:
        check_initramfs(root, initramfs, runner, out)
    return out


def reboot_due(root: HostRoot, tx: Transaction | None, plan: Plan) -> bool:
    """Whether the host needs a reboot to have ``plan``: this run changed what the boot
    reads (files, or a regeneration an earlier apply owed), or the kernel running (the
    root's /proc/cmdline) lacks an argument the plan's boot must have."""
    if plan.reboot:
        return True
    if tx is not None and any(s.regenerate and s.state is StepState.DONE for s in tx.steps):
        return True
    return bool(lacking((root.read("proc/cmdline") or "").split(), plan.record()))


def to_json(nb: NextBoot) -> dict[str, Any]:
    return {
        "checked": nb.checked,
        "missing": nb.missing,
        "unchecked": nb.unchecked,
        "not_run": nb.not_run,
    }
