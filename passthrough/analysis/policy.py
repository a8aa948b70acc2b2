# SPDX-License-Identifier: Apache-2.0
"""The safety policy: the one place that decides what may be handed to a guest.

Every refusal and warning is a :class:`~passthrough.model.Finding` with a stable code
(docs/discovery.md "Safety policy"). scan and check read a card's findings; plan, bind, render,
validate and the Ansible modules ask :func:`selection_findings` about the exact set of
functions a guest would take, so a direct selection, a group expansion and a hand-written
domain XML meet the same refusals.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from itertools import islice

from passthrough.analysis import viability

# every code is the policy's too (policy.LARGE_BAR, policy.POLICY): callers name them here
from passthrough.analysis.codes import *  # noqa: F403
from passthrough.analysis.codes import (
    ACS_OVERRIDE,
    ALLOW_BOOT_GPU,
    BMC_VGA,
    BOOT_GPU,
    BRIDGE_SELECTED,
    GROUP_OTHER_GPU,
    GROUP_SHARED,
    LAPTOP_3D,
    LARGE_BAR,
    NO_IOMMU,
    NO_IOMMU_GROUP,
    NO_RESET,
    NVSWITCH,
    ONLY_GPU,
    ROOT_DISK,
    ROUTE_NIC,
    SRIOV_VF,
    UNKNOWN_DEVICE,
    VFIO_BOUND,
    VFIO_PARTLY,
    VGPU_VF,
    harms_host,
    severity,
)
from passthrough.analysis.viability import (
    describe,
    find_gpus,
    mmio_window,
)
from passthrough.errors import PassthroughError
from passthrough.host.modalias import is_vfio
from passthrough.kernel import kernel_version
from passthrough.model import (
    BMC_VGA_VENDORS,
    NVIDIA,
    Finding,
    Gpu,
    GpuVerdict,
    Host,
    IommuGroup,
    PciAddress,
    PciFunction,
    Severity,
)
from passthrough.pciclass import SUBCLASS_3D, SUBCLASS_OTHER_BRIDGE
from passthrough.records import frozen
from passthrough.units import format_size


def _finding(
    code: str, message: str, devices: tuple[PciAddress, ...], overrides: Collection[str] = ()
) -> Finding:
    """A finding with the severity the policy table (``analysis/codes.py``) gives its code."""
    return Finding(code, Severity(severity(code, overrides)), message, devices)


class Refused(PassthroughError):
    """Nothing is written: the policy refuses. Carries the findings that decided it."""

    def __init__(self, findings: Sequence[Finding], hint: str = "") -> None:
        # what no flag can override is told first
        self.findings = tuple(sorted(findings, key=lambda f: not harms_host(f.code)))
        first = self.findings[0]
        others = [c for c in dict.fromkeys(f.code for f in self.findings) if c != first.code]
        more = f" (also: {', '.join(others)})" if others else ""
        super().__init__(f"{first.message} [{first.code}]{more}{hint}")

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.code for f in self.findings))


@frozen
class HostIndex:
    """Lookups built once per host, not once per card (a 2,000-function host has hundreds)."""

    by_addr: dict[PciAddress, PciFunction]
    groups: dict[int, IommuGroup]
    nvswitches: tuple[PciFunction, ...]
    vgpu_pfs: frozenset[PciAddress]  # cards whose VFs NVIDIA's vGPU manager serves

    @classmethod
    def of(cls, host: Host) -> HostIndex:
        return cls(
            {f.address: f for f in host.functions},
            host.group_index,
            tuple(
                f
                for f in host.functions
                if f.vendor_id == NVIDIA and f.subclass == SUBCLASS_OTHER_BRIDGE
            ),
            frozenset(f.physfn for f in host.functions if f.vgpu_vf and f.physfn),
        )


def _console_arg(host: Host) -> str:
    simplefb = host.kernel.config.get("CONFIG_SYSFB_SIMPLEFB") == "y"
    return "initcall_blacklist=sysfb_init" if simplefb else "video=efifb:off"


def _group_findings(
    taken: set[PciAddress],
    number: int,
    members: Sequence[PciAddress],
    by_addr: dict[PciAddress, PciFunction],
) -> list[Finding]:
    """What a guest taking ``taken`` would also drag along from group ``number``."""
    found: list[Finding] = []
    others = [
        by_addr[a]
        for a in members
        if a not in taken and a in by_addr and not by_addr[a].is_bridge_like
    ]
    gpu_slots = {f.address.slot for f in others if f.is_display}
    for other in others:
        if other.address.slot in gpu_slots:
            if not other.is_display:
                continue  # told with its card below
            siblings = [
                str(f.address)
                for f in others
                if f.address.slot == other.address.slot and f is not other
            ]
            extra = f" with its functions {', '.join(siblings)}" if siblings else ""
            found.append(
                _finding(
                    GROUP_OTHER_GPU,
                    f"IOMMU group {number} also holds another GPU: {describe(other)}{extra}; "
                    "both cards would have to go to the same guest",
                    (other.address,),
                )
            )
        else:
            found.append(
                _finding(
                    GROUP_SHARED,
                    f"IOMMU group {number} also holds a device outside the card: "
                    f"{describe(other)}; it would have to go to the same guest",
                    (other.address,),
                )
            )
    return found


def _critical(host: Host, where: str, addresses: Iterable[PciAddress]) -> list[Finding]:
    found: list[Finding] = []
    for addr in addresses:
        if addr in host.critical.root_pci:
            found.append(
                _finding(
                    ROOT_DISK,
                    f"{where} holds the host's root-disk controller {addr} "
                    f"({host.critical.root_device or '/'}): binding it to vfio-pci would cut "
                    "the host off its root filesystem — refused",
                    (addr,),
                )
            )
        if addr in host.critical.nic_pci:
            found.append(
                _finding(
                    ROUTE_NIC,
                    f"{where} holds the default-route NIC {addr} ({host.critical.default_nic}): "
                    "binding it to vfio-pci would cut the host off the network — refused",
                    (addr,),
                )
            )
    return found


def _function_findings(fn: PciFunction) -> list[Finding]:
    """What no guest may take whatever its group: the BMC's VGA, bridges."""
    found: list[Finding] = []
    if fn.is_display and fn.vendor_id in BMC_VGA_VENDORS:
        bmc = BMC_VGA_VENDORS[fn.vendor_id]
        why = f"{fn.address}: server management VGA ({bmc}): the host console through the BMC"
        found.append(_finding(BMC_VGA, why + ", never a candidate", (fn.address,)))
    if fn.is_bridge_like:
        why = f"{describe(fn)} is a bridge: bridges and root ports stay with the host"
        found.append(_finding(BRIDGE_SELECTED, why, (fn.address,)))
    if fn.vgpu_vf:
        why = (
            f"{fn.address}: a vGPU virtual function of {fn.physfn}, served by NVIDIA's vGPU "
            "manager on the nvidia driver: binding it to vfio-pci would destroy its vGPU; "
            "hand it to a guest with `passthrough render --vgpu`"
        )
        found.append(_finding(VGPU_VF, why, (fn.address,)))
    return found


def _grouping_findings(
    host: Host, index: HostIndex, taken: set[PciAddress], chosen: list[PciFunction]
) -> list[Finding]:
    """No IOMMU, functions outside any group, and what each group taken shares."""
    found: list[Finding] = []
    if not host.groups:
        if chosen:
            why = (
                "inside a virtual machine with no IOMMU: its GPU is passed through to this "
                "guest and cannot be passed on (`passthrough guest check` checks it)"
                if host.machine.guest
                else "no IOMMU groups on this host: the IOMMU is off or absent"
            )
            found.append(_finding(NO_IOMMU, why, tuple(f.address for f in chosen)))
        found += _critical(host, "the selection", (f.address for f in chosen))
        return found
    ungrouped = [f for f in chosen if f.iommu_group is None and not f.is_bridge_like]
    if ungrouped:
        found.append(
            _finding(
                NO_IOMMU_GROUP,
                "no IOMMU group for " + ", ".join(str(f.address) for f in ungrouped),
                tuple(f.address for f in ungrouped),
            )
        )
    for number in sorted({f.iommu_group for f in chosen if f.iommu_group is not None}):
        members = index.groups[number].members
        found += _group_findings(taken, number, members, index.by_addr)
        found += _critical(host, f"IOMMU group {number}", members)
    return found


def _boot_vga_finding(host: Host, fn: PciFunction, allow_boot_gpu: bool) -> Finding:
    why = (
        "boot VGA: firmware and the host console draw on it; handing it over needs the console "
        f"moved off it ({_console_arg(host)}) and may need the card's ROM for the guest"
        if allow_boot_gpu
        else f"{fn.address} is the boot VGA (the host console draws on it); "
        "--allow-boot-gpu takes it knowingly"
    )
    overrides = (ALLOW_BOOT_GPU,) if allow_boot_gpu else ()
    return _finding(BOOT_GPU, why, (fn.address,), overrides)


def selection_findings(
    host: Host,
    addresses: Iterable[PciAddress],
    allow_boot_gpu: bool = False,
    index: HostIndex | None = None,
) -> list[Finding]:
    """The policy on any set of functions a guest would take (a plan's cards, a domain's
    hostdevs): errors refuse it, warnings are told."""
    index = index or HostIndex.of(host)
    taken = set(addresses)
    found: list[Finding] = []
    chosen: list[PciFunction] = []
    for addr in sorted(taken):
        fn = index.by_addr.get(addr)
        if fn is None:
            found.append(
                _finding(UNKNOWN_DEVICE, f"{addr} is no PCI function on this host", (addr,))
            )
            continue
        chosen.append(fn)
        found += _function_findings(fn)
        if addr in index.vgpu_pfs:
            why = (
                f"{addr}: its SR-IOV VFs serve vGPUs (NVIDIA's vGPU manager): binding the card "
                "to vfio-pci would take every vGPU away; `passthrough vgpu undo` first"
            )
            found.append(_finding(VGPU_VF, why, (addr,)))
    found += _grouping_findings(host, index, taken, chosen)
    found += [
        _boot_vga_finding(host, fn, allow_boot_gpu)
        for fn in chosen
        if fn.is_display and fn.boot_vga and fn.vendor_id not in BMC_VGA_VENDORS
    ]
    return found


def card_findings(host: Host, gpu: Gpu, all_gpus: Sequence[Gpu], index: HostIndex) -> list[Finding]:
    """Everything scan says about one card: refusals first, then warnings."""
    found = selection_findings(host, (f.address for f in gpu.functions), True, index)
    if any(f.code == BMC_VGA for f in found):
        return [f for f in found if f.severity is Severity.ERROR]
    found.sort(key=lambda f: f.severity is not Severity.ERROR)  # stable: refusals first
    return found + card_warnings(host, gpu, all_gpus, index)


def verdict_findings(
    host: Host, addresses: Iterable[PciAddress], allow_boot_gpu: bool = True
) -> list[Finding]:
    """The one verdict on what a guest takes, for render and validate alike: the policy on
    the exact selection (:func:`selection_findings`) and, for every card it touches, the
    warnings scan gives that card (:func:`card_warnings`)."""
    index = HostIndex.of(host)
    taken = set(addresses)
    found = selection_findings(host, taken, allow_boot_gpu, index)
    gpus = find_gpus(host)
    for gpu in gpus:
        if any(f.address in taken for f in gpu.functions):
            found += card_warnings(host, gpu, gpus, index)
    return found


def _displays(gpus: Sequence[Gpu]) -> int:
    """How many of ``gpus`` have a display output, counted up to two: linear in cards."""
    return len(list(islice((g for g in gpus if g.primary.subclass != SUBCLASS_3D), 2)))


def card_warnings(host: Host, gpu: Gpu, all_gpus: Sequence[Gpu], index: HostIndex) -> list[Finding]:
    """What scan tells about a card beyond the refusals: display, reset, BARs, fabric."""
    primary = gpu.primary
    found: list[Finding] = []
    if primary.vendor_id in BMC_VGA_VENDORS and primary.is_display:
        return found  # never a candidate: the refusal says all
    if host.machine.guest and not host.groups:
        # a guest's own GPU cannot be passed on: what passing it on would need is no advice
        return found

    def warn(code: str, message: str) -> None:
        found.append(_finding(code, message, (primary.address,)))

    # A 3D controller (0x0302, e.g. a data-centre GPU) has no display output: handing it over
    # takes no console away, and it does not count as one of the host's displays.
    if primary.subclass != SUBCLASS_3D and _displays(all_gpus) == 1:
        warn(ONLY_GPU, "the host's only display controller: the host keeps no local display")
    if host.acs_override is not None:
        warn(
            ACS_OVERRIDE,
            f"pcie_acs_override={host.acs_override} is in effect: these IOMMU groups are "
            "synthetic and the isolation they suggest is not real",
        )
    version = kernel_version(host.kernel.release)
    if primary.reset_methods == () or (
        primary.reset_methods is None and version is not None and version >= (5, 15)
    ):
        warn(
            NO_RESET,
            "no reset method (sysfs reset_method is empty): the card may not survive a guest "
            "reboot or a VM restart",
        )
    large = [
        (f, b)
        for f in gpu.functions
        for b in f.bars
        if not b.is_io and b.size >= viability.LARGE_BAR
    ]
    if large:
        _fn, bar = max(large, key=lambda fb: fb[1].size)
        warn(
            LARGE_BAR,
            f"BAR{bar.index} is {format_size(bar.size)}: the guest needs a 64-bit MMIO window "
            f"of at least {format_size(mmio_window(gpu))} for this card (pcihole64 and OVMF "
            "X-PciMmio64Mb), more than OVMF's old 32 GiB default",
        )
    if igpu := viability.integrated(gpu, index.by_addr):
        warn(*igpu)
    if index.nvswitches and primary.vendor_id == NVIDIA:
        warn(
            NVSWITCH,
            f"NVSwitch system ({len(index.nvswitches)} NVSwitches): NVLink needs either every GPU and "
            "NVSwitch in one guest (Fabric Manager inside it) or GPUs only with Fabric Manager "
            "on the host (shared NVSwitch)",
        )
    if host.dmi.is_portable and primary.subclass == SUBCLASS_3D:
        warn(
            LAPTOP_3D,
            "laptop 3D controller (Optimus/muxless): no display outputs of its own; the guest "
            "gets rendering and compute only, and its driver may need the vBIOS from ACPI",
        )
    if primary.physfn is not None:
        warn(SRIOV_VF, f"SR-IOV virtual function of {primary.physfn}")
    if handed := _handed_over(gpu):
        warn(*handed)
    return found


def _handed_over(gpu: Gpu) -> tuple[str, str] | None:
    """vfio-bound or vfio-partly: on vfio-pci or a variant (nvgrace_gpu_vfio_pci...) either way."""
    bound = {str(f.driver) for f in gpu.functions if is_vfio(f.driver)}
    if bound and all(is_vfio(f.driver) for f in gpu.functions):
        to = f"vfio ({', '.join(sorted(bound))})" if bound != {"vfio-pci"} else "vfio-pci"
        return VFIO_BOUND, f"already bound to {to}: ready for a guest"
    drivers = ", ".join(f"{f.address} → {f.driver or 'no driver'}" for f in gpu.functions)
    return (VFIO_PARTLY, f"partly bound to vfio-pci: {drivers}") if bound else None


def judge(
    host: Host, gpu: Gpu, all_gpus: Sequence[Gpu], index: HostIndex | None = None
) -> GpuVerdict:
    index = index or HostIndex.of(host)
    members = sorted({a for n in gpu.groups if n in index.groups for a in index.groups[n].members})
    return GpuVerdict(
        gpu=gpu,
        group_members=tuple(members),
        findings=tuple(card_findings(host, gpu, all_gpus, index)),
    )


def judge_all(host: Host) -> list[GpuVerdict]:
    gpus = find_gpus(host)
    index = HostIndex.of(host)
    return [judge(host, g, gpus, index) for g in gpus]
