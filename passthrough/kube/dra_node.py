# SPDX-License-Identifier: Apache-2.0
"""``kubevirt preflight --route dra``: a node for NVIDIA's DRA driver (k8s-dra-driver-gpu) with
its passthrough support. That driver enumerates the GPUs through the nvidia kernel driver and,
when a VM's ResourceClaim is prepared, moves the claimed card to vfio-pci itself (and back
when it is released), so the node's cards belong on ``nvidia`` between VMs: a boot-time vfio
binding (what ``plan``/``apply`` write for the device-plugin route) hides them from the driver.
It needs the IOMMU on (the preflight's no-iommu check) and its ``PassthroughSupport`` feature
gate, which is the driver's deployment setting, not visible from the node. No mode label: the
GPU Operator's ``nvidia.com/gpu.workload.config`` belongs to the device-plugin route."""

from __future__ import annotations

from passthrough.model import CheckResult, GpuVerdict, Level

DRIVER = "kube-dra-driver"
GATE = "kube-dra-passthrough-gate"
ROUTE = "kube-dra-route"
VFIO = frozenset({"vfio-pci", "nvgrace_gpu_vfio_pci", "nvgrace-gpu-vfio-pci"})


def driver_check(v: GpuVerdict) -> CheckResult:
    """The card's GPU function on nvidia (or on no driver yet, for the driver to load) passes;
    on vfio-pci it warns (a boot-time binding hides it from the DRA driver, unless a VM holds
    it right now); on any other driver (nouveau) it fails: the DRA driver works through nvidia."""
    gpu = v.gpu.primary
    where = gpu.address
    if gpu.driver in (None, "nvidia"):
        on = "nvidia" if gpu.driver else "no driver yet (nvidia takes it)"
        return CheckResult(
            DRIVER,
            Level.PASS,
            f"{where}: on {on}; NVIDIA's DRA driver moves it to vfio-pci when a VM claims it",
        )
    if gpu.driver in VFIO:
        return CheckResult(
            DRIVER,
            Level.WARN,
            f"{where}: on {gpu.driver}: NVIDIA's DRA driver binds the cards it manages itself, "
            "and a card bound to vfio-pci at boot is hidden from it (unless a VM holds it now)",
            "leave the cards to the DRA driver: `passthrough undo` removes a boot-time binding "
            "that passthrough apply made",
        )
    return CheckResult(
        DRIVER,
        Level.FAIL,
        f"{where}: on {gpu.driver}: NVIDIA's DRA driver works through the nvidia driver",
        "install the NVIDIA driver (the GPU Operator's driver or the host's) and blacklist "
        f"{gpu.driver}",
    )


def route_checks(checks: list[CheckResult], unsafe: list[str]) -> list[CheckResult]:
    """The DRA driver's gate (told, not checked: a deployment setting) and the route's
    verdict instead of the mode label."""
    gate = CheckResult(
        GATE,
        Level.INFO,
        "NVIDIA's DRA driver must run with its PassthroughSupport feature gate on (a setting "
        "of the driver's deployment, not visible from the node)",
        "helm: --set featureGates.PassthroughSupport=true",
    )
    blocking = [c.id for c in checks if c.level is Level.FAIL]
    if blocking or unsafe:
        verdict = CheckResult(
            ROUTE,
            Level.FAIL,
            "not ready for VMs through NVIDIA's DRA driver: "
            + ", ".join(dict.fromkeys(blocking + unsafe))
            + " above",
        )
    else:
        verdict = CheckResult(
            ROUTE,
            Level.PASS,
            "ready for VMs through NVIDIA's DRA driver (no node label: the VMs' ResourceClaims "
            "pick the cards)",
        )
    return [gate, verdict]
