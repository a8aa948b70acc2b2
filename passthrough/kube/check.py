# SPDX-License-Identifier: Apache-2.0
"""``passthrough kubevirt validate``: the cluster manifests agree with each other and with the
host — every companion function permitted and requested beside its GPU, one resource name per
PCI ID between the KubeVirt CR and the VMs, every GPU's claim request defined once and used.

Each finding has a code (tests and tools match on it), a severity and one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from passthrough.analysis.viability import find_gpus
from passthrough.kube.names import resource_name, vendor_selector
from passthrough.model import NVIDIA, Finding, Host, Severity

ERROR, WARNING = Severity.ERROR, Severity.WARNING
UNPERMITTED = "kube-unpermitted"
NAME_CONFLICT = "kube-name-conflict"
COMPANION_UNPERMITTED = "kube-companion-unpermitted"
COMPANION_MISSING = "kube-companion-missing"
NO_SOURCE = "kube-device-no-source"
CLAIM_UNKNOWN = "kube-claim-unknown"
TEMPLATE_MISSING = "kube-template-missing"
REQUEST_UNKNOWN = "kube-request-unknown"
REQUEST_UNUSED = "kube-request-unused"
REQUEST_SHARED = "kube-request-shared"
NO_KUBEVIRT_CR = "kube-no-cr"
SHAPE = "kube-shape"
EMPTY = "kube-empty"


def _shape(where: str, what: str) -> Finding:
    return Finding(SHAPE, ERROR, f"{where}: {what} (the KubeVirt API's type; KubeVirt refuses it)")


def _entries(value: Any, where: str, required: tuple[str, ...], found: list[Finding]) -> None:
    """``value`` a list of objects, each with ``required`` and every field read a string."""
    if value is None:
        return
    if not isinstance(value, list):
        found.append(_shape(where, f"a list, not {type(value).__name__}"))
        return
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            found.append(_shape(f"{where}[{i}]", f"an object, not {type(entry).__name__}"))
            continue
        for key in required:
            if key not in entry:
                found.append(_shape(f"{where}[{i}]", f"{key} is required"))
        for key in (*required, "deviceName", "claimName", "requestName"):
            if key in entry and not isinstance(entry[key], str):
                found.append(_shape(f"{where}[{i}].{key}", "a string"))


def shapes(docs: list[dict[str, Any]]) -> list[Finding]:
    """The fields these checks read, of the types the KubeVirt API gives them (swagger:
    v1.VirtualMachineSpec needs ``template``, v1.GPU and v1.HostDevice ``name``,
    v1.PciHostDevice ``pciVendorSelector`` and ``resourceName``, each a string): a
    manifest KubeVirt would refuse is never "ok" for lack of a field to read."""
    found: list[Finding] = []
    for doc in docs:
        kind, name = doc.get("kind"), _get(doc, "metadata", "name")
        where = f"{kind} {name}" if isinstance(name, str) else str(kind)
        if kind == "KubeVirt":
            _entries(
                _get(doc, "spec", "configuration", "permittedHostDevices", "pciHostDevices"),
                f"{where}: permittedHostDevices.pciHostDevices",
                ("pciVendorSelector", "resourceName"),
                found,
            )
        if kind not in ("VirtualMachine", "VirtualMachineInstance"):
            continue
        spec = doc.get("spec")
        if not isinstance(spec, dict):
            found.append(_shape(where, "spec is required, an object"))
            continue
        if kind == "VirtualMachine" and not isinstance(spec.get("template"), dict):
            found.append(_shape(where, "spec.template is required, an object"))
            continue
        devices = _get(_vm_spec(doc), "domain", "devices")
        for field in ("gpus", "hostDevices"):
            _entries(_get(devices, field), f"{where}: devices.{field}", ("name",), found)
    return found


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _list(obj: Any) -> list[Any]:
    return obj if isinstance(obj, list) else []


def _permitted(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]] | None:
    crs = [d for d in docs if d.get("kind") == "KubeVirt"]
    if not crs:
        return None
    return [
        e
        for cr in crs
        for e in _list(_get(cr, "spec", "configuration", "permittedHostDevices", "pciHostDevices"))
        if isinstance(e, dict)
    ]


def _vm_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec = (
        _get(doc, "spec", "template", "spec")
        if doc.get("kind") == "VirtualMachine"
        else doc.get("spec")
    )
    return spec if isinstance(spec, dict) else {}


def _devices(vmi: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("gpus", "hostDevices"):
        for dev in _list(_get(vmi, "domain", "devices", kind)):
            if isinstance(dev, dict):
                yield kind, dev


def _names_agree(permitted: list[dict[str, Any]]) -> list[Finding]:
    found: list[Finding] = []
    by_selector: dict[str, str] = {}
    for e in permitted:
        sel = str(e.get("pciVendorSelector", "")).upper()
        name = str(e.get("resourceName", ""))
        if sel in by_selector and by_selector[sel] != name:
            found.append(
                Finding(
                    NAME_CONFLICT,
                    ERROR,
                    f"pciVendorSelector {sel} is permitted as both {by_selector[sel]} and {name}",
                )
            )
        by_selector.setdefault(sel, name)
    return found


def _claims(name: str, vmi: dict[str, Any], templates: dict[str, dict[str, Any]]) -> list[Finding]:
    found: list[Finding] = []
    claims = {
        str(c.get("name")): c for c in _list(vmi.get("resourceClaims")) if isinstance(c, dict)
    }
    used: dict[tuple[str, str], str] = {}
    for _kind, dev in _devices(vmi):
        claim, request = dev.get("claimName"), dev.get("requestName")
        if claim is None:
            continue
        if claim not in claims:
            found.append(
                Finding(
                    CLAIM_UNKNOWN,
                    ERROR,
                    f"{name}: {dev.get('name')} names claim {claim}, "
                    "which is not among the VM's resourceClaims",
                )
            )
            continue
        key = (str(claim), str(request))
        if key in used:
            found.append(
                Finding(
                    REQUEST_SHARED,
                    ERROR,
                    f"{name}: {used[key]} and {dev.get('name')} both "
                    f"take request {request} of claim {claim}",
                )
            )
        used[key] = str(dev.get("name"))
    for claim_name, claim in claims.items():
        template_name = claim.get("resourceClaimTemplateName")
        template = templates.get(str(template_name))
        if template is None:
            found.append(
                Finding(
                    TEMPLATE_MISSING,
                    WARNING,
                    f"{name}: claim {claim_name}'s template "
                    f"{template_name or claim.get('resourceClaimName')} is not in these files: "
                    "its requests are not checked",
                )
            )
            continue
        requests = [
            str(r.get("name"))
            for r in _list(_get(template, "spec", "spec", "devices", "requests"))
            if isinstance(r, dict)
        ]
        for (c, request), dev_name in used.items():
            if c == claim_name and request not in requests:
                found.append(
                    Finding(
                        REQUEST_UNKNOWN,
                        ERROR,
                        f"{name}: {dev_name} takes request {request}, "
                        f"which template {template_name} does not define ({', '.join(requests)})",
                    )
                )
        for request in requests:
            if (claim_name, request) not in used:
                found.append(
                    Finding(
                        REQUEST_UNUSED,
                        ERROR,
                        f"{name}: request {request} of template "
                        f"{template_name} is allocated but no GPU of the VM uses it",
                    )
                )
    return found


def _companions(name: str, vmi: dict[str, Any], host: Host, permitted: set[str]) -> list[Finding]:
    """Each card the VM takes a function of goes whole: every function requested and permitted."""
    taken = {str(d.get("deviceName")) for _k, d in _devices(vmi) if d.get("deviceName")}
    claimed = any(d.get("claimName") for _k, d in _devices(vmi))
    found: list[Finding] = []
    for gpu in find_gpus(host):
        names = {f: resource_name(f) for f in gpu.functions if not f.is_bridge_like}
        companions = [f for f in names if f is not gpu.primary]
        if names.get(gpu.primary) not in taken and not any(names[f] in taken for f in companions):
            if claimed and companions and gpu.primary.vendor_id == NVIDIA:
                found.append(
                    Finding(
                        COMPANION_MISSING,
                        ERROR,
                        f"{name}: the claim may get {gpu.primary.address}, "
                        f"whose companion functions ({', '.join(str(f.address) for f in companions)}) "
                        "are not requested: they stay on the host and the group is not viable",
                        (gpu.primary.address,),
                    )
                )
            continue
        for fn, rname in names.items():
            if fn is gpu.primary and claimed:
                continue
            if rname not in taken:
                found.append(
                    Finding(
                        COMPANION_MISSING,
                        ERROR,
                        f"{name}: {fn.address} ({fn.name}) of "
                        f"{gpu.primary.address}'s card is not requested as {rname}: it stays "
                        "on the host and the card's group is not viable",
                        (fn.address,),
                    )
                )
            elif permitted and rname not in permitted:
                found.append(
                    Finding(
                        COMPANION_UNPERMITTED,
                        ERROR,
                        f"{fn.address} ({vendor_selector(fn)}) "
                        f"is not in permittedHostDevices as {rname}",
                        (fn.address,),
                    )
                )
    return found


def check_manifests(docs: list[dict[str, Any]], host: Host | None = None) -> list[Finding]:
    if not docs:
        return [Finding(EMPTY, ERROR, "no Kubernetes object in these files: nothing was checked")]
    permitted = _permitted(docs)
    found = shapes(docs) + _names_agree(permitted or [])
    names = {str(e.get("resourceName")) for e in permitted or []}
    templates = {
        str(_get(d, "metadata", "name")): d
        for d in docs
        if d.get("kind") == "ResourceClaimTemplate"
    }
    for doc in docs:
        if doc.get("kind") not in ("VirtualMachine", "VirtualMachineInstance"):
            continue
        vm = str(_get(doc, "metadata", "name"))
        vmi = _vm_spec(doc)
        for kind, dev in _devices(vmi):
            device = dev.get("deviceName")
            if device is None and dev.get("claimName") is None:
                found.append(
                    Finding(
                        NO_SOURCE,
                        ERROR,
                        f"{vm}: {kind} {dev.get('name')} has neither deviceName nor claimName",
                    )
                )
            elif device is not None and permitted is None:
                found.append(
                    Finding(
                        NO_KUBEVIRT_CR,
                        WARNING,
                        f"{vm}: no KubeVirt CR in these files: "
                        f"whether {device} is permitted is not checked",
                    )
                )
            elif device is not None and device not in names:
                found.append(
                    Finding(
                        UNPERMITTED,
                        ERROR,
                        f"{vm}: {kind} {dev.get('name')} asks for "
                        f"{device}, which permittedHostDevices does not name",
                    )
                )
        found += _claims(vm, vmi, templates)
        if host is not None:
            found += _companions(vm, vmi, host, names)
    return found
