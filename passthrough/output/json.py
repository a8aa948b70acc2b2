# SPDX-License-Identifier: Apache-2.0
"""The scan report: one object for machines (``scan --json``), schema passthrough.scan/v1.

The JSON Schema lives in ``passthrough/schemas/scan-v1.schema.json``.
"""

from __future__ import annotations

from typing import Any, TypedDict

from passthrough.analysis.checks import iommu_default_on
from passthrough.analysis.scan import Scan
from passthrough.model import CheckResult, Finding, GpuVerdict, Host, Level, PciFunction

SCHEMA = "passthrough.scan/v1"


class BarJson(TypedDict):
    index: int
    size: int
    is_64bit: bool
    prefetchable: bool


class FindingJson(TypedDict):
    code: str
    severity: str  # passthrough.model.Severity's value
    message: str
    devices: list[str]


def _function(f: PciFunction) -> dict[str, Any]:
    return {
        "address": str(f.address),
        "id": f.id,
        "subsystem_id": (
            f"{f.subsystem_vendor_id:04x}:{f.subsystem_device_id:04x}"
            if f.subsystem_vendor_id is not None and f.subsystem_device_id is not None
            else None
        ),
        "class": f.class_hex,
        "name": f.name,
        "driver": f.driver,
        "iommu_group": f.iommu_group,
        "reset_methods": list(f.reset_methods) if f.reset_methods is not None else None,
    }


def _bars(f: PciFunction) -> list[BarJson]:
    return [
        {"index": b.index, "size": b.size, "is_64bit": b.is_64bit, "prefetchable": b.prefetchable}
        for b in f.bars
        if not b.is_io
    ]


def finding_json(f: Finding) -> FindingJson:
    return {
        "code": f.code,
        "severity": f.severity.value,
        "message": f.message,
        "devices": [str(a) for a in f.devices],
    }


def gpu_json(v: GpuVerdict) -> dict[str, Any]:
    p = v.gpu.primary
    return {
        "address": str(p.address),
        "id": p.id,
        "class": p.class_hex,
        "name": p.name,
        "iommu_group": p.iommu_group,
        "functions": [str(f.address) for f in v.gpu.functions],
        "group_members": [str(a) for a in v.group_members],
        "viable": v.viable,
        "reasons": list(v.reasons),
        "warnings": list(v.warnings),
        "findings": [finding_json(f) for f in v.findings],
        "vfio_ids": list(v.gpu.vfio_ids),
        "driver": p.driver,
        "boot_vga": bool(p.boot_vga),
        "numa_node": p.numa_node,
        "bars": _bars(p),
        "reset_methods": list(p.reset_methods) if p.reset_methods is not None else None,
        "parents": [str(a) for a in p.parents],
        "card": [_function(f) for f in v.gpu.functions],
    }


def host_json(h: Host) -> dict[str, Any]:
    on, why = iommu_default_on(h)
    return {
        "cpu": {
            "vendor": h.cpu.vendor,
            "model": h.cpu.model,
            "virtualization": h.cpu.virt_flag,
            "logical_cpus": h.cpu.logical_cpus,
        },
        "kvm": h.kvm,
        "iommu": {
            "units": list(h.iommu.units),
            "acpi_tables": list(h.iommu.acpi_tables),
            "groups": h.iommu.groups,
            "requested": on,
            "requested_why": why,
            "interrupt_remapping": h.iommu.interrupt_remapping,
            "interrupt_remapping_evidence": h.iommu.interrupt_remapping_evidence,
            "allow_unsafe_interrupts": h.iommu.allow_unsafe_interrupts,
            "dev_iommu": h.iommu.dev_iommu,
            "vfio_cdevs": [
                {"address": str(c.address), "name": c.name, "dev_node": c.dev_node}
                for c in h.iommu.vfio_cdevs
            ],
        },
        "kernel": {
            "release": h.kernel.release,
            "cmdline": list(h.kernel.cmdline),
            "config": dict(sorted(h.kernel.config.items())),
            "config_source": h.kernel.config_source,
            "vfio_pci": h.kernel.vfio_pci,
            "acs_override": h.acs_override,
        },
        "distro": {
            "id": h.distro.id,
            "id_like": list(h.distro.id_like),
            "version_id": h.distro.version_id,
            "pretty_name": h.distro.pretty_name,
        },
        "boot": {
            "uefi": h.boot.uefi,
            "bootloader": h.boot.bootloader.value,
            "bootloader_evidence": list(h.boot.bootloader_evidence),
            "initramfs": h.boot.initramfs.value,
            "initramfs_evidence": list(h.boot.initramfs_evidence),
        },
        "critical": {
            "root_device": h.critical.root_device,
            "root_pci": [str(a) for a in h.critical.root_pci],
            "default_nic": h.critical.default_nic,
            "nic_pci": [str(a) for a in h.critical.nic_pci],
        },
        "dmi": {
            "chassis_type": h.dmi.chassis_type,
            "portable": h.dmi.is_portable,
            "sys_vendor": h.dmi.sys_vendor,
            "product_name": h.dmi.product_name,
        },
        "virtual_machine": {
            "guest": h.machine.guest,
            "hypervisor": h.machine.hypervisor,
            "evidence": list(h.machine.evidence),
        },
        "pci_functions": len(h.functions),
        "numa_nodes": {str(n): list(cpus) for n, cpus in sorted(h.numa_cpus.items())},
    }


def scan_json(scan: Scan) -> dict[str, Any]:
    h = scan.host
    by_addr = {f.address: f for f in h.functions}
    return {
        "schema": SCHEMA,
        "root": h.root,
        "host": host_json(h),
        "checks": checks_json(scan.checks),
        "gpus": [gpu_json(v) for v in scan.verdicts],
        "groups": [
            {"number": g.number, "members": [_function(by_addr[a]) for a in g.members]}
            for g in h.groups
        ],
        "problems": list(h.problems),
    }


def checks_json(checks: list[CheckResult]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "level": c.level.value, "summary": c.summary, "fix": c.fix} for c in checks
    ]


def check_json(scan: Scan) -> dict[str, Any]:
    """``check --json``: passthrough.check/v1."""
    return {
        "schema": "passthrough.check/v1",
        "root": scan.host.root,
        "ok": not scan.failed,
        "virtual_machine": host_json(scan.host)["virtual_machine"],
        "checks": checks_json(scan.checks),
    }


def verify_json(results: list[CheckResult]) -> dict[str, Any]:
    """``verify --json``: passthrough.verify/v1."""
    return {
        "schema": "passthrough.verify/v1",
        "ok": not any(r.level is Level.FAIL for r in results),
        "checks": checks_json(results),
    }
