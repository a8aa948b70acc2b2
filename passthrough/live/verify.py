# SPDX-License-Identifier: Apache-2.0
"""After the reboot: did the host come back the way the last apply meant it to?"""

from __future__ import annotations

import shlex

from passthrough.actions import Binding, PlanRecord
from passthrough.analysis.checks import iommu_enabled
from passthrough.analysis.viability import find_gpus
from passthrough.errors import count
from passthrough.host.modalias import is_vfio
from passthrough.host.root import HostRoot
from passthrough.journal.applied import last_applied
from passthrough.journal.journal import Journal, TxKind, TxState
from passthrough.journal.status import status
from passthrough.kargs import key_of
from passthrough.model import CheckResult, Host, Level
from passthrough.plan import vfio
from passthrough.vgpu.verify import layout_checks

# the kernel arguments that say how the IOMMU and vfio-pci are set up
IOMMU_KEYS = ("intel_iommu", "amd_iommu", "iommu", "vfio-pci.ids", "vfio_iommu_type1")
# the arguments that hand devices to vfio: ours alone (the IOMMU ones may be the host's own)
VFIO_KEYS = ("vfio-pci.ids",)


def verify(root: HostRoot, host: Host) -> list[CheckResult]:
    """The host against the newest complete apply's plan; on a host passthrough never
    prepared (by hand, another tool), against what a passthrough host needs; and, where a
    vGPU layout is recorded, one line on it (the command and the fleet's verify alike)."""
    vgpu = layout_checks(root)
    return [*_cards(root, host, bool(vgpu)), *vgpu]


def _cards(root: HostRoot, host: Host, vgpu: bool) -> list[CheckResult]:
    """verify's lines on the cards and the boot (``vgpu``: a vGPU layout is recorded, the
    host hands out vGPUs, not whole cards)."""
    record = last_applied(root)  # the plan of the newest complete apply
    if record is None:
        undone = last_undone(root)
        return by_hand(host, vgpu) if undone is None else after_undo(root, host, *undone)
    ours = set(record.functions)
    pending = [shlex.join(p.argv) for p in status(root).pending]
    checks = [
        _kernel_args(host, record),
        iommu_enabled(host),
        *(_bound(host, record, addr, bool(pending)) for addr in record.functions),
        *(
            CheckResult(
                f"vfio {f.address}", Level.PASS, f"{f.id} bound to {f.driver} (not by passthrough)"
            )
            for f in host.functions
            if is_vfio(f.driver) and str(f.address) not in ours
        ),
        _host_devices(host),
    ]
    if not pending:
        return checks
    # commands the apply never ran explain what fails: told first, as status lists them (a
    # boot that shows everything in place was regenerated some other way: a warning then)
    failed = any(c.level is Level.FAIL for c in checks)
    return [_pending(pending, Level.FAIL if failed else Level.WARN), *checks]


def last_undone(root: HostRoot) -> tuple[str, PlanRecord] | None:
    """The newest apply that undo took back (its id and plan), when no apply is live."""
    for tx in reversed(Journal.load(root).transactions):
        if tx.kind is TxKind.APPLY and tx.state is TxState.UNDONE and tx.record:
            return tx.id, tx.record
    return None


def after_undo(root: HostRoot, host: Host, tx_id: str, record: PlanRecord) -> list[CheckResult]:
    """verify on a host whose apply was undone: nothing of ours is left on the running
    host — no vfio binding argument live, none of the cards on vfio-pci."""
    pending = [shlex.join(p.argv) for p in status(root).pending]
    ours = [a for a in record.kernel_args.set.values() if key_of(a) in VFIO_KEYS]
    live = [a for a in ours if a in host.kernel.cmdline]
    by_addr = {str(f.address): f for f in host.functions}
    held = [
        f"{a} on {by_addr[a].driver}"
        for a in record.functions
        if a in by_addr and is_vfio(by_addr[a].driver)
    ]
    reboot = "reboot into the restored boot entry (undo took it out of the next boot)"
    if pending:
        reboot = (
            "run the undo's pending commands inside the root (`passthrough status`), then reboot"
        )
    results = [
        CheckResult(
            "origin",
            Level.SKIP,
            f"the host was undone (apply {tx_id} taken back by `passthrough undo`): checking "
            "that nothing of ours is left",
        ),
        CheckResult("kernel-args", Level.FAIL, "still live: " + " ".join(live), reboot)
        if live
        else CheckResult(
            "kernel-args",
            Level.PASS,
            "none of our vfio arguments live" + (f" ({' '.join(ours)} gone)" if ours else ""),
        ),
        CheckResult("vfio", Level.FAIL, "still on vfio: " + ", ".join(held), reboot)
        if held
        else CheckResult(
            "vfio",
            Level.PASS,
            f"none of the {count(len(record.functions), 'function')} apply handed over is on vfio",
        ),
    ]
    if pending:
        failed = any(c.level is Level.FAIL for c in results)
        results.insert(1, _pending(pending, Level.FAIL if failed else Level.WARN, "the undo"))
    return results


def by_hand(host: Host, vgpu: bool = False) -> list[CheckResult]:
    """verify on a host passthrough did not prepare: what is live, whoever set it up. With
    ``vgpu`` (a vGPU layout recorded), no card on vfio-pci is no failure: the VFs of a vGPU
    card stay on the nvidia driver."""
    live = [a for a in host.kernel.cmdline if key_of(a) in IOMMU_KEYS]
    bound = [f for f in host.functions if is_vfio(f.driver)]
    results = [
        CheckResult(
            "origin",
            Level.SKIP,
            "no passthrough apply in the journal (prepared by hand or by another tool): "
            "checking what the host has",
        ),
        CheckResult(
            "kernel-args",
            Level.PASS,
            "IOMMU and vfio arguments live: " + (" ".join(live) or "none (kernel defaults)"),
        ),
        iommu_enabled(host),
    ]
    if not bound and vgpu:
        results.append(
            CheckResult(
                "vfio",
                Level.SKIP,
                "no function is bound to vfio-pci: this host hands out vGPUs (their VFs stay "
                "on the nvidia driver; the vgpu line checks them)",
            )
        )
    elif not bound:
        results.append(
            CheckResult(
                "vfio",
                Level.FAIL,
                "no function is bound to vfio-pci",
                "passthrough plan && passthrough apply (at boot), or passthrough bind (now)",
            )
        )
    results += [
        CheckResult(f"vfio {f.address}", Level.PASS, f"{f.id} bound to {f.driver}") for f in bound
    ]
    for gpu in find_gpus(host):
        drivers = {str(f.address): f.driver or "no driver" for f in gpu.functions}
        on_vfio = [a for a, d in drivers.items() if is_vfio(d)]
        if on_vfio and len(on_vfio) < len(drivers):
            others = ", ".join(f"{a} on {d}" for a, d in drivers.items() if not is_vfio(d))
            results.append(
                CheckResult(
                    f"card {gpu.address}",
                    Level.WARN,
                    f"only part of the card is on vfio-pci: {others}",
                    "every function of a card goes to the same guest: bind them all "
                    f"(passthrough plan --gpu {gpu.address})",
                )
            )
    results.append(_host_devices(host))
    return results


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


def _pending(pending: list[str], level: Level, of: str = "the apply") -> CheckResult:
    rerun = " or `passthrough apply`" if of == "the apply" else " or `passthrough undo`"
    return CheckResult(
        "pending",
        level,
        f"{count(len(pending), 'command')} of {of} never ran: {'; '.join(pending)}",
        f"run them (inside the root; `passthrough status` lists them),{rerun} "
        "where commands can run, then reboot",
    )


def _bound(host: Host, record: PlanRecord, addr: str, pending: bool = False) -> CheckResult:
    """Is the planned function on vfio-pci, and if not, where to look."""
    f = next((f for f in host.functions if str(f.address) == addr), None)
    if f is None:
        return CheckResult(
            f"vfio {addr}",
            Level.FAIL,
            "function is gone from the PCI bus",
            "check the card is seated and powered",
        )
    want = record.driver(addr)
    if f.driver == want:
        return CheckResult(f"vfio {addr}", Level.PASS, f"{f.id} bound to {want}")
    return CheckResult(
        f"vfio {addr}",
        Level.FAIL,
        f"{f.id} bound to {f.driver or 'no driver'}, not {want}",
        (
            f"a host driver claimed it: check that /{vfio.UDEV_RULE} has a line for {addr} "
            "and that the initramfs was rebuilt after it changed"
            + (" (the pending commands above rebuild it)" if pending else "")
            if record.binding is Binding.DRIVER_OVERRIDE or want != "vfio-pci"
            else "the pending commands above never ran, so the boot lacks what "
            f"/{vfio.MODPROBE} binds: run them, then reboot"
            if pending
            else "a host driver claimed it first: check the softdeps in "
            f"/{vfio.MODPROBE} reached the initramfs"
        ),
    )


def _host_devices(host: Host) -> CheckResult:
    critical = set(host.critical.root_pci) | set(host.critical.nic_pci)
    taken = [a for a in critical if (fn := host.function(a)) is not None and is_vfio(fn.driver)]
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
