"""After the reboot: did the host come back the way the last apply meant it to?"""

from __future__ import annotations

from passthrough.errors import PassthroughError
from passthrough.execute.apply import last_applied
from passthrough.host.root import HostRoot
from passthrough.model import CheckResult, Host, Level
from passthrough.plan import vfio
from passthrough.plan.actions import Binding, PlanRecord
from passthrough.plan.kargs import key_of


class NothingApplied(PassthroughError):
    def __init__(self, root: str) -> None:
        super().__init__(
            f"nothing has been applied to {root} (no complete transaction in the journal)"
        )


def verify(root: HostRoot, host: Host) -> list[CheckResult]:
    record = last_applied(root)  # the plan of the newest complete apply
    if record is None:
        raise NothingApplied(root.path)
    return [
        _kernel_args(host, record),
        _iommu(host),
        *(_bound(host, record, addr) for addr in record.functions),
        _host_devices(host),
    ]


def _kernel_args(host: Host, record: PlanRecord) -> CheckResult:
    running = list(host.kernel.cmdline)
    running_keys = {key_of(a) for a in running}
    wanted = list(record.kernel_args.set.values())
    missing = [a for a in wanted if a not in running]
    stale = sorted(k for k in record.kernel_args.drop if k in running_keys)
    if missing or stale:
        return CheckResult(
            "kernel-args",
            Level.FAIL,
            "the running kernel lacks "
            + " ".join(missing)
            + (f"; still has {' '.join(stale)}" if stale else ""),
            "reboot into the updated boot entry (passthrough apply changed it); check the bootloader's default entry",
        )
    return CheckResult(
        "kernel-args",
        Level.PASS,
        "running kernel has " + (" ".join(wanted) or "the planned arguments"),
    )


def _iommu(host: Host) -> CheckResult:
    if host.iommu.groups:
        return CheckResult("iommu-enabled", Level.PASS, f"IOMMU on: {host.iommu.groups} groups")
    return CheckResult(
        "iommu-enabled",
        Level.FAIL,
        "no IOMMU groups after the reboot",
        "enable VT-d/AMD-Vi in the firmware setup",
    )


def _bound(host: Host, record: PlanRecord, addr: str) -> CheckResult:
    """Is the planned function on vfio-pci, and if not, where to look."""
    f = next((f for f in host.functions if str(f.address) == addr), None)
    if f is None:
        return CheckResult(
            f"vfio {addr}",
            Level.FAIL,
            "function is gone from the PCI bus",
            "check the card is seated and powered",
        )
    if f.driver == "vfio-pci":
        return CheckResult(f"vfio {addr}", Level.PASS, f"{f.id} bound to vfio-pci")
    return CheckResult(
        f"vfio {addr}",
        Level.FAIL,
        f"{f.id} bound to {f.driver or 'no driver'}, not vfio-pci",
        (
            f"a host driver claimed it: check that /{vfio.UDEV_RULE} has a line for {addr} "
            "and that the initramfs was rebuilt after it changed"
            if record.binding is Binding.DRIVER_OVERRIDE
            else "a host driver claimed it first: check the softdeps in "
            f"/{vfio.MODPROBE} reached the initramfs"
        ),
    )


def _host_devices(host: Host) -> CheckResult:
    critical = set(host.critical.root_pci) | set(host.critical.nic_pci)
    taken = [
        a for a in critical if (fn := host.function(a)) is not None and fn.driver == "vfio-pci"
    ]
    if taken:
        return CheckResult(
            "host-devices",
            Level.FAIL,
            "vfio-pci took " + ", ".join(map(str, taken)),
            "run `passthrough undo` and reboot",
        )
    return CheckResult(
        "host-devices", Level.PASS, "root disk and default-route NIC stay with the host"
    )
