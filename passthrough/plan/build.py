# SPDX-License-Identifier: Apache-2.0
"""From discovery to a Plan: selection, kernel arguments, vfio binding, initramfs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from passthrough.actions import Action, Binding, Plan, PlannedCard, RemoveFile, WriteFile
from passthrough.analysis.preflight import preflight_notes
from passthrough.analysis.scan import analyse
from passthrough.boot.families import UnknownBootloader, for_host
from passthrough.boot.grub import GrubUnknown
from passthrough.boot.nixos import NixosRefused, configuration_lines
from passthrough.errors import PassthroughError
from passthrough.host.modalias import PLAIN, vfio_drivers
from passthrough.host.root import HostRoot
from passthrough.kargs import ArgChange, KargOptions, desired, key_of, needed
from passthrough.model import BootloaderKind, Finding, Host, Severity
from passthrough.plan import modprobe_conflicts, vfio
from passthrough.plan.select import Selection, select
from passthrough.records import frozen


@frozen
class PlanOptions:
    """What the user asked plan for: which cards, and how to bind them."""

    gpus: tuple[str, ...] = ()
    nvswitches: tuple[str, ...] = ()  # --nvswitch: the whole NVLink domain to vfio-pci
    include_group: bool = False
    allow_boot_gpu: bool = False
    iommu_pt: bool = True
    hugepages_1g: int = 0
    # 1 GiB pages an earlier apply reserved that go now (--hugepages-1g 0)
    release_hugepages: bool = False
    iommu_only: bool = False  # only the kernel arguments that turn the IOMMU on: no card
    notes: tuple[str, ...] = ()  # what the caller decided about the selection, told in the plan


# what the host keeps for itself beyond boot-time 1 GiB huge pages (which it can never use)
HOST_RESERVE_MIB_MIN = 2048
HOST_RESERVE_FRACTION = 8  # at least an eighth of its RAM


class BadHugepages(PassthroughError):
    def __init__(self, count: int, why: str) -> None:
        super().__init__(f"hugepages: {count} {why}")


def _warning_notes(findings: Iterable[Finding]) -> list[str]:
    """The warnings among ``findings`` as plan and apply tell them: one line per warning,
    naming every card it is about (eight H100s share one NVSwitch warning)."""
    cards: dict[tuple[str, str], list[str]] = {}
    for f in findings:
        if f.severity is Severity.WARNING:
            cards.setdefault((f.message, f.code), []).extend(str(d) for d in f.devices)
    return [
        f"{', '.join(dict.fromkeys(addrs))}: {message} [{code}]" if addrs else f"{message} [{code}]"
        for (message, code), addrs in cards.items()
    ]


def check_hugepages(count: int, host: Host) -> str | None:
    """1 GiB pages reserved at boot are gone for the host: they must leave it room to boot
    and run (an oversized reservation is a host that does not come up). Returns a note when
    the root does not say how much RAM there is (an image's tree, no /proc/meminfo)."""
    if count < 0:
        raise BadHugepages(count, "is not a number of 1 GiB pages (0 for none)")
    if count == 0:
        return None
    if host.memory_mib is None:
        return (
            f"{count} x 1 GiB huge pages not checked against the RAM: this root has no "
            "/proc/meminfo; make sure the machine that boots it has more"
        )
    reserve = max(HOST_RESERVE_MIB_MIN, host.memory_mib // HOST_RESERVE_FRACTION)
    most = max(0, (host.memory_mib - reserve) >> 10)
    if count > most:
        raise BadHugepages(
            count,
            f"x 1 GiB is more than this host's {host.memory_mib} MiB of RAM can give: "
            f"at most {most}, leaving the host {reserve} MiB",
        )
    return None


def _write_if_changed(root: HostRoot, action: WriteFile) -> list[Action]:
    current = root.read_bytes(action.path)
    return [] if current == action.content else [action]


def variants_apart(sel: Selection, drivers: dict[str, str]) -> Selection:
    """A function with a vfio variant driver is bound per device (driver_override), so its
    ID stays out of vfio-pci's ID list: vfio-pci would claim it first. A function left on
    plain vfio-pci that shares such an ID cannot be bound by ID either."""
    variant = {str(f.address) for f in sel.functions if drivers.get(str(f.address), PLAIN) != PLAIN}
    if not variant:
        return sel
    taken = {f.id for f in sel.functions if str(f.address) in variant}
    shared = [f for f in sel.functions if str(f.address) not in variant and f.id in taken]
    notes = list(sel.notes)
    if shared:
        notes.append(
            ", ".join(f"{f.address} ({f.id})" for f in shared)
            + " shares its ID with a function bound to a vfio variant driver: binding per "
            "device (driver_override) instead of vfio-pci.ids"
        )
    return replace(
        sel,
        vfio_ids=[i for i in sel.vfio_ids if i not in taken],
        ids_ambiguous=sel.ids_ambiguous or bool(shared),
        notes=notes,
    )


def _binding(
    root: HostRoot, host: Host, sel: Selection, drivers: dict[str, str]
) -> tuple[list[Action], list[str], bool]:
    """modprobe.d (ours, and our IDs in another file's ids= read after ours) and the
    per-device udev rule (every function when IDs are ambiguous, else those bound to a vfio
    variant driver), with a note for each other modprobe.d line about vfio; and whether the
    rule is in use."""
    actions: list[Action] = []
    deps = vfio.softdeps(root, host, sel.functions)
    ids, notes, theirs = modprobe_conflicts.review(
        root, [] if sel.ids_ambiguous else list(sel.vfio_ids), sel.ids_ambiguous
    )
    conf = vfio.modprobe_conf(ids, deps)
    actions += _write_if_changed(
        root, WriteFile(vfio.MODPROBE, conf.encode(), "vfio-pci options and softdeps")
    )
    actions += theirs
    per_device = [
        f for f in sel.functions if sel.ids_ambiguous or drivers.get(str(f.address), PLAIN) != PLAIN
    ]
    if per_device:
        actions += _write_if_changed(
            root,
            WriteFile(
                vfio.UDEV_RULE,
                vfio.udev_rule(per_device, drivers).encode(),
                "driver_override per device at boot",
            ),
        )
    elif root.exists(vfio.UDEV_RULE):
        actions.append(
            RemoveFile(vfio.UDEV_RULE, "IDs are unambiguous now; per-device overrides not needed")
        )
    return actions, notes, bool(per_device)


def _binding_actions(
    root: HostRoot, host: Host, sel: Selection, drivers: dict[str, str], notes: list[str]
) -> list[Action]:
    """vfio-pci at boot for the selection: modprobe.d, the udev rule, the initramfs. Files
    first, commands after them (the initramfs reads modprobe.d)."""
    actions, bind_notes, rule = _binding(root, host, sel, drivers)
    notes += bind_notes
    init_writes, rebuild, init_notes = vfio.initramfs_actions(root, host, rule)
    notes += init_notes
    for write in init_writes:
        actions += _write_if_changed(root, write)
    # the image carries modprobe.d and the udev rule as well: any change above rebuilds it
    if rebuild is not None and actions:
        actions.append(rebuild)
    return actions


def _refuse_nixos(root: HostRoot, host: Host, sel: Selection, target: ArgChange) -> None:
    """NixOS: refused with the configuration.nix lines, before anything is planned."""
    deps = vfio.softdeps(root, host, sel.functions)
    ids = [] if sel.ids_ambiguous else list(sel.vfio_ids)
    removed = [a for a in host.kernel.cmdline if key_of(a) in target.drop]
    raise NixosRefused(configuration_lines(target, removed, vfio.modprobe_conf(ids, deps)))


def make_plan(root: HostRoot, host: Host, opts: PlanOptions) -> tuple[Plan, Selection]:
    hugepages_note = check_hugepages(opts.hugepages_1g, host)
    if opts.iommu_only:
        sel = Selection([], [], [], False, False, ["IOMMU only: no card is bound"])
    else:
        verdicts = analyse(host).verdicts
        sel = select(
            host,
            verdicts,
            list(opts.gpus),
            opts.include_group,
            opts.allow_boot_gpu,
            opts.nvswitches,
        )
    drivers = vfio_drivers(root, host.kernel.release, sel.functions)
    sel = variants_apart(sel, drivers)
    loader = for_host(root, host)
    kopts = KargOptions(
        iommu_pt=opts.iommu_pt,
        vfio_ids=() if sel.ids_ambiguous else tuple(sel.vfio_ids),
        variant_ids=tuple(
            sorted({f.id for f in sel.functions if drivers[str(f.address)] != PLAIN})
        ),
        boot_gpu=sel.boot_gpu,
        hugepages_1g=opts.hugepages_1g,
        release_hugepages=opts.release_hugepages,
    )
    try:
        configured = loader.configured() if loader else list(host.kernel.cmdline)
    except GrubUnknown as unknown:  # name what to add by hand, as for an unknown loader
        missing = needed(list(host.kernel.cmdline), desired(host, kopts, host.kernel.cmdline))
        raise GrubUnknown(unknown.why, list(missing.set.values())) from None
    target = desired(host, kopts, configured)
    if host.boot.bootloader is BootloaderKind.NIXOS:
        _refuse_nixos(root, host, sel, target)
    warnings = _warning_notes(sel.findings)
    notes = [*warnings, *opts.notes, *sel.notes]
    if hugepages_note:
        notes.append(hugepages_note)
    actions = [] if opts.iommu_only else _binding_actions(root, host, sel, drivers, notes)
    preflight_notes(root, host, sel.functions, notes)  # the holders, and drivers told
    change = ArgChange()
    if loader is None:
        missing = needed(list(host.kernel.cmdline), target)
        if not missing.is_empty():
            raise UnknownBootloader(
                list(missing.set.values()) + [f"(remove {k})" for k in sorted(missing.drop)],
                direct=host.boot.direct,
            )
    else:
        change, loader_actions, loader_notes = loader.change_for(
            configured, lambda args: desired(host, kopts, args)
        )
        actions += loader_actions
        notes += loader_notes
    cards = [
        PlannedCard(
            address=str(v.gpu.address),
            name=v.gpu.primary.name,
            functions=tuple(str(f.address) for f in v.gpu.functions),
        )
        for v in sel.cards
    ]
    plan = Plan(
        root=root.path,
        actions=actions,
        reboot=bool(actions),
        kernel_args=change,
        cards=cards,
        bootloader=loader.name if loader else BootloaderKind.UNKNOWN,
        initramfs=host.boot.initramfs,
        binding=Binding.DRIVER_OVERRIDE if sel.ids_ambiguous else Binding.IDS,
        target_args=target,
        functions=[str(f.address) for f in sel.functions],
        notes=notes,
        drivers=drivers,
        warnings=warnings,
    )
    return plan, sel
