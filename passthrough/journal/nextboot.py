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

from typing import Any

from passthrough.actions import Plan, PlanRecord
from passthrough.boot.families import READ_BACK
from passthrough.boot.readback import NextBoot, lacking
from passthrough.errors import EXIT_NEXT_BOOT, PassthroughError
from passthrough.host.root import HostRoot
from passthrough.journal.apply import Runner, _default_runner, command_mode
from passthrough.journal.journal import StepState, Transaction
from passthrough.journal.sandbox import chroot_argv
from passthrough.model import InitramfsKind
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
    by_loader = READ_BACK.get(record.bootloader)
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
