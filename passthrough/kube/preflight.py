# SPDX-License-Identifier: Apache-2.0
"""``passthrough kubevirt preflight``: what a node must show before it is labelled for GPU
passthrough VMs — every function of each card on vfio-pci (or on no driver yet), the cards'
IOMMU groups viable under the same policy as plan and render, the large-BAR fit of a
KubeVirt guest, and then the mode label to set. A check-style report: codes, levels, fixes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from passthrough.analysis import codes, policy
from passthrough.analysis.cards import choose_cards
from passthrough.analysis.levels import finding_level
from passthrough.analysis.nvswitch import NvswitchRefused, told, with_nvswitches
from passthrough.errors import PassthroughError, count
from passthrough.kube.build import refuse_laptop
from passthrough.kube.layout import plan_kubevirt
from passthrough.model import CheckResult, GpuVerdict, Host, Level, Severity
from passthrough.output.json import checks_json
from passthrough.pciclass import SUBCLASS_OTHER_BRIDGE

BOUND = "kube-vfio-bound"
MODE_LABEL = "kube-mode-label"
WORKLOAD_LABEL = "nvidia.com/gpu.workload.config"
VFIO_DRIVERS = frozenset({"vfio-pci", "nvgrace_gpu_vfio_pci", "nvgrace-gpu-vfio-pci"})


@dataclass
class Preflight:
    checks: list[CheckResult] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    route: str = "device-plugin"

    @property
    def ok(self) -> bool:
        return not any(c.level is Level.FAIL for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "schema": "passthrough.kubevirt-preflight/v1",
            "ok": self.ok,
            "route": self.route,
            "labels": self.labels,
            "checks": checks_json(self.checks),
        }


def _bound(v: GpuVerdict) -> CheckResult:
    held = [
        f for f in v.gpu.functions if not f.is_bridge_like and f.driver not in VFIO_DRIVERS | {None}
    ]
    where = v.gpu.primary.address
    if held:
        # the label is not the way to bind here: kube-mode-label withholds it until the cards
        # are bound (and says where the GPU Operator binds them itself), so no fix loops back
        return CheckResult(
            BOUND,
            Level.FAIL,
            f"{where}: " + ", ".join(f"{f.address} on {f.driver}" for f in held),
            "bind every NVSwitch with the GPUs: `passthrough plan --nvswitch all` then `apply`"
            if _switch(v)
            else "bind every function of the card to vfio-pci: `passthrough plan` then `apply` "
            "(at boot), or `passthrough bind` (now)",
        )
    loose = [f for f in v.gpu.functions if not f.is_bridge_like and f.driver is None]
    n = len([f for f in v.gpu.functions if not f.is_bridge_like])
    summary = f"{where}: {'all ' if n > 1 else ''}{count(n, 'function')} on vfio-pci"
    if loose:
        summary = (
            f"{where}: "
            + ", ".join(str(f.address) for f in loose)
            + " on no driver (ready to bind)"
        )
    return CheckResult(BOUND, Level.PASS, summary)


def _switch(v: GpuVerdict) -> bool:
    """An NVSwitch taken as a card of its own (--nvswitch)."""
    return v.gpu.primary.subclass == SUBCLASS_OTHER_BRIDGE


def _policy(host: Host, v: GpuVerdict, whole: list[GpuVerdict]) -> list[CheckResult]:
    """The card's verdict as scan and check give it, at the same levels (a refusal fails,
    a warning warns: :func:`finding_level`); what makes a card unsafe for a guest
    withholds the node label (kube-mode-label says so). A large BAR is _fits' to judge; the
    NVSwitch warning is not told where ``whole`` (the cards checked) holds the NVSwitches."""
    where = v.gpu.primary.address
    refused = codes.refusals(v.findings, codes.PREPARED)
    said = [
        CheckResult(
            f.code,
            finding_level(f.code, codes.PREPARED),
            f"{where}: {f.message}",
            codes.POLICY[f.code].meaning if f in refused else None,
        )
        for f in told(v.findings, whole)
        if f.severity is not Severity.INFO and f.code != codes.LARGE_BAR
    ]
    if codes.unsafe_for_guest(v.findings, codes.PREPARED):
        return said  # a synthetic group (acs-override) "holding only the card" isolates nothing
    groups = ", ".join(map(str, v.gpu.groups))
    viable = f"{where}: IOMMU group {groups} holds only the card"
    return [CheckResult("group-viable", Level.PASS, viable), *said]


def _fits(host: Host, v: GpuVerdict, memory_mib: int) -> CheckResult:
    where = v.gpu.primary.address
    fns = [f for f in v.gpu.functions if not f.is_bridge_like]
    try:
        refuse_laptop(host, fns)
        layout = plan_kubevirt([fns], host, memory_mib)
    except PassthroughError as exc:
        code = getattr(exc, "code", None) or (
            exc.codes[0] if isinstance(exc, policy.Refused) else policy.LARGE_BAR
        )
        return CheckResult(
            code,
            Level.FAIL,
            f"{where}: {exc}",
            "a libvirt guest (`passthrough render`) can still take it",
        )
    return CheckResult(policy.LARGE_BAR, Level.PASS, f"{where}: {layout.decisions[-1]}")


def preflight(
    host: Host,
    gpus: tuple[str, ...] = (),
    memory_mib: int = 8192,
    route: str = "device-plugin",
    nvswitches: tuple[str, ...] = (),
) -> Preflight:
    """The node's checks for ``route``: on the device-plugin route every card is on vfio-pci
    and the node gets the GPU Operator's mode label; on the DRA route (NVIDIA's DRA driver)
    the cards stay on nvidia, which the driver moves to vfio-pci itself (kube/dra_node.py).
    ``nvswitches`` (--nvswitch all|ADDRESS): a VM that owns the whole NVLink domain, so the
    NVSwitches are checked as cards too (on vfio-pci, their groups); a partial selection is
    refused as render and plan refuse it (analysis/nvswitch.py)."""
    from passthrough.kube import dra_node

    if nvswitches and route == "dra":
        raise NvswitchRefused(
            "--nvswitch: checked on the device-plugin route only (every GPU and NVSwitch on "
            "vfio-pci from boot); on the DRA route leave it out"
        )
    report = Preflight(route=route)
    if not host.groups:
        report.checks.append(
            CheckResult(
                policy.NO_IOMMU,
                Level.FAIL,
                "no IOMMU groups: the IOMMU is off or absent",
                "`passthrough plan` turns it on",
            )
        )
    verdicts = policy.judge_all(host)
    chosen = choose_cards(verdicts, gpus, default="nvidia", required=False)
    if not chosen:
        report.checks.append(CheckResult(BOUND, Level.FAIL, "no NVIDIA GPU on this node", None))
    chosen = with_nvswitches(host, verdicts, chosen, nvswitches)
    unsafe: list[str] = []
    for v in chosen:
        bound = dra_node.driver_check(v) if route == "dra" else _bound(v)
        card = [bound, *_policy(host, v, chosen)]
        if not _switch(v):  # an NVSwitch maps no large BAR
            card.append(_fits(host, v, memory_mib))
        # a warning the cluster path refuses (laptop-3d in _fits) is told once, as the refusal
        failed = {c.id for c in card if c.level is Level.FAIL}
        report.checks += [c for c in card if c.level is not Level.WARN or c.id not in failed]
        unsafe += [f.code for f in codes.unsafe_for_guest(v.findings, codes.PREPARED)]
    if route == "dra":
        report.checks += dra_node.route_checks(report.checks, unsafe)
        return report  # no mode label: VMs claim their cards through ResourceClaims
    switches = any(_switch(v) for v in chosen)
    report.checks.append(_label(report, unsafe, bindable=bool(chosen), switches=switches))
    if report.ok:
        report.labels[WORKLOAD_LABEL] = "vm-passthrough"
    return report


def _label(
    report: Preflight, unsafe: list[str], bindable: bool, switches: bool = False
) -> CheckResult:
    """The mode label: set when every check passed; withheld over any failure and over a
    warning that makes a card unsafe for a guest (acs-override), naming them. Where binding
    is all that is missing, the GPU Operator's own route is named (its vfio-manager binds
    the cards of a node labelled by hand), so the advice ends where the checks pass; not
    with NVSwitches (``switches``), which passthrough binds at boot with the GPUs."""
    label = f"{WORKLOAD_LABEL}=vm-passthrough"
    if report.ok and not unsafe:
        return CheckResult(MODE_LABEL, Level.PASS, f"label the node {label}")
    blocking = [
        c.id
        for c in report.checks
        if c.level is Level.FAIL and (c.id != BOUND or not bindable)  # no card: nothing to bind
    ]
    if blocking or unsafe:
        why = " (a card unsafe for a guest is never declared ready)" if unsafe else ""
        return CheckResult(
            MODE_LABEL,
            Level.FAIL,
            f"not labelled {label}: {', '.join(dict.fromkeys(blocking + unsafe))} above{why}",
            None,
        )
    return CheckResult(
        MODE_LABEL,
        Level.FAIL,
        f"not labelled {label} until the cards are on vfio-pci (kube-vfio-bound above); "
        "every other check passes",
        "bind them as kube-vfio-bound says"
        + (
            ""
            if switches
            else f", or on a GPU Operator cluster label the node {label} "
            "yourself: its vfio-manager binds them"
        ),
    )
