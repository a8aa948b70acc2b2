# SPDX-License-Identifier: Apache-2.0
"""A guest's specification, built from discovery and options; every decision made here.

The template only loops and branches over what this module computed: guest PCI
addresses, the MMIO window, vCPU pins, hiding, the profile's Hyper-V enlightenments and clock,
the CPU mode. Every value is checked against the options
table (options.py) and against the host before any rendering, the field named.
"""

from __future__ import annotations

from pathlib import Path

from passthrough.analysis import codes, policy
from passthrough.analysis.cards import NoSuchCard, choose_cards
from passthrough.analysis.nvswitch import told as nvswitch_told
from passthrough.analysis.nvswitch import with_nvswitches
from passthrough.errors import NotAHostRoot
from passthrough.host.facts import read_thread_siblings
from passthrough.host.qemu import qemu_of
from passthrough.host.root import HostRoot
from passthrough.model import GpuVerdict, Host, PciAddress, PciFunction, Severity
from passthrough.records import frozen
from passthrough.vm.install import Install, build_install
from passthrough.vm.layout import Layout, plan_layout
from passthrough.vm.options import (
    DEFAULT_VENDOR_ID,
    BadVmSpec,
    check_against_host,
    check_options,
)
from passthrough.vm.versions import Versions, host_versions

NO_NETWORK = "none"  # --network none: a guest without a NIC


@frozen
class GuestFunction:
    host: PciAddress
    guest_bus: int
    function: int
    multifunction: bool
    id: str
    name: str
    display: bool = False  # the card's GPU (class 03): the one a ROM file is for


@frozen
class GuestCard:
    port_index: int  # the pcie-root-port controller's index (= the guest bus)
    port_slot: int  # where that root port sits on pcie-root (bus 0)
    port_function: int
    functions: tuple[GuestFunction, ...]

    @property
    def port_multifunction(self) -> bool:
        return self.port_function == 0

    @property
    def port_number(self) -> int:
        return 0x10 + self.port_index


@frozen
class Enlightenment:
    """A Hyper-V enlightenment the guest gets, on; ``retries`` only for spinlocks."""

    name: str
    retries: int | None = None


# What a Windows guest gets (its scheduler, timers and TLB flushes go through Hyper-V's
# paravirtual interfaces); a Linux guest needs none of them for a GPU.
WINDOWS_ENLIGHTENMENTS = (
    Enlightenment("relaxed"),
    Enlightenment("vapic"),
    Enlightenment("spinlocks", retries=8191),
    Enlightenment("vpindex"),
    Enlightenment("runtime"),
    Enlightenment("synic"),
    Enlightenment("stimer"),
    Enlightenment("reset"),
    Enlightenment("frequencies"),
    Enlightenment("tlbflush"),
    Enlightenment("ipi"),
)
# QEMU sets VP_INDEX through KVM only (under TCG it refuses to start: "kernel doesn't allow
# setting HyperV VP_INDEX"), and these need it (QEMU's docs/system/i386/hyperv.rst)
NEEDS_VPINDEX = frozenset({"vpindex", "synic", "stimer", "tlbflush", "ipi"})
# host-passthrough needs KVM; under TCG the closest is QEMU's "max" model (libvirt: maximum)
CPU_MODES = {"kvm": "host-passthrough", "qemu": "maximum"}


@frozen
class VmOptions:
    name: str
    vcpus: int = 4
    memory_mib: int = 8192
    gpus: tuple[str, ...] = ()
    nvswitches: tuple[str, ...] = ()  # the whole NVLink domain in this guest (analysis/nvswitch)
    disk: str | None = None  # an existing image or volume path
    base_image: str | None = None  # a cloud image: a qcow2 overlay is made on it at define time
    image_dir: str = "/var/lib/libvirt/images"
    bridge: str | None = None
    network: str | None = "default"
    seed: str | None = None  # cloud-init seed ISO
    profile: str = "linux"  # linux | windows
    hide: bool = True
    vendor_id: str = DEFAULT_VENDOR_ID
    hide_hypervisor_cpuid: bool = False
    rom: str = "on"  # on | off | a ROM file path
    hugepages: bool = False
    numa_pin: bool = True
    virt_type: str = "kvm"  # kvm | qemu (software emulation: labs and CI without /dev/kvm)
    overcommit: bool = False  # allow more guest memory than the host's RAM
    iommufd: bool = False  # hostdevs on iommufd instead of the legacy vfio container
    no_gpu: bool = False  # a guest without a card, asked for: none found is no refusal then
    # what the guest is installed and run with (vm/install.py); None: the profile decides
    cdrom: str | None = None
    driver_iso: str | None = None
    disk_bus: str | None = None
    secure_boot: bool | None = None
    tpm: bool | None = None
    usb_input: bool | None = None
    graphics: str | None = None
    headless: bool = False
    topology: bool = True


@frozen
class VmSpec:
    name: str
    vcpus: int
    memory_mib: int
    cards: tuple[GuestCard, ...]
    profile: str
    hide: bool
    vendor_id: str
    hide_hypervisor_cpuid: bool
    rom: str
    hugepages: bool
    disk: str | None
    disk_format: str
    base_image: str | None
    overlay: str | None  # where the overlay on base_image goes
    bridge: str | None
    network: str | None
    seed: str | None
    mmio_window_mib: int | None
    numa_node: int | None
    vcpu_pins: tuple[tuple[int, str], ...]
    emulator_cpus: str | None
    virt_type: str = "kvm"
    # what the profile, hiding and virt_type decide; the template only prints these
    cpu_mode: str = "host-passthrough"
    enlightenments: tuple[Enlightenment, ...] = ()
    hyperv_vendor_id: str | None = None  # <vendor_id> inside <hyperv>, when hidden
    kvm_hidden: bool = False
    vmport_off: bool = False
    clock_offset: str = "utc"  # Windows keeps the RTC in local time
    hyperv_clock: bool = False
    warnings: tuple[str, ...] = ()
    layout: Layout | None = None  # the address planner's decisions (vm/layout.py)
    iommufd: bool = False  # each hostdev's <driver iommufd='yes'/>
    install: Install | None = None  # emulator, topology, firmware, TPM, drives (vm/install.py)


def _cpuset(cpus: tuple[int, ...]) -> str:
    """(0,1,2,3,8) → ``0-3,8``."""
    parts: list[str] = []
    start = prev = None
    for c in sorted(cpus):
        if start is None:
            start = prev = c
        elif prev is not None and c == prev + 1:
            prev = c
        else:
            parts.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = c
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(parts)


def _check_files(opts: VmOptions) -> None:
    for field_name in ("disk", "base_image", "seed", "cdrom", "driver_iso"):
        value = getattr(opts, field_name)
        if value is not None and not Path(value).exists():
            raise BadVmSpec(field_name, f"{value} does not exist")
    if opts.disk and opts.base_image:
        raise BadVmSpec(
            "disk", "give either an existing disk or a base image for an overlay, not both"
        )


def _choose(host: Host, opts: VmOptions) -> tuple[list[GpuVerdict], list[str]]:
    """The cards named (default: every viable NVIDIA GPU), and the policy's warnings."""
    if opts.no_gpu and opts.gpus:
        raise BadVmSpec("no_gpu", "a guest without a card names no card (leave out --gpu)")
    if opts.no_gpu and opts.nvswitches:
        raise BadVmSpec("no_gpu", "NVSwitches go to a guest with every GPU (leave out --no-gpu)")
    if opts.no_gpu:
        return [], []  # without a card, whatever cards the host has (none is taken)
    # a guest with no card is rendered only when asked for: an empty guest is no success
    try:
        verdicts = policy.judge_all(host)
        chosen = choose_cards(verdicts, opts.gpus)
    except NoSuchCard as exc:
        if opts.gpus:
            raise
        raise NoSuchCard(f"{exc}; --no-gpu renders a guest without one") from None
    chosen = with_nvswitches(host, verdicts, chosen, opts.nvswitches)
    # One verdict with validate --host-root: what it would reject is refused here, and the
    # warnings scan gives these cards are told. A boot VGA is a warning in both: the host
    # may have been set up for it (plan's --allow-boot-gpu).
    findings = policy.verdict_findings(
        host, (f.address for v in chosen for f in v.gpu.functions), allow_boot_gpu=True
    )
    refused = codes.refusals(findings, codes.PREPARED)
    if refused:
        raise policy.Refused(refused)
    # a large BAR is the address planner's to handle: it sizes the window (its notes say
    # how) or refuses, so render has nothing left to warn about (validate tells it as info
    # on a domain whose window holds it)
    told = [
        f
        for f in nvswitch_told(findings, chosen)
        if f.severity is Severity.WARNING and f.code != codes.LARGE_BAR
    ]
    return chosen, [f"{f.message} [{f.code}]" for f in told]


def _guest_functions(primary: PciAddress, members: list[PciFunction]) -> dict[PciAddress, int]:
    """Guest function numbers on the card's one guest slot: the functions of the primary's
    host slot keep theirs; a function behind the card's own switch (Intel Arc's audio at
    04:00.0 beside the GPU at 03:00.0) takes the lowest number left, never a second 0."""
    numbers = {f.address: f.address.function for f in members if f.address.slot == primary.slot}
    free = [n for n in range(8) if n not in numbers.values()]
    for f in members:
        if f.address not in numbers:
            if not free:
                raise BadVmSpec("gpu", f"{primary}: more than 8 functions for one guest slot")
            numbers[f.address] = free.pop(0)
    return numbers


def _guest_cards(
    chosen: list[GpuVerdict],
) -> tuple[list[GuestCard], list[list[PciFunction]]]:
    """Each card on its own root port, and per port the functions the guest gets."""
    cards: list[GuestCard] = []
    functions: list[list[PciFunction]] = []
    for i, v in enumerate(chosen):
        port = i + 1
        members = [f for f in v.gpu.functions if not f.is_bridge_like]
        numbers = _guest_functions(v.gpu.address, members)
        fns = tuple(
            GuestFunction(
                host=f.address,
                guest_bus=port,
                function=numbers[f.address],
                multifunction=numbers[f.address] == 0 and len(members) > 1,
                id=f.id,
                name=f.name,
                display=f.is_display,
            )
            for f in members
        )
        # root ports packed eight to a slot on pcie-root, as virt-install lays them out
        cards.append(
            GuestCard(port_index=port, port_slot=1 + i // 8, port_function=i % 8, functions=fns)
        )
        functions.append([f for f in v.gpu.functions if not f.is_bridge_like])
    return cards, functions


def _numa(
    host: Host, opts: VmOptions, chosen: list[GpuVerdict], warnings: list[str]
) -> tuple[int | None, list[tuple[int, str]], str | None]:
    """Pin to the GPUs' node when they share one: (node, vCPU pins, emulator cpuset)."""
    nodes = {v.gpu.primary.numa_node for v in chosen if v.gpu.primary.numa_node is not None}
    node = nodes.pop() if len(nodes) == 1 else None
    pins: list[tuple[int, str]] = []
    emulator = None
    if len({v.gpu.primary.numa_node for v in chosen}) > 1:
        warnings.append("the GPUs sit on different NUMA nodes: vCPUs and memory are not pinned")
    if node is not None and opts.numa_pin and node in host.numa_cpus:
        cpus = host.numa_cpus[node]
        if opts.vcpus > len(cpus):
            warnings.append(
                f"{opts.vcpus} vCPUs on NUMA node {node}, which has {len(cpus)} CPUs: they will share"
            )
        pins = [(i, str(cpus[i % len(cpus)])) for i in range(opts.vcpus)]
        emulator = _cpuset(cpus)
    elif node is not None and opts.numa_pin:
        warnings.append(f"NUMA node {node} has no CPU list in sysfs: not pinned")
    return node, pins, emulator


def smt_order(
    cpus: tuple[int, ...], siblings: dict[int, tuple[int, ...]], threads: int
) -> tuple[int, ...] | None:
    """The node's CPUs in the order vCPUs take them when the guest's topology has ``threads``
    threads a core: each run of ``threads`` vCPUs (one guest core) on the threads of one host
    core, so what the guest schedules as siblings shares a core's caches on the host as well.
    Cores whose threads are not all in the node come after; None when sysfs names no core of
    ``threads`` threads among them."""
    groups: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for cpu in cpus:
        if cpu in seen:
            continue
        group = tuple(c for c in siblings.get(cpu, ()) if c in cpus)
        if len(group) == threads and cpu in group:
            groups.append(group)
            seen.update(group)
    if not groups:
        return None
    return tuple(c for g in groups for c in g) + tuple(c for c in cpus if c not in seen)


def _align_pins(
    host: Host, node: int | None, pins: list[tuple[int, str]], install: Install, warnings: list[str]
) -> list[tuple[int, str]]:
    """The vCPU pins re-laid on host cores when the guest is told it has SMT threads."""
    threads = install.topology.threads
    if not pins or node is None or not install.topology_element or threads < 2:
        return pins
    cpus = host.numa_cpus[node]
    try:
        siblings = read_thread_siblings(HostRoot(host.root), cpus)
    except NotAHostRoot:  # a host built in memory: no sysfs to ask
        siblings = {}
    order = smt_order(cpus, siblings, threads)
    if order is None:
        warnings.append(
            f"the guest has {threads} threads a core but this root's sysfs names no host core "
            f"of {threads} threads on NUMA node {node}: vCPU pins are not aligned to cores"
        )
        return pins
    return [(i, str(order[i % len(order)])) for i, _ in pins]


def nothing_to_boot(spec: VmSpec) -> str | None:
    """The warning for a libvirt guest with no disk: it boots from disk (``<boot dev='hd'/>``)
    and has none, so it starts into the firmware's shell. (KubeVirt's boots from its PVC.)"""
    if spec.disk or spec.base_image or (spec.install and spec.install.boot_dev is None):
        return None
    return (
        "nothing to boot: no --disk or --base-image, so <boot dev='hd'/> finds no disk "
        "(add a disk to the domain before `vm define --start`)"
    )


def build_spec(host: Host, opts: VmOptions, versions: Versions | None = None) -> VmSpec:
    # types, ranges and patterns from the options table, then what only the host can say
    check_options({f: getattr(opts, f) for f in VmOptions.__dataclass_fields__})
    unchecked = check_against_host(host, opts.vcpus, opts.memory_mib, opts.overcommit)
    _check_files(opts)
    chosen, policy_warnings = _choose(host, opts)
    warnings = list(unchecked) + policy_warnings
    if opts.rom not in ("on", "off") and not Path(opts.rom).is_file():
        # a warning, not a refusal: the domain may be for another machine (render --root
        # of its snapshot), where the file is; libvirt defines it either way, its start fails
        warnings.append(
            f"ROM file {opts.rom} does not exist on this machine: the guest cannot start "
            "where it is missing"
        )
    cards, functions = _guest_cards(chosen)
    node, pins, emulator = _numa(host, opts, chosen, warnings)
    # refuses (exit 2) a layout the guest cannot address, before anything is rendered
    layout = plan_layout(
        functions,
        host_bits=host.cpu.phys_bits,
        iommu_bits=host.iommu.address_bits,
        cpu_vendor=host.cpu.vendor,
        memory_mib=opts.memory_mib,
        versions=versions if versions is not None else host_versions(host),
        virt_type=opts.virt_type,
    )
    windows = opts.profile == "windows"
    disk_format = "raw" if opts.disk and opts.disk.endswith((".img", ".raw")) else "qcow2"
    overlay = f"{opts.image_dir.rstrip('/')}/{opts.name}.qcow2" if opts.base_image else None
    install = build_install(opts, qemu_of(host.root), opts.disk or overlay, disk_format, warnings)
    pins = _align_pins(host, node, pins, install, warnings)
    if opts.iommufd:
        _check_iommufd(host, versions if versions is not None else host_versions(host))
    return VmSpec(
        name=opts.name,
        vcpus=opts.vcpus,
        memory_mib=opts.memory_mib,
        cards=tuple(cards),
        profile=opts.profile,
        hide=opts.hide,
        vendor_id=opts.vendor_id,
        hide_hypervisor_cpuid=opts.hide_hypervisor_cpuid,
        rom=opts.rom,
        hugepages=opts.hugepages,
        disk=opts.disk,
        disk_format=disk_format,
        base_image=opts.base_image,
        overlay=overlay,
        bridge=opts.bridge,
        network=None if opts.bridge or opts.network == NO_NETWORK else opts.network,
        seed=opts.seed,
        mmio_window_mib=layout.fwcfg_mib,
        numa_node=node if pins else None,
        vcpu_pins=tuple(pins),
        emulator_cpus=emulator,
        virt_type=opts.virt_type,
        cpu_mode=CPU_MODES[opts.virt_type],
        enlightenments=tuple(
            e
            for e in (WINDOWS_ENLIGHTENMENTS if windows else ())
            if opts.virt_type == "kvm" or e.name not in NEEDS_VPINDEX
        ),
        hyperv_vendor_id=opts.vendor_id if opts.hide else None,
        kvm_hidden=opts.hide,
        vmport_off=windows,
        clock_offset="localtime" if windows else "utc",
        hyperv_clock=windows,
        warnings=tuple(warnings),
        layout=layout,
        iommufd=opts.iommufd,
        install=install,
    )


def _check_iommufd(host: Host, versions: Versions) -> None:
    """Refuses (exit 2) a guest on iommufd that this host, its QEMU or its libvirt cannot run."""
    from passthrough.analysis.checks import iommufd_node_lacks
    from passthrough.vm.versions import iommufd_lacks

    lacks = iommufd_node_lacks(host)
    lacks += iommufd_lacks(versions)
    if lacks:
        raise BadVmSpec("iommufd", "this host cannot run it: " + "; ".join(lacks))
