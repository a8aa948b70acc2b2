# SPDX-License-Identifier: Apache-2.0
"""Frozen, typed facts shared by every stage of the pipeline.

Discovery produces these; analysis, planning and rendering only read them.
"""

from __future__ import annotations

from dataclasses import field
from enum import StrEnum

from passthrough.guest.virt import NOT_A_VM, VirtualMachine
from passthrough.pciaddr import PciAddress as PciAddress  # the one type, re-exported
from passthrough.pciclass import (
    CLASS_DISPLAY,
    SUBCLASS_HOST_BRIDGE,
    SUBCLASS_PCI_BRIDGE,
    SUBCLASS_PCI_BRIDGE_SEMI,
)
from passthrough.records import frozen


@frozen(slots=True)
class Bar:
    """One memory or I/O region of a function, from the sysfs ``resource`` file."""

    index: int
    size: int
    is_io: bool
    is_64bit: bool
    prefetchable: bool


# Server management controllers whose VGA is the host console (never a candidate).
BMC_VGA_VENDORS = {0x1A03: "ASPEED", 0x102B: "Matrox"}
NVIDIA = 0x10DE


@frozen(slots=True)
class PciFunction:
    """One PCI function as sysfs shows it: IDs, class, driver, IOMMU group, BARs, parents."""

    address: PciAddress
    vendor_id: int
    device_id: int
    subsystem_vendor_id: int | None
    subsystem_device_id: int | None
    class_code: int  # 24 bits: base class, subclass, programming interface
    driver: str | None
    iommu_group: int | None
    numa_node: int | None
    boot_vga: bool | None
    reset_methods: tuple[str, ...] | None  # None: the kernel does not report them (< 5.15)
    bars: tuple[Bar, ...]
    parents: tuple[PciAddress, ...]  # upstream bridges, root port first
    physfn: PciAddress | None  # set on an SR-IOV virtual function
    sriov_totalvfs: int | None
    modalias: str | None
    sysfs_path: str  # real device path relative to the root, e.g. sys/devices/pci0000:00/...
    vendor_name: str | None = None
    device_name: str | None = None
    # an SR-IOV VF that NVIDIA's vGPU manager serves (nvidia/current_vgpu_type, or
    # mdev_supported_types): it stays on the nvidia driver, never on vfio-pci
    vgpu_vf: bool = False

    @property
    def id(self) -> str:
        return f"{self.vendor_id:04x}:{self.device_id:04x}"

    @property
    def class_hex(self) -> str:
        return f"0x{self.class_code:06x}"

    @property
    def subclass(self) -> int:
        return self.class_code >> 8

    @property
    def base_class(self) -> int:
        return self.class_code >> 16

    @property
    def is_display(self) -> bool:
        return self.base_class == CLASS_DISPLAY

    @property
    def is_bridge_like(self) -> bool:
        """Bridges that may share a group with a card without being assigned.

        Host bridges and PCI-to-PCI bridges (root ports, switch ports) are never
        handed to a guest; an ISA/LPC bridge or an "other" bridge (NVSwitch) is a
        real device and counts as a group member.
        """
        return self.subclass in (
            SUBCLASS_HOST_BRIDGE,
            SUBCLASS_PCI_BRIDGE,
            SUBCLASS_PCI_BRIDGE_SEMI,
        )

    @property
    def name(self) -> str:
        vendor = self.vendor_name or f"vendor {self.vendor_id:04x}"
        device = self.device_name or f"device {self.device_id:04x}"
        return f"{vendor} {device}"

    @property
    def max_bar(self) -> int:
        return max((b.size for b in self.bars if not b.is_io), default=0)


@frozen(slots=True)
class IommuGroup:
    """An IOMMU group and the functions in it."""

    number: int
    members: tuple[PciAddress, ...]


@frozen(slots=True)
class Cpu:
    """The CPU's vendor, model and hardware virtualization flag."""

    vendor: str | None  # GenuineIntel, AuthenticAMD, ...
    model: str | None
    virt_flag: str | None  # vmx, svm or None
    logical_cpus: int
    phys_bits: int | None = None  # /proc/cpuinfo "address sizes: N bits physical"


@frozen(slots=True)
class VfioCdev:
    """A function bound to vfio-pci and its vfio device cdev (Linux 6.6+, CONFIG_VFIO_DEVICE_CDEV):
    the name the kernel gave it under the function's ``vfio-dev/`` and whether the node
    ``/dev/vfio/devices/<name>`` that iommufd users open exists."""

    address: PciAddress
    name: str | None  # vfioN; None: no vfio-dev/ entry in sysfs
    dev_node: bool  # /dev/vfio/devices/<name> exists


@frozen(slots=True)
class Iommu:
    """What the firmware describes and the kernel made of the IOMMU."""

    units: tuple[str, ...]  # sys/class/iommu entries: dmar0, ivhd0, ...
    acpi_tables: tuple[str, ...]  # DMAR / IVRS present in firmware
    groups: int  # populated groups in sys/kernel/iommu_groups
    interrupt_remapping: bool | None  # None: cannot tell
    interrupt_remapping_evidence: str
    allow_unsafe_interrupts: bool | None
    # the narrowest DMA address width of the IOMMU units (Intel VT-d MGAW); None: unknown
    address_bits: int | None = None
    # iommufd (Linux 6.2+): /dev/iommu, its module's sysfs directory (loaded or built in),
    # and the device cdev of each function bound to vfio-pci
    dev_iommu: bool = False
    iommufd_module: bool = False
    vfio_cdevs: tuple[VfioCdev, ...] = ()


@frozen(slots=True)
class Kernel:
    """The running (or root's) kernel: release, command line, the config options we read."""

    release: str | None
    cmdline: tuple[str, ...]
    config: dict[str, str] = field(hash=False, compare=True)  # CONFIG_* of interest
    config_source: str | None = None
    vfio_pci: str | None = None  # "builtin", "module", "loaded" or None

    def arg(self, key: str) -> str | None:
        """Value of the last ``key=value`` (or ``key`` alone → "") on the command line."""
        found: str | None = None
        for token in self.cmdline:
            name, sep, value = token.partition("=")
            if name == key:
                found = value if sep else ""
        return found


@frozen(slots=True)
class Distro:
    """The distribution, from os-release."""

    id: str | None
    id_like: tuple[str, ...]
    version_id: str | None
    pretty_name: str | None


class BootloaderKind(StrEnum):
    GRUB = "grub"
    GRUBBY = "grubby"
    SYSTEMD_BOOT = "systemd-boot"
    PROXMOX = "proxmox-boot-tool"
    KERNELSTUB = "kernelstub"
    RPM_OSTREE = "rpm-ostree"
    NIXOS = "nixos"  # /etc is generated from configuration.nix: nothing of ours is written
    UNKNOWN = "unknown"


class InitramfsKind(StrEnum):
    INITRAMFS_TOOLS = "initramfs-tools"
    DRACUT = "dracut"
    MKINITCPIO = "mkinitcpio"
    NONE_FOUND = "unknown"


@frozen(slots=True)
class GrubReading:
    """How this host's own grub-mkconfig reads its configuration, learnt from its text."""

    script: str | None  # /usr/sbin/grub-mkconfig (or grub2-mkconfig); None: not found
    dropins: bool | None  # sources /etc/default/grub.d/*.cfg; None: cannot be told
    why: str  # what was found, or why it cannot be told
    regenerate: tuple[str, ...]  # the command that writes grub.cfg
    grub_cfg: str  # relative to the root: boot/grub/grub.cfg or boot/grub2/grub.cfg


@frozen(slots=True)
class Boot:
    """How this root boots: UEFI or not, its bootloader and initramfs tool, and why we think so."""

    uefi: bool
    bootloader: BootloaderKind
    bootloader_evidence: tuple[str, ...]
    initramfs: InitramfsKind
    initramfs_evidence: tuple[str, ...]
    grub: GrubReading | None = None  # GRUB hosts only

    @property
    def direct(self) -> bool:
        """No bootloader and no kernel on the disk: what starts the machine boots it."""
        return self.bootloader is BootloaderKind.UNKNOWN and DIRECT_BOOT in self.bootloader_evidence


# read_boot's evidence for a machine whose kernel its hypervisor loads (Boot.direct)
DIRECT_BOOT = (
    "no bootloader and no kernel image in /boot: whatever starts this machine loads its "
    "kernel directly (a hypervisor's -kernel, Firecracker, a cloud VM's boot source) and "
    "gives it its command line"
)


@frozen(slots=True)
class Critical:
    """PCI functions the host cannot live without."""

    root_device: str | None  # /dev/nvme0n1p2
    root_pci: tuple[PciAddress, ...]
    default_nic: str | None  # interface name of the default route
    nic_pci: tuple[PciAddress, ...]


@frozen(slots=True)
class Dmi:
    """The DMI fields that tell a laptop, a server or a virtual machine apart."""

    chassis_type: int | None
    sys_vendor: str | None
    product_name: str | None

    @property
    def is_portable(self) -> bool:
        # SMBIOS chassis types: 8 portable, 9 laptop, 10 notebook, 14 sub notebook,
        # 30 tablet, 31 convertible, 32 detachable.
        return self.chassis_type in {8, 9, 10, 14, 30, 31, 32}


@frozen(slots=True)
class LibvirtDaemon:
    """A libvirt daemon's systemd unit as the root has it (main file and drop-ins): the
    locked-memory limit it runs under and whether it may raise a child's above that."""

    unit: str  # libvirtd.service, virtqemud.service
    path: str  # the unit file that defines it (drop-ins applied on top)
    memlock: int | None  # LimitMEMLOCK's hard value in bytes; None: infinity or not set
    memlock_text: str  # as written ("64M"); "" when not set
    memlock_from: str  # the file whose LimitMEMLOCK= line wins (a drop-in, or path); "" unset
    can_raise: bool  # root with CAP_SYS_RESOURCE: libvirt's prlimit may go above memlock
    why_capped: str  # when it cannot: "as User=libvirt", "without CAP_SYS_RESOURCE"
    enabled: bool  # linked into a .wants directory under etc/systemd/system


@frozen(slots=True)
class Host:
    """Everything discovery read from one root: the input of every check, plan and render."""

    root: str
    cpu: Cpu
    kvm: bool
    iommu: Iommu
    kernel: Kernel
    distro: Distro
    boot: Boot
    critical: Critical
    dmi: Dmi
    functions: tuple[PciFunction, ...]
    groups: tuple[IommuGroup, ...]
    problems: tuple[str, ...] = ()  # things discovery tolerated (dangling links, ...)
    numa_cpus: dict[int, tuple[int, ...]] = field(default_factory=dict, hash=False)  # node → CPUs
    memory_mib: int | None = None  # MemTotal of /proc/meminfo; None: not known (a bare tree)
    machine: VirtualMachine = NOT_A_VM  # whether this root is itself a virtual machine
    # installed libvirt/QEMU/OVMF packages (dpkg: name → version), and where dpkg does not
    # say, what the live host's tools said (libvirt/qemu → version); see host/packages.py
    packages: dict[str, str] = field(default_factory=dict, hash=False)
    tool_versions: dict[str, str] = field(default_factory=dict, hash=False)
    libvirt_daemons: tuple[LibvirtDaemon, ...] = ()  # libvirtd/virtqemud units (host/daemons.py)

    @property
    def group_index(self) -> dict[int, IommuGroup]:
        return {g.number: g for g in self.groups}

    def function(self, address: PciAddress) -> PciFunction | None:
        for f in self.functions:
            if f.address == address:
                return f
        return None

    @property
    def acs_override(self) -> str | None:
        return self.kernel.arg("pcie_acs_override")


@frozen(slots=True)
class Gpu:
    """A card: the display function and the functions that belong to it (see
    ``analysis.viability.find_gpus``): never another vendor's device on its slot."""

    primary: PciFunction
    functions: tuple[PciFunction, ...]

    @property
    def address(self) -> PciAddress:
        return self.primary.address

    @property
    def groups(self) -> tuple[int, ...]:
        return tuple(sorted({f.iommu_group for f in self.functions if f.iommu_group is not None}))

    @property
    def vfio_ids(self) -> tuple[str, ...]:
        ids: list[str] = []
        for f in self.functions:
            if not f.is_bridge_like and f.id not in ids:
                ids.append(f.id)
        return tuple(ids)


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@frozen(slots=True)
class Finding:
    """One judgement about the host or a guest: code decides, the message only explains.

    ``code`` is stable (tests and tools match on it, e.g. ``group-shared``,
    ``root-disk-in-group``); ``devices`` are the functions it is about.
    """

    code: str
    severity: Severity
    message: str
    devices: tuple[PciAddress, ...] = ()


class Level(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"  # not applicable here (a host check inside a guest), with the reason
    INFO = "INFO"  # an optional feature this host lacks: nothing to fix for passthrough itself


@frozen(slots=True)
class CheckResult:
    """One readiness check's level, summary and fix."""

    id: str
    level: Level
    summary: str
    fix: str | None = None


@frozen(slots=True)
class GpuVerdict:
    """A card and what the safety policy (``analysis/policy.py``) says about it."""

    gpu: Gpu
    group_members: tuple[PciAddress, ...]
    findings: tuple[Finding, ...]

    @property
    def viable(self) -> bool:
        return not any(f.severity is Severity.ERROR for f in self.findings)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why not viable: the messages of the refusals."""
        return tuple(f.message for f in self.findings if f.severity is Severity.ERROR)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(f.message for f in self.findings if f.severity is not Severity.ERROR)

    @property
    def codes(self) -> frozenset[str]:
        return frozenset(f.code for f in self.findings)
