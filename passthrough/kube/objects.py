# SPDX-License-Identifier: Apache-2.0
"""KubeVirt and Kubernetes objects from a VmSpec: only what the spec decided, written the way
each API takes it (field names checked against KubeVirt's OpenAPI and the DRA driver's types).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from passthrough.kube.names import resource_name, vendor_selector
from passthrough.model import PciFunction
from passthrough.records import frozen
from passthrough.vm.install import topology
from passthrough.vm.spec import VmSpec

KUBEVIRT_API = "kubevirt.io/v1"
RESOURCE_API = "resource.k8s.io/v1"
NVIDIA_CONFIG_API = "resource.nvidia.com/v1beta1"
VFIO_CLASS = "vfio.gpu.nvidia.com"
DRA_DRIVER = "gpu.nvidia.com"
# the standard device attribute (domain resource.kubernetes.io) the driver sets for every GPU
PCI_BUS_ID = "device.attributes['resource.kubernetes.io'].pciBusID"
CLAIM = "gpus"  # the VMI's resourceClaims entry every DRA GPU comes from
HUGEPAGE_SIZE = "2Mi"
# KubeVirt's hyperv block, per enlightenment of the Windows profile (spec.py's names)
_HYPERV = {
    "relaxed": "relaxed",
    "vapic": "vapic",
    "vpindex": "vpindex",
    "runtime": "runtime",
    "synic": "synic",
    "stimer": "synictimer",
    "reset": "reset",
    "frequencies": "frequencies",
    "tlbflush": "tlbflush",
    "ipi": "ipi",
}


@frozen
class VmCard:
    """One card of one VM: its functions as the host has them, and its DRA request name."""

    index: int  # 1-based within the VM
    functions: tuple[PciFunction, ...]

    @property
    def request(self) -> str:
        return f"gpu{self.index}"

    @property
    def selector(self) -> dict[str, Any]:
        """A CEL selector for exactly this card: the PCI address NVIDIA's DRA driver
        publishes for each device under the standard ``resource.kubernetes.io/pciBusID``
        attribute (lower-case hex, ``0000:01:00.0``). Without it a request on the vfio class
        takes any free GPU of the node, so two different cards could swap places."""
        primary = next((f for f in self.functions if f.is_display), self.functions[0])
        return {"cel": {"expression": f"{PCI_BUS_ID} == '{primary.address}'"}}

    def device_name(self, fn: PciFunction) -> str:
        return self.request if fn.is_display else f"{self.request}-fn{fn.address.function}"


def permitted_host_devices(
    functions: Sequence[PciFunction], external: bool, dra_gpus: bool
) -> list[dict[str, Any]]:
    """``pciHostDevices`` for these functions, one entry per vendor:device (the GPUs left
    out when the DRA driver hands them over)."""
    entries: dict[str, dict[str, Any]] = {}
    for fn in functions:
        if dra_gpus and fn.is_display:
            continue
        entries.setdefault(
            vendor_selector(fn),
            {
                "pciVendorSelector": vendor_selector(fn),
                "resourceName": resource_name(fn),
                "externalResourceProvider": external,
            },
        )
    return list(entries.values())


def kubevirt_patch(permitted: list[dict[str, Any]], gates: Sequence[str]) -> dict[str, Any]:
    """The KubeVirt CR's part these VMs need: the host devices permitted and the feature
    gates turned on (both lists: merged into the CR's own by the admin, not applied as is)."""
    configuration: dict[str, Any] = {}
    if gates:
        configuration["developerConfiguration"] = {"featureGates": list(gates)}
    if permitted:
        configuration["permittedHostDevices"] = {"pciHostDevices": permitted}
    return {
        "apiVersion": KUBEVIRT_API,
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"configuration": configuration},
    }


def claim_template(name: str, cards: Sequence[VmCard], iommufd: bool = False) -> dict[str, Any]:
    """One named request per card on the vfio class, and the driver's VFIO config for all of
    them: the legacy group device and /dev/vfio/vfio, or with ``iommufd`` (a node whose
    kernel has it) each card's /dev/vfio/devices/vfioN and /dev/iommu."""
    requests = [c.request for c in cards]
    exactly = {c.request: {"deviceClassName": VFIO_CLASS, "selectors": [c.selector]} for c in cards}
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": r, "exactly": exactly[r]} for r in requests],
                    "config": [
                        {
                            "requests": requests,
                            "opaque": {
                                "driver": DRA_DRIVER,
                                "parameters": {
                                    "apiVersion": NVIDIA_CONFIG_API,
                                    "kind": "VfioDeviceConfig",
                                    "iommu": {
                                        "backendPolicy": (
                                            "PreferIommuFD" if iommufd else "LegacyOnly"
                                        ),
                                        "enableAPIDevice": True,
                                    },
                                },
                            },
                        }
                    ],
                }
            }
        },
    }


def _devices(cards: Sequence[VmCard], dra: bool) -> dict[str, Any]:
    gpus: list[dict[str, Any]] = []
    host_devices: list[dict[str, Any]] = []
    for card in cards:
        for fn in card.functions:
            name = card.device_name(fn)
            if fn.is_display and dra:
                gpus.append({"name": name, "claimName": CLAIM, "requestName": card.request})
            elif fn.is_display:
                gpus.append({"name": name, "deviceName": resource_name(fn)})
            else:
                host_devices.append({"name": name, "deviceName": resource_name(fn)})
    devices: dict[str, Any] = {
        "disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}],
        "interfaces": [{"name": "default", "masquerade": {}}],
        "gpus": gpus,
    }
    if host_devices:
        devices["hostDevices"] = host_devices
    return devices


def _features(spec: VmSpec) -> dict[str, Any]:
    features: dict[str, Any] = {"acpi": {}}
    if spec.kvm_hidden:
        features["kvm"] = {"hidden": True}
    hyperv: dict[str, Any] = {}
    for e in spec.enlightenments:
        key = _HYPERV.get(e.name)
        if e.name == "spinlocks":
            hyperv["spinlocks"] = {"enabled": True, "spinlocks": e.retries}
        elif key is not None:
            hyperv[key] = {"enabled": True}
    if spec.hyperv_vendor_id:
        hyperv["vendorid"] = {"enabled": True, "vendorid": spec.hyperv_vendor_id}
    if hyperv:
        features["hyperv"] = hyperv
    return features


def _cpu(spec: VmSpec) -> dict[str, Any]:
    # the same topology the libvirt domain gets (vm/install.py decides it for both)
    top = spec.install.topology if spec.install else topology(spec.vcpus, 1)
    cpu: dict[str, Any] = {
        "model": "host-passthrough",
        "sockets": top.sockets,
        "cores": top.cores,
        "threads": top.threads,
    }
    if spec.vcpu_pins:
        # the kubelet's CPU manager gives dedicated CPUs; its topology manager
        # (single-numa-node) puts them on the node of the devices the plugin reports
        cpu["dedicatedCpuPlacement"] = True
        cpu["isolateEmulatorThread"] = True
        if spec.hugepages:
            cpu["numa"] = {"guestMappingPassthrough": {}}
    if spec.hide_hypervisor_cpuid:
        cpu["features"] = [{"name": "hypervisor", "policy": "disable"}]
    return cpu


def virtual_machine(spec: VmSpec, cards: Sequence[VmCard], dra: bool) -> dict[str, Any]:
    secure_boot = bool(spec.install and spec.install.secure_boot)
    memory: dict[str, Any] = {"guest": f"{spec.memory_mib}Mi"}
    if spec.hugepages:
        memory["hugepages"] = {"pageSize": HUGEPAGE_SIZE}
    domain: dict[str, Any] = {
        "cpu": _cpu(spec),
        "memory": memory,
        # Secure Boot as the libvirt render has it (vm/install.py): KubeVirt needs SMM for it
        "firmware": {"bootloader": {"efi": {"secureBoot": secure_boot}}},
        "features": _features(spec),
        "devices": _devices(cards, dra),
    }
    if secure_boot:
        domain["features"]["smm"] = {"enabled": True}
    if spec.install and spec.install.tpm:
        domain["devices"]["tpm"] = {}  # KubeVirt's emulated TPM 2.0 (swtpm in the pod)
    if spec.hyperv_clock:
        domain["clock"] = {"timer": {"hyperv": {"present": True}}}
    vmi: dict[str, Any] = {
        "domain": domain,
        "networks": [{"name": "default", "pod": {}}],
        "volumes": [
            {"name": "rootdisk", "persistentVolumeClaim": {"claimName": f"{spec.name}-root"}}
        ],
    }
    if dra:
        vmi["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": f"{spec.name}-gpus"}]
    return {
        "apiVersion": KUBEVIRT_API,
        "kind": "VirtualMachine",
        "metadata": {"name": spec.name, "labels": {"app.kubernetes.io/managed-by": "passthrough"}},
        "spec": {
            "runStrategy": "Halted",
            "template": {"metadata": {"labels": {"kubevirt.io/vm": spec.name}}, "spec": vmi},
        },
    }
