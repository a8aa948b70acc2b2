# SPDX-License-Identifier: Apache-2.0
"""The cluster manifests for a host: cards chosen, checked and laid out exactly as ``render``
does it (vm/spec.py's build_spec), then written as KubeVirt and Kubernetes objects.

Two routes: ``device-plugin`` (every function through ``permittedHostDevices``, provided by
NVIDIA's plugin or KubeVirt's own) and ``dra`` (each GPU from NVIDIA's DRA driver on
``vfio.gpu.nvidia.com``, companion functions still through ``permittedHostDevices``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from passthrough.analysis import codes, policy
from passthrough.kube import PROVIDERS as PROVIDERS  # their home is the package (lean --help)
from passthrough.kube import ROUTES as ROUTES
from passthrough.kube.layout import plan_kubevirt
from passthrough.kube.objects import (
    VmCard,
    claim_template,
    kubevirt_patch,
    permitted_host_devices,
    virtual_machine,
)
from passthrough.model import Finding, Host, PciFunction, Severity
from passthrough.pciclass import SUBCLASS_3D
from passthrough.vm.options import BadVmSpec
from passthrough.vm.spec import VmOptions, VmSpec, build_spec
from passthrough.vm.versions import Versions

# feature gates by where they are set
KUBEVIRT_GATES = "KubeVirt CR spec.configuration.developerConfiguration.featureGates"
DRA_GATES = "NVIDIA DRA driver (Helm featureGates.<name>=true)"


@dataclass
class Manifests:
    documents: list[dict[str, Any]] = field(default_factory=list)
    feature_gates: dict[str, list[str]] = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    node_labels: dict[str, str] = field(default_factory=dict)

    def gate(self, where: str, name: str) -> None:
        names = self.feature_gates.setdefault(where, [])
        if name not in names:
            names.append(name)

    def header(self, route: str) -> list[str]:
        """The comment lines above the YAML stream: what to set besides applying it."""
        # say only what the stream holds: the DRA route's has no KubeVirt CR patch
        patched = any(d.get("kind") == "KubeVirt" for d in self.documents)
        todo = (
            "merge the KubeVirt patch, apply the rest"
            if patched
            else "apply it and set the feature gates below (it holds no KubeVirt patch)"
        )
        lines = [f"passthrough kubevirt render --route {route}: {todo}"]
        lines += [
            f"feature gates, {where}: {', '.join(names)}"
            for where, names in self.feature_gates.items()
        ]
        lines += [f"node label: {k}={v}" for k, v in self.node_labels.items()]
        return lines

    def as_json(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "feature_gates": self.feature_gates,
            "node_labels": self.node_labels,
            "decisions": self.decisions,
            "warnings": self.warnings,
        }


def refuse_laptop(host: Host, functions: list[PciFunction]) -> None:
    """A muxless laptop GPU may need its vBIOS from ACPI, given to QEMU as a ROM file;
    KubeVirt's hostDevices and gpus have no ROM field, so the cluster path cannot give it.
    The policy table (analysis/codes.py) has laptop-3d a warning, for render's guest, which
    can take the ROM (--rom): the refusal here is the cluster path's own, not a severity."""
    if not host.dmi.is_portable:
        return
    found = [
        Finding(
            policy.LAPTOP_3D,
            Severity.ERROR,
            f"{fn.address} is a laptop 3D controller (Optimus): its driver may need the vBIOS "
            "from ACPI as a ROM file, and KubeVirt's gpus/hostDevices have no ROM field "
            "(`passthrough render --rom FILE` gives one to a libvirt guest)",
            (fn.address,),
        )
        for fn in functions
        if fn.subclass == SUBCLASS_3D
    ]
    if found:
        raise policy.Refused(found)


# a VM's name is a DNS label in Kubernetes (it becomes the guest's hostname)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# VM options the libvirt path has and KubeVirt's API has no field for: refused, never dropped
_LIBVIRT_ONLY = (
    ("rom", "on", "a ROM file or ROM BAR setting"),
    ("disk", None, "a host disk path (the VM boots from the PVC <name>-root)"),
    ("base_image", None, "a host base image (the VM boots from the PVC <name>-root)"),
    ("bridge", None, "a host bridge (the VM uses the pod network)"),
    ("network", "default", "a libvirt network (the VM uses the pod network)"),
    ("seed", None, "a cloud-init seed ISO on the host"),
    ("virt_type", "kvm", "software emulation"),
    ("cdrom", None, "a host ISO path (KubeVirt attaches a CD-ROM from a PVC or DataVolume)"),
    ("driver_iso", None, "a host ISO path (KubeVirt attaches a CD-ROM from a PVC or DataVolume)"),
    ("disk_bus", None, "the root disk's bus chosen here"),
    ("graphics", None, "a VNC or SPICE console chosen here (virtctl vnc reaches the VM's own)"),
    ("headless", False, "leaving the console out (virtctl vnc reaches the VM's own)"),
    ("usb_input", None, "USB input chosen here"),
    ("topology", True, "leaving the vCPU topology to libvirt (the VM gets one socket)"),
)


def check_kube_options(opts: VmOptions, per_card: bool) -> None:
    """What the cluster path cannot express is refused with the field named (exit 2)."""
    if opts.no_gpu:  # the cluster path is for a GPU's guest: kubevirt refuses one without
        raise BadVmSpec("no_gpu", "kubevirt renders a VM for GPUs; leave it out for kubevirt")
    for name, default, what in _LIBVIRT_ONLY:
        if getattr(opts, name) != default:
            raise BadVmSpec(name, f"KubeVirt has no field for {what}; leave it out for kubevirt")
    if per_card and opts.nvswitches:
        raise BadVmSpec(
            "nvswitches", "--per-card splits the NVLink domain: the NVSwitches go to one VM"
        )
    # per card, the cards named tell the longest suffix; the default cards are counted
    # once chosen (_specs)
    _check_name(opts.name, (len(opts.gpus) or 1) if per_card else None)


def _check_name(name: str, cards: int | None) -> None:
    """The VM's name (with ``-N`` for the last of ``cards`` per card) is a DNS label."""
    longest = f"{name}-{cards}" if cards is not None else name
    if not DNS_LABEL.match(longest):
        room = (
            f"; with the -{cards} of --per-card, {63 - len(str(cards)) - 1} for the name"
            if cards
            else ""
        )
        raise BadVmSpec(
            "name",
            f"{name!r}: a KubeVirt VM's name is a DNS label (lower-case letters, digits and "
            f"'-', at most 63 characters{room})",
        )


def _cards(host: Host, spec: VmSpec) -> list[VmCard]:
    by_addr = {f.address: f for f in host.functions}
    return [
        VmCard(i, tuple(by_addr[g.host] for g in card.functions))
        for i, card in enumerate(spec.cards, start=1)
    ]


def _specs(host: Host, opts: VmOptions, per_card: bool, versions: Versions | None) -> list[VmSpec]:
    """One spec with every chosen card, or (per_card) one per card, each as render makes it."""
    whole = build_spec(host, opts, versions)
    if not whole.cards:
        # plan's refusal, word for word: a VM without a card is nothing to write
        from passthrough.analysis.cards import choose_cards

        choose_cards(policy.judge_all(host), opts.gpus)
    if not per_card:
        return [whole]
    _check_name(opts.name, len(whole.cards))
    return [
        build_spec(
            host,
            dataclasses.replace(opts, name=f"{opts.name}-{i}", gpus=(str(card.functions[0].host),)),
            versions,
        )
        for i, card in enumerate(whole.cards, start=1)
    ]


def build_manifests(
    host: Host,
    opts: VmOptions,
    route: str = "device-plugin",
    provider: str = "nvidia",
    per_card: bool = False,
    versions: Versions | None = None,
) -> Manifests:
    check_kube_options(opts, per_card)
    dra = route == "dra"
    iommufd = opts.iommufd
    if iommufd:
        _check_node_iommufd(host, dra)
        # the node's own QEMU and libvirt do not run the guest: virt-launcher's do
        opts = dataclasses.replace(opts, iommufd=False)
    out = Manifests()
    specs = _specs(host, opts, per_card, versions)
    everything: list[PciFunction] = []
    vms: list[dict[str, Any]] = []
    for spec in specs:
        cards = _cards(host, spec)
        functions = [f for c in cards for f in c.functions]
        refuse_laptop(host, functions)
        layout = plan_kubevirt([c.functions for c in cards], host, spec.memory_mib)
        out.decisions += [f"{spec.name}: {d}" for d in layout.decisions]
        out.warnings += [w for w in spec.warnings if w not in out.warnings]
        everything += [f for f in functions if f not in everything]
        if dra:
            vms.append(claim_template(f"{spec.name}-gpus", cards, iommufd))
        vms.append(virtual_machine(spec, cards, dra))
        _gates(out, spec, dra)
    if iommufd:
        out.gate(KUBEVIRT_GATES, "IOMMUFD")
        out.warnings.append(IOMMUFD_LAUNCHER)
    # on the DRA route NVIDIA's plugins stay off the node: KubeVirt's own publishes companions
    permitted = permitted_host_devices(everything, provider == "nvidia" and not dra, dra)
    if permitted:
        out.gate(KUBEVIRT_GATES, "HostDevices")
    gates = out.feature_gates.get(KUBEVIRT_GATES, [])
    if permitted or gates:  # the gates in the patch itself, not only in its comment lines
        out.documents.append(kubevirt_patch(permitted, gates))
    out.documents += vms
    # what makes a card unsafe for a guest withholds the label, as kubevirt preflight does
    unsafe = sorted(
        {
            f.code
            for f in codes.unsafe_for_guest(
                policy.verdict_findings(host, (f.address for f in everything)), codes.PREPARED
            )
        }
    )
    if unsafe:
        out.warnings.append(
            f"node label nvidia.com/gpu.workload.config=vm-passthrough withheld: "
            f"the cards are not safe for a guest ({', '.join(unsafe)})"
        )
    elif not dra and provider == "nvidia":
        # the GPU Operator's sandbox workloads: vfio-manager and the KubeVirt GPU plugin
        out.node_labels["nvidia.com/gpu.workload.config"] = "vm-passthrough"
    return out


# KubeVirt 1.9's IOMMUFD gate (alpha) writes a domain-level <iommufd> that needs libvirt
# 12.2+ in virt-launcher (KubeVirt's release note for PR 17956): the node cannot tell.
IOMMUFD_LAUNCHER = (
    "iommufd: KubeVirt's IOMMUFD feature gate (1.9+, alpha) needs a virt-launcher image with "
    "libvirt 12.2+; the node's kernel is ready"
)


def _check_node_iommufd(host: Host, dra: bool) -> None:
    """PreferIommuFD only where the node's kernel has every piece (exit 2 otherwise)."""
    from passthrough.analysis.checks import iommufd_node_lacks

    if not dra:
        raise BadVmSpec("iommufd", "the device-plugin route has no iommufd: use --route dra")
    lacks = iommufd_node_lacks(host)
    if lacks:
        raise BadVmSpec("iommufd", "this node cannot use it: " + "; ".join(lacks))


def _gates(out: Manifests, spec: VmSpec, dra: bool) -> None:
    if dra:
        out.gate(KUBEVIRT_GATES, "GPUsWithDRA")
        out.gate(DRA_GATES, "PassthroughSupport")
        out.gate(DRA_GATES, "DeviceMetadata")
    if spec.vcpu_pins and spec.hugepages:
        out.gate(KUBEVIRT_GATES, "NUMA")
