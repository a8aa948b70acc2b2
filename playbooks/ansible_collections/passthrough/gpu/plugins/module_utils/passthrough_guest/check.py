# SPDX-License-Identifier: Apache-2.0
"""``passthrough guest check``: does this guest see its GPU, and is everything above it wired?

Each check has an id, a level (PASS / WARN / FAIL, or SKIP when it does not apply here:
the thing is not installed, or the root is a capture with no live GPU) and a one-line fix.
Standard library only (see the package docstring).
"""

from __future__ import annotations

from collections.abc import Mapping

from .hardware import (
    check_bars,
    check_device_nodes,
    check_driver,
    check_driver_version,
    check_functions,
    check_kernel_log,
    driver_loaded,
    read_gpus,
)
from .report import SKIP, GuestCheck, GuestReport
from .root import GuestRoot
from .runner import Runner
from .secureboot import check_guest_cas
from .stack import (
    ComputeProbe,
    check_cdi,
    check_compute,
    check_kubernetes,
    check_nvidia_smi,
    check_runtime,
    check_toolkit,
    check_vgpu,
    nvidia_smi,
)
from .virt import detect, pci_ids

# Checks that must pass before anything is installed (the guest role's first step).
HARDWARE_CHECKS = ("gpu-functions", "gpu-bars")


def run_guest_checks(
    root: GuestRoot,
    runner: Runner,
    *,
    compute: bool = True,
    probe: ComputeProbe | None = None,
    node: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> GuestReport:
    """Every check; ``node``/``labels``: the Kubernetes node name and the labels expected."""
    machine = detect(root.read, pci_ids(root.read, root.listdir))
    gpus = read_gpus(root)
    toolkit = check_toolkit(runner)
    smi = nvidia_smi(runner)
    checks: tuple[GuestCheck, ...] = (
        check_functions(gpus),
        check_bars(gpus),
        check_driver(gpus),
        check_driver_version(root, gpus),
        check_device_nodes(root, gpus),
        check_kernel_log(runner),
        check_nvidia_smi(gpus, smi),
        check_vgpu(smi),
        check_compute(root.is_live, compute, probe, driver_loaded(gpus)),
        check_runtime(root, runner),
        toolkit,
        check_cdi(root, toolkit),
        check_kubernetes(root, runner, gpus, node, labels),
        check_guest_cas(root),
    )
    if root.host_files_only:
        checks = tuple(_not_recorded(c) if c.id in NOT_IN_HOST_SNAPSHOTS else c for c in checks)
    return GuestReport(root.path, root.is_live, machine, gpus, checks)


# What a snapshot of host discovery's files cannot tell (the files were never recorded).
NOT_IN_HOST_SNAPSHOTS = ("driver-version", "device-nodes")


def _not_recorded(check: GuestCheck) -> GuestCheck:
    return GuestCheck(
        check.id,
        SKIP,
        "not in this snapshot: it holds only what host discovery reads (an older "
        "passthrough took it); `passthrough snapshot` inside the guest records it",
    )
