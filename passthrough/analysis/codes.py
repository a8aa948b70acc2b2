# SPDX-License-Identifier: Apache-2.0
"""Every finding code of the safety policy and of the address check, with what decides
about it: one table (:data:`POLICY`), read by the policy that makes the findings, by plan,
bind, render, kubevirt preflight and validate when they judge them. A code's entry says how
grave it is, whether handing the device over harms the host itself, and which flag (if any)
lifts it; :func:`severity`, :func:`blocks` and :func:`refusals` answer from it, so no caller
keeps its own set of codes.

Plain data: ``validate`` builds its rule catalogue from this table before it reads a file,
and that start-up pays for neither ``typing`` nor ``dataclasses`` (hence a slotted class,
immutable all the same).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Iterable
    from typing import Literal, Protocol, TypeVar

    SeverityName = Literal["error", "warning", "info"]  # passthrough.model.Severity's values
    Layer = Literal["policy", "layout", "memlock"]

    class _Coded(Protocol):
        @property
        def code(self) -> str: ...

    F = TypeVar("F", bound=_Coded)

# the safety policy's codes (analysis/policy.py)
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
APU_IGPU = "apu-igpu"
NVSWITCH = "nvswitch"
LAPTOP_3D = "laptop-3d"
SRIOV_VF = "sriov-vf"
VGPU_VF = "vgpu-vf"
VFIO_BOUND = "vfio-bound"
VFIO_PARTLY = "vfio-partly"
# the address check's codes (vm/layout_check.py)
MMIO_TOO_SMALL = "mmio-window-too-small"
MMIO_ABOVE_LIMIT = "mmio-window-above-limit"
BITS_ABOVE_IOMMU = "guest-bits-above-iommu"
# the memlock estimate's codes (vm/memlock.py): a hard_limit below libvirt's rule is a
# warning (the rule keeps a margin); a daemon that cannot raise QEMU's limit to what libvirt
# sets is an error (libvirt's prlimit fails and the guest does not start)
MEMLOCK_SHORT = "memlock-short"
MEMLOCK_CAPPED = "memlock-capped"

# What lifts a refusal: a command-line flag, or the plan itself (it turns the IOMMU on, so
# a host whose IOMMU is off is no refusal for ``plan``; its groups are judged after the reboot).
ALLOW_BOOT_GPU = "--allow-boot-gpu"
INCLUDE_GROUP = "--include-group"
PLAN = "plan"

# validate cannot know how the host was prepared: a boot VGA is told there, not refused
# (the same holds for render and kubevirt, which judge what plan already bound)
PREPARED = frozenset({ALLOW_BOOT_GPU})


class Policy:
    """What decides about one code: its ``severity`` when no flag lifts it, whether handing
    the device over ``harms_host`` (refused whatever the flags), the ``override`` that turns
    the refusal into a warning (None: nothing does), whether the device's isolation from
    the host is not what its group suggests (``unsafe``: a warning for a guest someone
    chooses knowingly, but nothing declares the host ready for guests over it: kubevirt's
    node label), and what the code means."""

    __slots__ = ("harms_host", "layer", "meaning", "override", "severity", "unsafe")

    severity: SeverityName
    harms_host: bool
    override: str | None
    layer: Layer
    meaning: str
    unsafe: bool

    def __init__(
        self,
        severity: SeverityName,
        meaning: str,
        *,
        harms_host: bool = False,
        override: str | None = None,
        layer: Layer = "policy",
        unsafe: bool = False,
    ) -> None:
        if harms_host and override is not None:
            raise ValueError("what harms the host has no override")
        for name, value in (
            ("severity", severity),
            ("meaning", meaning),
            ("harms_host", harms_host),
            ("override", override),
            ("layer", layer),
            ("unsafe", unsafe),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Policy is immutable: {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Policy is immutable: {name}")

    def __repr__(self) -> str:
        return (
            f"Policy({self.severity!r}, harms_host={self.harms_host}, "
            f"override={self.override!r}, layer={self.layer!r})"
        )


def _error(
    meaning: str, *, harms_host: bool = False, override: str | None = None, layer: Layer = "policy"
) -> Policy:
    return Policy("error", meaning, harms_host=harms_host, override=override, layer=layer)


def _warning(meaning: str, *, unsafe: bool = False) -> Policy:
    return Policy("warning", meaning, unsafe=unsafe)


POLICY: dict[str, Policy] = {
    BMC_VGA: _error(
        "the BMC's VGA (ASPEED, Matrox) is the host console: never handed over", harms_host=True
    ),
    NO_IOMMU: _error(
        "no IOMMU groups: the IOMMU is off or absent (plan turns it on; re-check after)",
        override=PLAN,
    ),
    NO_IOMMU_GROUP: _error("a function has no IOMMU group while others do: it cannot be isolated"),
    GROUP_SHARED: _error(
        "the IOMMU group holds a device outside the card: the guest would take it too",
        override=INCLUDE_GROUP,
    ),
    GROUP_OTHER_GPU: _error(
        "the IOMMU group holds another GPU: both cards would go to one guest",
        override=INCLUDE_GROUP,
    ),
    ROOT_DISK: _error(
        "the root disk's controller is in the group: the host would lose its root fs",
        harms_host=True,
    ),
    ROUTE_NIC: _error(
        "the default route's NIC is in the group: the host would lose the network",
        harms_host=True,
    ),
    BRIDGE_SELECTED: _error(
        "a PCI bridge or root port was selected: bridges stay with the host", harms_host=True
    ),
    UNKNOWN_DEVICE: _error("the address names no PCI function on this host", harms_host=True),
    BOOT_GPU: _error(
        "the boot VGA: needs --allow-boot-gpu and the console moved off it",
        override=ALLOW_BOOT_GPU,
    ),
    ONLY_GPU: _warning("the host's only display controller: the host keeps no local display"),
    ACS_OVERRIDE: _warning(
        "pcie_acs_override is in effect: the groups are synthetic, isolation is not real",
        unsafe=True,
    ),
    NO_RESET: _warning("no reset method: the card may not survive a guest reboot"),
    LARGE_BAR: _warning("a BAR of 32 GiB or more: the guest needs a larger 64-bit MMIO window"),
    INTEL_IGPU: _warning("an Intel integrated GPU: GVT-d needs legacy IGD setup (not targeted)"),
    APU_IGPU: _warning("an APU's integrated GPU, on the CPU's own slot (not targeted)"),
    NVSWITCH: _warning(
        "an NVSwitch system: NVLink needs the whole fabric or Fabric Manager on the host"
    ),
    LAPTOP_3D: _warning(
        "a laptop 3D controller (Optimus): no display outputs, may need the ACPI vBIOS"
    ),
    SRIOV_VF: _warning("an SR-IOV virtual function: a GPU of its own, its physical function named"),
    VGPU_VF: _error(
        "a vGPU virtual function: it stays on the nvidia driver (passthrough vgpu, render --vgpu)"
    ),
    VFIO_BOUND: Policy("info", "already bound to vfio-pci"),
    VFIO_PARTLY: _warning("only some functions are bound to vfio-pci"),
    MMIO_TOO_SMALL: _error(
        "the guest firmware's 64-bit window cannot hold the hostdevs' BARs", layer="layout"
    ),
    MMIO_ABOVE_LIMIT: _error(
        "the window needed does not fit below the guest's address limit", layer="layout"
    ),
    BITS_ABOVE_IOMMU: _error(
        "guest physical address bits beyond what the host IOMMU maps: QEMU's DMA mappings fail",
        layer="layout",
    ),
    MEMLOCK_SHORT: Policy(
        "warning",
        "the domain's hard_limit (QEMU's locked-memory limit) is below what libvirt's rule "
        "says the VFIO devices pin",
        layer="memlock",
    ),
    MEMLOCK_CAPPED: _error(
        "a libvirt daemon that cannot raise QEMU's locked-memory limit (no CAP_SYS_RESOURCE, "
        "a session daemon) is capped below what libvirt sets for the VFIO devices: the guest "
        "does not start",
        layer="memlock",
    ),
}


def severity(code: str, overrides: Collection[str] = ()) -> SeverityName:
    """How grave ``code`` is with these flags in effect: a refusal its override lifts is
    told as a warning. A code outside the table is a KeyError (a test keeps them in)."""
    entry = POLICY[code]
    if entry.severity == "error" and entry.override is not None and entry.override in overrides:
        return "warning"
    return entry.severity


def blocks(code: str, overrides: Collection[str] = ()) -> bool:
    """Whether ``code`` refuses the selection with these flags in effect."""
    return severity(code, overrides) == "error"


def harms_host(code: str) -> bool:
    """Whether handing over what ``code`` is about harms the host (no flag lifts it)."""
    return POLICY[code].harms_host


def refusals(findings: Iterable[F], overrides: Collection[str] = ()) -> list[F]:
    """The findings that refuse with these flags in effect, in their order."""
    return [f for f in findings if blocks(f.code, overrides)]


def unsafe_for_guest(findings: Iterable[F], overrides: Collection[str] = ()) -> list[F]:
    """The findings that make a card unsafe for a guest with these flags in effect: its
    refusals, and the warnings whose isolation is not real. What declares a host ready for
    guests (kubevirt's node label) is withheld over any of them."""
    return [f for f in findings if blocks(f.code, overrides) or POLICY[f.code].unsafe]


def lifted_by(refused: Iterable[_Coded]) -> set[str | None]:
    """The overrides that would lift these refusals (None for any that nothing lifts)."""
    return {POLICY[f.code].override for f in refused}
