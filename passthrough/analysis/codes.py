"""The safety policy's and the address planner's finding codes with what each means: a
module of plain data, so that ``validate`` knows every code it can report before it reads
a file (its rule catalogue) without importing the policy itself."""

from __future__ import annotations

BMC_VGA = "bmc-vga"
NO_IOMMU = "no-iommu"
NO_IOMMU_GROUP = "no-iommu-group"
GROUP_SHARED = "group-shared"
GROUP_OTHER_GPU = "group-other-gpu"
ROOT_DISK = "root-disk-in-group"
ROUTE_NIC = "route-nic-in-group"
BRIDGE_SELECTED = "bridge-selected"
UNKNOWN_DEVICE = "unknown-device"
BOOT_GPU = "boot-gpu"
ONLY_GPU = "only-gpu"
ACS_OVERRIDE = "acs-override"
NO_RESET = "no-reset"
LARGE_BAR = "large-bar"
INTEL_IGPU = "intel-igpu"
NVSWITCH = "nvswitch"
LAPTOP_3D = "laptop-3d"
SRIOV_VF = "sriov-vf"
VFIO_BOUND = "vfio-bound"
VFIO_PARTLY = "vfio-partly"

CODES: dict[str, str] = {
    BMC_VGA: "the BMC's VGA (ASPEED, Matrox) is the host console: never handed over",
    NO_IOMMU: "no IOMMU groups: the IOMMU is off or absent (plan turns it on; re-check after)",
    NO_IOMMU_GROUP: "a function has no IOMMU group while others do: it cannot be isolated",
    GROUP_SHARED: "the IOMMU group holds a device outside the card: the guest would take it too",
    GROUP_OTHER_GPU: "the IOMMU group holds another GPU: both cards would go to one guest",
    ROOT_DISK: "the root disk's controller is in the group: the host would lose its root fs",
    ROUTE_NIC: "the default route's NIC is in the group: the host would lose the network",
    BRIDGE_SELECTED: "a PCI bridge or root port was selected: bridges stay with the host",
    UNKNOWN_DEVICE: "the address names no PCI function on this host",
    BOOT_GPU: "the boot VGA: needs --allow-boot-gpu and the console moved off it",
    ONLY_GPU: "the host's only display controller: the host keeps no local display",
    ACS_OVERRIDE: "pcie_acs_override is in effect: the groups are synthetic, isolation is not real",
    NO_RESET: "no reset method: the card may not survive a guest reboot",
    LARGE_BAR: "a BAR of 32 GiB or more: the guest needs a larger 64-bit MMIO window",
    INTEL_IGPU: "an Intel integrated GPU: GVT-d needs legacy IGD setup (not targeted)",
    NVSWITCH: "an NVSwitch system: NVLink needs the whole fabric or Fabric Manager on the host",
    LAPTOP_3D: "a laptop 3D controller (Optimus): no display outputs, may need the ACPI vBIOS",
    SRIOV_VF: "an SR-IOV virtual function: a GPU of its own, its physical function named",
    VFIO_BOUND: "already bound to vfio-pci",
    VFIO_PARTLY: "only some functions are bound to vfio-pci",
}

# Refused whatever the flags: handing these over harms the host itself.
HOST_HARM = frozenset({BMC_VGA, ROOT_DISK, ROUTE_NIC, BRIDGE_SELECTED, UNKNOWN_DEVICE})

# What validate reports as an error among these (the others are warnings there: a boot VGA
# the host was prepared for, a large BAR, ...); each finding still carries its own severity.
VALIDATE_ERRORS = HOST_HARM | {GROUP_SHARED, GROUP_OTHER_GPU, NO_IOMMU, NO_IOMMU_GROUP}

# Told as information, not as a warning.
INFO_CODES = frozenset({VFIO_BOUND})

# What the address check of a domain (vm/layout_check.py) can say.
LAYOUT_CODES: dict[str, str] = {
    "mmio-window-too-small": "the guest firmware's 64-bit window cannot hold the hostdevs' BARs",
    "mmio-window-above-limit": "the window needed does not fit below the guest's address limit",
    "guest-bits-above-iommu": "guest physical address bits beyond what the host IOMMU maps: "
    "QEMU's DMA mappings fail",
}

# What the memlock estimate of a domain (vm/memlock.py) can say: a warning wherever it is told.
MEMLOCK_SHORT = "memlock-short"
MEMLOCK_CODES: dict[str, str] = {
    MEMLOCK_SHORT: "the locked-memory limit that applies (the domain's hard_limit, or a daemon's "
    "LimitMEMLOCK it cannot raise) is below what libvirt's rule says the VFIO devices pin",
}
