"""Validating domain XML — ours or hand-written — in three layers.

1. libvirt's RelaxNG schema (loaded once per process, not one xmllint per file);
2. our passthrough policy: hypervisor hidden, a sane vendor_id, whole cards on one guest
   slot with multifunction on function 0, an MMIO window for large BARs (with host facts);
3. optionally libvirt itself: define on a connection, read back, undefine.

Files opt out of hiding with ``<passthrough:policy hide='off'/>`` in ``<metadata>``
(namespace ``https://passthrough.dev/xmlns/policy/1``), which ``render --no-hide`` writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

from lxml import etree

from passthrough.analysis.viability import find_gpus, mmio_window_bytes
from passthrough.model import Host, PciFunction
from passthrough.vm.render import POLICY_NS
from passthrough.vm.spec import OVMF_DEFAULT_MMIO

SCHEMA_DIRS = ("/usr/share/libvirt/schemas",)
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"


@dataclass(frozen=True)
class Finding:
    file: str
    xpath: str
    rule: str
    message: str

    def line(self) -> str:
        return f"{self.file}:{self.xpath}: [{self.rule}] {self.message}"


_SCHEMA: etree.RelaxNG | None = None


def schema() -> etree.RelaxNG:
    global _SCHEMA
    if _SCHEMA is None:
        for d in SCHEMA_DIRS:
            path = Path(d) / "domain.rng"
            if path.exists():
                _SCHEMA = etree.RelaxNG(etree.parse(str(path)))
                break
        else:
            raise FileNotFoundError("libvirt's domain.rng not found (install libvirt-clients)")
    return _SCHEMA


def _addr(el: Any) -> tuple[int, int, int, int] | None:
    try:
        return (
            int(el.get("domain", "0"), 16),
            int(el.get("bus"), 16),
            int(el.get("slot"), 16),
            int(el.get("function", "0"), 16),
        )
    except (TypeError, ValueError):
        return None


def policy(doc: Any, name: str, host: Host | None) -> list[Finding]:
    tree = doc.getroottree()
    out: list[Finding] = []

    def find(el: Any, rule: str, message: str) -> None:
        out.append(Finding(name, tree.getpath(el), rule, message))

    marker = doc.find(f"metadata/{{{POLICY_NS}}}policy")
    hide = marker is None or marker.get("hide", "on") != "off"
    hostdevs = [h for h in doc.findall("devices/hostdev") if h.get("type") == "pci"]
    if hide and hostdevs:
        hidden = doc.find("features/kvm/hidden")
        if hidden is None or hidden.get("state") != "on":
            find(
                doc.find("features") if doc.find("features") is not None else doc,
                "hide-kvm",
                "the KVM signature is visible (add <kvm><hidden state='on'/></kvm>, or opt out with "
                "<passthrough:policy hide='off'/> for drivers that no longer care)",
            )
        vendor = doc.find("features/hyperv/vendor_id")
        if vendor is None or vendor.get("state") != "on":
            find(
                doc.find("features") if doc.find("features") is not None else doc,
                "vendor-id",
                "no Hyper-V vendor_id: the NVIDIA driver sees the hypervisor's own",
            )
    for vendor in doc.findall("features/hyperv/vendor_id"):
        value = vendor.get("value") or ""
        if len(value) > 12 or "," in value or not value:
            find(
                vendor,
                "vendor-id",
                f"vendor_id {value!r} must be 1 to 12 characters without commas",
            )

    # Cards: group hostdevs by host slot.
    cards: dict[
        tuple[int, int, int],
        list[tuple[Any, tuple[int, int, int, int], tuple[int, int, int, int] | None]],
    ] = {}
    for h in hostdevs:
        src = h.find("source/address")
        host_addr = _addr(src) if src is not None else None
        if host_addr is None:
            find(h, "hostdev", "a PCI hostdev without a readable source address")
            continue
        guest_el = h.find("address")
        guest = _addr(guest_el) if guest_el is not None and guest_el.get("type") == "pci" else None
        cards.setdefault(host_addr[:3], []).append((h, host_addr, guest))
    for slot, members in sorted(cards.items()):
        label = f"{slot[0]:04x}:{slot[1]:02x}:{slot[2]:02x}"
        guests = {g[:3] for _, _, g in members if g is not None}
        if len(guests) > 1:
            find(
                members[0][0],
                "one-slot",
                f"the card {label} is split across guest slots; keep its functions together",
            )
        for h, host_addr, guest in members:
            if guest is not None and guest[3] != host_addr[3]:
                find(
                    h,
                    "functions",
                    f"{label}.{host_addr[3]:x} sits at guest function {guest[3]:x}; keep the card's function numbers",
                )
        if len(members) > 1:
            f0 = [(h, g) for h, a, g in members if a[3] == 0]
            if not f0:
                find(members[0][0], "functions", f"the card {label} is passed without function 0")
            else:
                h, _g = f0[0]
                addr = h.find("address")
                if addr is None or addr.get("multifunction") != "on":
                    find(
                        h,
                        "multifunction",
                        f"function 0 of {label} needs multifunction='on' on its guest address",
                    )
    if host is not None:
        by_slot = {g.address.slot: g for g in find_gpus(host)}
        functions: list[PciFunction] = []
        for slot, members in sorted(cards.items()):
            gpu = by_slot.get(slot)
            if gpu is None:
                known = {f.address.slot for f in host.functions}
                if slot not in known:
                    find(
                        members[0][0],
                        "host",
                        f"{slot[0]:04x}:{slot[1]:02x}:{slot[2]:02x} is not on this host",
                    )
                continue
            present = {a[3] for _, a, _ in members}
            missing = [
                f
                for f in gpu.functions
                if f.address.function not in present and not f.is_bridge_like
            ]
            if missing:
                find(
                    members[0][0],
                    "whole-card",
                    f"card {gpu.address} is missing {', '.join(str(f.address) for f in missing)}: every function goes to the same guest",
                )
            functions.extend(gpu.functions)
        needed = mmio_window_bytes(functions)
        large = any(b.size >= OVMF_DEFAULT_MMIO for f in functions for b in f.bars if not b.is_io)
        if large or needed > OVMF_DEFAULT_MMIO:
            hole = doc.find("devices/controller[@model='pcie-root']/pcihole64")
            if hole is None:
                find(
                    doc.find("devices"),
                    "mmio-window",
                    f"large BARs need a 64-bit MMIO window of {needed >> 30} GiB: add <pcihole64> on pcie-root",
                )
            fw = [a.get("value", "") for a in doc.iter(f"{{{QEMU_NS}}}arg")]
            sizes = [
                int(v.rsplit("=", 1)[1])
                for v in fw
                if "X-PciMmio64Mb" in v and v.rsplit("=", 1)[1].isdigit()
            ]
            if not sizes or max(sizes) < needed >> 20:
                find(
                    doc,
                    "mmio-window",
                    f"OVMF needs opt/ovmf/X-PciMmio64Mb of at least {needed >> 20} MiB (qemu:commandline -fw_cfg)",
                )
    return out


def validate_text(
    text: bytes, name: str, host: Host | None = None, use_schema: bool = True
) -> list[Finding]:
    try:
        doc = etree.fromstring(text, etree.XMLParser(resolve_entities=False, no_network=True))
    except etree.XMLSyntaxError as exc:
        return [Finding(name, "/", "xml", f"not well-formed XML: {exc}")]
    out: list[Finding] = []
    if doc.tag != "domain":
        return [
            Finding(
                name,
                "/" + str(doc.tag),
                "xml",
                "not a libvirt domain (root element must be <domain>)",
            )
        ]
    if use_schema:
        rng = schema()
        if not rng.validate(doc):
            errors = rng.error_log.filter_from_errors()[:3] or rng.error_log[:1]
            for e in errors:
                out.append(
                    Finding(name, e.path or "/domain", "schema", f"line {e.line}: {e.message}")
                )
    out.extend(policy(doc, name, host))
    return out


def libvirt_check(text: str, name: str, uri: str) -> list[Finding]:
    """Define on ``uri``, read it back, undefine — what libvirt itself thinks."""
    from passthrough.vm.libvirt_ops import connect

    conn = connect(uri)
    try:
        import libvirt

        try:
            dom = conn.defineXML(text)
        except libvirt.libvirtError as exc:
            return [
                Finding(name, "/domain", "libvirt", f"{uri} refuses it: {exc.get_error_message()}")
            ]
        try:
            dom.XMLDesc(0)
        finally:
            try:
                dom.undefineFlags(getattr(libvirt, "VIR_DOMAIN_UNDEFINE_NVRAM", 4))
            except libvirt.libvirtError:
                dom.undefine()
        return []
    finally:
        conn.close()


def junit(results: dict[str, list[Finding]]) -> str:
    failures = sum(1 for f in results.values() if f)
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuite name="passthrough validate" tests="{len(results)}" failures="{failures}">',
    ]
    for name, findings in results.items():
        lines.append(f'  <testcase classname="passthrough.validate" name={quoteattr(name)}>')
        if findings:
            body = "\n".join(f.line() for f in findings)
            lines.append(
                f"    <failure message={quoteattr(findings[0].message)}>{_escape(body)}</failure>"
            )
        lines.append("  </testcase>")
    lines.append("</testsuite>")
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
