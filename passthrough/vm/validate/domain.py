# SPDX-License-Identifier: Apache-2.0
"""The policy and host layers over a parsed domain.

Generic rules (guest PCI addresses, function 0, multifunction, vendor_id values) apply to
every domain. GPU rules apply only to hostdevs that are GPU functions: the host facts say so
(``--host-root``), or the domain carries render's ``<passthrough:policy>`` marker (render
writes hostdevs for whole GPU cards only). A NIC or an HBA passed through is not a GPU.
"""

from __future__ import annotations

from passthrough.vm.domxml import Device, Domain, HostDev
from passthrough.vm.xmlfield import sourceline
from passthrough.vm.xmlns import POLICY_NS

from .rules import DomainFinding, make

TYPE_CHECKING = False
if TYPE_CHECKING:
    from passthrough.model import Finding, Host, PciFunction
    from passthrough.pciaddr import PciAddress as Address
    from passthrough.vm.xmlfield import Element

Slot = tuple[int, int, int]
__all__ = ["POLICY_NS", "check", "hostdevs", "place"]


class Hostdev:
    """A PCI hostdev as the rules see it: its element (where findings land), both addresses
    (read by :class:`passthrough.vm.domxml.HostDev`) and whether the GPU rules apply."""

    __slots__ = ("element", "gpu", "guest", "host", "iommufd")

    def __init__(self, dev: HostDev, gpu: bool):
        self.element = dev.element
        self.host = dev.source  # domain, bus, device, function on the host
        self.guest = dev.guest  # the same in the guest
        self.gpu = gpu
        self.iommufd = dev.iommufd  # <driver iommufd='yes|no'/>; None: left out


class _Ctx:
    def __init__(self, doc: Element, file: str) -> None:
        self.doc = doc
        self.tree = doc.getroottree()
        self.file = file
        self.out: list[DomainFinding] = []

    def add(
        self, code: str, el: Element | None, message: str, devices: tuple[Address, ...] = ()
    ) -> None:
        el = self.doc if el is None else el
        self.out.append(
            make(code, message, self.file, self.tree.getpath(el), sourceline(el), devices)
        )

    def add_finding(self, f: Finding, el: Element | None) -> None:
        """A host policy's own Finding, kept as it is, placed on ``el``."""
        el = self.doc if el is None else el
        path = self.tree.getpath(el)
        self.out.append(DomainFinding(f, self.file, "host", path, sourceline(el)))


def _a(f: PciFunction) -> Address:
    return f.address


class HostFacts:
    """What the rules ask of a host, derived once per host for a whole batch."""

    __slots__ = ("gpu_functions", "gpus", "host", "known")

    def __init__(self, host: Host) -> None:
        from passthrough.analysis.viability import find_gpus

        self.host = host
        self.gpus = find_gpus(host)
        self.gpu_functions = {_a(f) for g in self.gpus for f in g.functions}
        self.known = {_a(f) for f in host.functions}


_FACTS: list[HostFacts] = []  # the last host seen (a batch has one)


def facts(host: Host) -> HostFacts:
    if not _FACTS or _FACTS[0].host is not host:
        _FACTS[:] = [HostFacts(host)]
    return _FACTS[0]


def hostdevs(doc: Element | Domain, host: Host | None) -> list[Hostdev]:
    dom = Domain.of(doc)
    rendered = dom.policy is not None
    on_host = facts(host).gpu_functions if host is not None else set()
    return [Hostdev(h, rendered or h.source in on_host) for h in dom.pci_hostdevs]


def check(doc: Element, file: str, host: Host | None) -> list[DomainFinding]:
    ctx = _Ctx(doc, file)
    devs = hostdevs(doc, host)
    seen: dict[Address, Hostdev] = {}
    for d in devs:
        if d.host is None:
            ctx.add("hostdev-source", d.element, "a PCI hostdev without a readable source address")
        elif d.host in seen:
            ctx.add(
                "hostdev-duplicate",
                d.element,
                f"host device {d.host} is passed twice (line {seen[d.host].element.sourceline}): "
                "libvirt refuses it (hostdev already exists)",
                (d.host,),
            )
        else:
            seen[d.host] = d
    _guest_slots(ctx, devs)
    _iommufd_values(ctx, devs)
    _vendor_id_values(ctx)
    _gpu_rules(ctx, devs, host is not None)
    if host is not None:
        host_layer(ctx, host, devs)
    return ctx.out


def _guest_slots(ctx: _Ctx, devs: list[Hostdev]) -> None:
    """Every device's guest PCI address is unique; a slot that holds a hostdev has a
    function 0, and function 0 is not multifunction='off' there when the slot holds more
    than one function (left out, libvirt's QEMU driver turns it on itself)."""
    seen: dict[Address, Device] = {}
    slots: dict[Slot, dict[int, Device]] = {}
    dom = Domain.of(ctx.doc)
    alias = dom.console_alias
    read = {d.element: d.guest for d in devs}  # each hostdev's guest address, read once
    for device in dom.devices:
        a = read[device.element] if device.element in read else device.guest  # noqa: SIM401 (lazy)
        if a is None or (alias is not None and device.element is alias.element):
            continue
        if a in seen:
            ctx.add(
                "pci-address-duplicate",
                device.element,
                f"guest PCI address {a} is already used by <{seen[a].tag}>",
            )
        seen.setdefault(a, device)
        slots.setdefault(a.slot, {})[a.function] = device
    for slot in sorted({d.guest.slot for d in devs if d.guest is not None}):
        functions = slots.get(slot, {})
        label = f"{slot[0]:04x}:{slot[1]:02x}:{slot[2]:02x}"
        if 0 not in functions:
            first = functions[min(functions)].element
            ctx.add(
                "pci-function0",
                first,
                f"guest slot {label} has no function 0, so the guest never finds "
                f"function {min(functions):x} there",
            )
        elif len(functions) > 1 and functions[0].multifunction is False:
            ctx.add(
                "pci-multifunction",
                functions[0].element,
                f"guest slot {label} holds {len(functions)} functions but function 0 says "
                "multifunction='off': QEMU exposes only function 0",
            )


def _iommufd_values(ctx: _Ctx, devs: list[Hostdev]) -> None:
    """libvirt's schema takes yes or no (virYesNo); a schema older than the attribute
    does not look at it at all, so the policy does."""
    for d in devs:
        if d.iommufd is not None and d.iommufd not in ("yes", "no"):
            ctx.add(
                "hostdev-iommufd-value",
                d.element.find("driver"),
                f"<driver iommufd={d.iommufd!r}/>: libvirt takes yes or no",
                (d.host,) if d.host else (),
            )


def _iommufd_host(ctx: _Ctx, host: Host, devs: list[Hostdev]) -> None:
    """A hostdev on iommufd needs what ``check``'s iommufd check looks for, and a QEMU and
    libvirt new enough (the same words render --iommufd refuses with)."""
    from passthrough.analysis.checks import iommufd_node_lacks
    from passthrough.vm.versions import host_versions, iommufd_lacks

    on = [d for d in devs if d.iommufd == "yes"]
    if not on:
        return
    lacks = iommufd_node_lacks(host)
    lacks += iommufd_lacks(host_versions(host))
    if lacks:
        ctx.add(
            "host-iommufd",
            on[0].element.find("driver"),
            f"{len(on)} hostdev(s) on iommufd, and this host cannot run them: " + "; ".join(lacks),
            tuple(d.host for d in on if d.host),
        )


def _vendor_id_values(ctx: _Ctx) -> None:
    features = Domain.of(ctx.doc).features
    for vendor in features.vendor_ids if features is not None else []:
        if vendor.state is not True:
            continue  # an off vendor_id's value is never used
        value = vendor.value or ""
        if not value or len(value) > 12 or "," in value:
            ctx.add(
                "hyperv-vendor-id-value",
                vendor.element,
                f"vendor_id {value!r} must be 1 to 12 characters without commas",
            )


def _gpu_rules(ctx: _Ctx, devs: list[Hostdev], host_given: bool) -> None:
    gpus = [d for d in devs if d.gpu]
    if not gpus:
        if devs:
            facts_said = (
                "the host's facts call none a GPU" if host_given else "no --host-root facts"
            )
            ctx.add(
                "gpu-scope",
                ctx.doc.find("devices"),
                f"GPU rules not applied to {len(devs)} PCI hostdev(s): {facts_said}, and no "
                "<passthrough:policy> metadata from render",
            )
        return
    dom = Domain.of(ctx.doc)
    marker = dom.policy
    hide = marker is None or marker.hide is not False
    features = dom.features
    if hide:
        if features is None or features.kvm_hidden is not True:
            ctx.add(
                "gpu-hide-kvm",
                features.element if features is not None else None,
                "the KVM signature is visible (add <kvm><hidden state='on'/></kvm>, or opt out with "
                "<passthrough:policy hide='off'/> for drivers that no longer care)",
            )
        vendor = features.vendor_id if features is not None else None
        if vendor is None or vendor.state is not True:
            ctx.add(
                "gpu-vendor-id",
                features.element if features is not None else None,
                "no enabled Hyper-V vendor_id: the NVIDIA driver sees the hypervisor's own",
            )
    cards: dict[Slot, list[Hostdev]] = {}
    for d in gpus:
        if d.host is not None:
            cards.setdefault(d.host.slot, []).append(d)
    for slot, members in sorted(cards.items()):
        if len(members) < 2:
            continue  # one function alone may sit at any guest function 0
        label = f"{slot[0]:04x}:{slot[1]:02x}:{slot[2]:02x}"
        devices = tuple(m.host for m in members if m.host is not None)
        if len({m.guest.slot for m in members if m.guest is not None}) > 1:
            ctx.add(
                "gpu-one-slot",
                members[0].element,
                f"the card {label} is split across guest slots; keep its functions together",
                devices,
            )
        if not any(m.host is not None and m.host.function == 0 for m in members):
            ctx.add(
                "gpu-functions",
                members[0].element,
                f"the card {label} is passed without function 0",
                devices,
            )
        for m in members:
            if m.host is not None and m.guest is not None and m.guest.function != m.host.function:
                ctx.add(
                    "gpu-functions",
                    m.element,
                    f"{m.host} sits at guest function {m.guest.function:x}; keep the card's function "
                    "numbers",
                    (m.host,),
                )


def place(ctx: _Ctx, findings: list[Finding], devs: list[Hostdev]) -> None:
    """Report host-policy ``Finding``s (code, severity, devices) under the host layer, each
    on the hostdev of the first device it names that the domain passes (the domain's
    ``<devices>`` when it names none of them)."""
    by_addr = {d.host: d for d in devs if d.host is not None}
    for f in findings:
        named = (by_addr.get(a) for a in f.devices)
        first = next((d for d in named if d is not None), None)
        ctx.add_finding(f, first.element if first else ctx.doc.find("devices"))


def host_layer(ctx: _Ctx, host: Host, devs: list[Hostdev]) -> None:
    """Everything that needs host facts, in one place: the hostdevs exist, GPU cards go
    whole, the project's safety policy on everything the domain takes (the same policy as
    plan and render: root disk, route NIC, bridges, BMC VGA, shared groups), the
    address planner's arithmetic (can the guest's window hold the BARs, below its limit),
    and the memlock estimate against the limits that apply (hard_limit, the daemons')."""
    from dataclasses import replace

    from passthrough.analysis import policy
    from passthrough.analysis.codes import LARGE_BAR, UNKNOWN_DEVICE, VGPU_VF
    from passthrough.model import Severity
    from passthrough.vm import memlock
    from passthrough.vm.layout_check import layout_findings, window_sure
    from passthrough.vm.validate.vgpu import vgpu_findings
    from passthrough.vm.versions import host_versions

    known = facts(host).known
    vgpu_findings(host, ((d.element, d.host) for d in devs), ctx.add)
    _iommufd_host(ctx, host, devs)
    for d in devs:
        if d.host is not None and d.host not in known:
            ctx.add("host-missing", d.element, f"{d.host} is not on this host", (d.host,))
    passed = {d.host: d for d in devs if d.host is not None}
    for gpu in facts(host).gpus:
        members = [passed[_a(f)] for f in gpu.functions if _a(f) in passed]
        if not members:
            continue
        missing = [f for f in gpu.functions if _a(f) not in passed and not f.is_bridge_like]
        if missing:
            ctx.add(
                "host-whole-card",
                members[0].element,
                f"card {gpu.address} is missing {', '.join(str(f.address) for f in missing)}: "
                "every function goes to the same guest",
                tuple(_a(f) for f in missing),
            )
    for finding, where in memlock.check(ctx.doc, host):
        ctx.add_finding(finding, ctx.doc.find(where))
    _secure_boot_store(ctx, host)
    taken = [a for a in passed if a in known]
    if not taken:
        return
    # A boot VGA the host was prepared for (--allow-boot-gpu) is a warning here, not a
    # refusal: validate cannot know how the host was set up.
    findings = policy.verdict_findings(host, taken, allow_boot_gpu=True)
    # a vGPU VF's own hostdev is what a vGPU guest is given: its form (managed='no', no vfio
    # driver) is judged by host-vgpu-vf-rebound; the card's, with VFs serving vGPUs, stays
    vgpu_vfs = {f.address for f in host.functions if f.vgpu_vf}
    findings = [f for f in findings if not (f.code == VGPU_VF and set(f.devices) <= vgpu_vfs)]
    versions = host_versions(host)
    layout = layout_findings(ctx.doc, host, versions)
    if window_sure(ctx.doc, host, layout, versions):
        # the domain's window surely holds the BARs (layout_check.window_sure): a large BAR
        # is handled here, not a warning a --strict gate should fail on
        held = "; this domain's window holds it"
        findings = [
            replace(f, severity=Severity.INFO, message=f.message + held)
            if f.code == LARGE_BAR
            else f
            for f in findings
        ]
    place(ctx, [f for f in findings if f.code != UNKNOWN_DEVICE], devs)
    place(ctx, layout, devs)


def _secure_boot_store(ctx: _Ctx, host: Host) -> None:
    """A domain that asks for Secure Boot starts from a variable store template: its own
    ``<nvram template=...>``, else the one libvirt picks from the root's descriptors."""
    from passthrough.analysis.guest_firmware import template_cas
    from passthrough.guest.secureboot import FIX_2011, ONLY_2011, vars_file_cas
    from passthrough.host.root import HostRoot

    os_el = ctx.doc.find("os")
    if os_el is None:
        return
    secure = os_el.find("firmware/feature[@name='secure-boot']")
    if (secure is None or secure.get("enabled") != "yes") and os_el.find(
        "loader[@secure='yes']"
    ) is None:
        return
    root = HostRoot(host.root)
    nvram = os_el.find("nvram")
    own = nvram.get("template") if nvram is not None else None
    if own:
        data = root.read_bytes(own.lstrip("/"))
        found = (own, vars_file_cas(data)) if data is not None else None
    else:
        found = template_cas(root)
    if found is not None and found[1].only_2011:
        ctx.add("host-secure-boot-2011", os_el, f"{found[0]} {ONLY_2011}; {FIX_2011}")
