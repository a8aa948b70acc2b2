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
from passthrough.errors import PassthroughError, count
from passthrough.kube.build import refuse_laptop
from passthrough.kube.layout import plan_kubevirt
from passthrough.model import CheckResult, GpuVerdict, Host, Level, Severity
from passthrough.output.json import checks_json

BOUND = "kube-vfio-bound"
MODE_LABEL = "kube-mode-label"
WORKLOAD_LABEL = "nvidia.com/gpu.workload.config"
VFIO_DRIVERS = frozenset({"vfio-pci", "nvgrace_gpu_vfio_pci", "nvgrace-gpu-vfio-pci"})


@dataclass
class Preflight:
    checks: list[CheckResult] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(c.level is Level.FAIL for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "schema": "passthrough.kubevirt-preflight/v1",
            "ok": self.ok,
            "labels": self.labels,
            "checks": checks_json(self.checks),
        }


def _bound(v: GpuVerdict) -> CheckResult:
    held = [
        f for f in v.gpu.functions if not f.is_bridge_like and f.driver not in VFIO_DRIVERS | {None}
    ]
    where = v.gpu.primary.address
    if held:
        return CheckResult(
            BOUND,
            Level.FAIL,
            f"{where}: " + ", ".join(f"{f.address} on {f.driver}" for f in held),
            "bind every function of the card to vfio-pci (`passthrough plan` then `apply`, or "
            "the GPU Operator's vfio-manager on a node labelled vm-passthrough)",
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


def _policy(host: Host, v: GpuVerdict) -> list[CheckResult]:
    """The card's verdict as scan gives it: what makes it unsafe for a guest fails (and
    withholds the node label), the other warnings are told; a large BAR is _fits' to judge."""
    where = v.gpu.primary.address
    unsafe = codes.unsafe_for_guest(v.findings, codes.PREPARED)
    told = [
        CheckResult(f.code, Level.WARN, f"{where}: {f.message}", None)
        for f in v.findings
        if f.severity is Severity.WARNING and f not in unsafe and f.code != codes.LARGE_BAR
    ]
    if not unsafe:
        groups = ", ".join(map(str, v.gpu.groups))
        return [
            CheckResult(
                "group-viable", Level.PASS, f"{where}: IOMMU group {groups} holds only the card"
            ),
            *told,
        ]
    return [
        CheckResult(f.code, Level.FAIL, f"{where}: {f.message}", codes.POLICY[f.code].meaning)
        for f in unsafe
    ] + told


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


def preflight(host: Host, gpus: tuple[str, ...] = (), memory_mib: int = 8192) -> Preflight:
    report = Preflight()
    if not host.groups:
        report.checks.append(
            CheckResult(
                policy.NO_IOMMU,
                Level.FAIL,
                "no IOMMU groups: the IOMMU is off or absent",
                "`passthrough plan` turns it on",
            )
        )
    chosen = choose_cards(policy.judge_all(host), gpus, default="nvidia", required=False)
    if not chosen:
        report.checks.append(CheckResult(BOUND, Level.FAIL, "no NVIDIA GPU on this node", None))
    for v in chosen:
        card = [_bound(v), *_policy(host, v), _fits(host, v, memory_mib)]
        # a warning the cluster path refuses (laptop-3d in _fits) is told once, as the refusal
        failed = {c.id for c in card if c.level is Level.FAIL}
        report.checks += [c for c in card if c.level is not Level.WARN or c.id not in failed]
    if report.ok:
        report.labels[WORKLOAD_LABEL] = "vm-passthrough"
        report.checks.append(
            CheckResult(MODE_LABEL, Level.PASS, f"label the node {WORKLOAD_LABEL}=vm-passthrough")
        )
    else:
        report.checks.append(
            CheckResult(
                MODE_LABEL,
                Level.FAIL,
                f"not labelled {WORKLOAD_LABEL}=vm-passthrough until the checks above pass",
                None,
            )
        )
    return report
