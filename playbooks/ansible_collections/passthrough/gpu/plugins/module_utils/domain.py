# SPDX-License-Identifier: Apache-2.0
# Apache-2.0 (see the passthrough project's LICENSE)
"""An existing libvirt domain against the XML passthrough renders for it.

libvirt rewrites what it is given: it adds a UUID, MAC addresses, PCI addresses, controllers
and input devices, converts memory to KiB, expands the machine alias (q35 becomes
pc-q35-7.2) and groups the devices by kind. A byte comparison would therefore always
differ. What is compared instead is the existing domain *as far as the rendered XML speaks*:
for every element and attribute the rendered XML has, the existing domain's counterpart (the
same tag, matched by attributes, in libvirt's order); what libvirt added on its own is left
out, what the rendered XML asks for and the domain lacks or holds differently shows, and so
does a device of a kind libvirt never adds by itself (a host device, disk, interface) that
the domain has and the rendering does not.

Runs on the KVM host, beside the passthrough package (lxml and libvirt-python are its
dependencies): the sizes and PCI addresses are read by the package's one domain reader
(``passthrough.vm.domxml``), so this comparison and validate never read a domain differently.
The comparison itself stays generic (any element the rendering has), which no field table
could be.
"""

from __future__ import annotations

import copy
import re
from typing import Any

try:
    from lxml import etree
except ImportError:  # only where the passthrough package (which needs lxml) is missing too,
    # and there the module stops before it compares anything
    HAS_LXML = False
else:
    HAS_LXML = True

# elements whose value libvirt stores in KiB whatever unit they were given in
_SIZED = {"memory", "currentMemory", "maxMemory", "pcihole64", "size"}
# devices libvirt does not add on its own (it does add controllers, inputs, audio, consoles)
_OWNED_DEVICES = {"hostdev", "disk", "interface", "filesystem"}


def _normalised(el: Any) -> Any:
    """A copy of ``el`` with sizes in KiB, whitespace-only text dropped, comments gone.
    Sizes and PCI addresses are read by the package's domain reader
    (:mod:`passthrough.vm.domxml`), as validate, the layout check and ``vm status`` read them."""
    from passthrough.vm.domxml import Memory

    el = etree.fromstring(etree.tostring(el))
    for node in el.iter():
        if not isinstance(node.tag, str):
            continue
        if node.text is not None and not node.text.strip():
            node.text = None
        if node.tail is not None and not node.tail.strip():
            node.tail = None
        unit = node.get("unit")
        if etree.QName(node).localname in _SIZED and unit and node.text:
            size = Memory(node).bytes if node.text.strip().isdigit() else None
            if size is not None:
                node.text = str(size // 1024)
                node.set("unit", "KiB")
    _pci_addresses(el)
    for comment in el.xpath("//comment()"):
        parent = comment.getparent()
        if parent is not None:
            parent.remove(comment)
    return el


def _pci_addresses(el: Any) -> None:
    """PCI ``<address>`` attributes written as libvirt writes them back (``bus='10'`` and
    ``bus='0x0a'`` are one bus: libvirt reads both in base 0), so that a domain defined from
    an address in decimal compares equal to the same address in hex. Only the attributes
    written are rewritten (the rendered XML's own say what is compared)."""
    from passthrough.errors import InvalidPciAddress
    from passthrough.pciaddr import PciAddress, libvirt_attrs

    for node in el.iter("address"):
        in_source = node.getparent() is not None and node.getparent().tag == "source"
        if node.get("type") != "pci" and not (in_source and node.get("bus") is not None):
            continue
        try:
            a = PciAddress.from_libvirt(node.attrib)
        except InvalidPciAddress:
            continue  # left as written: libvirt refuses it, and the difference shows
        for name, text in libvirt_attrs(a).items():
            if node.get(name) is not None:
                node.set(name, text)


def _value_matches(name: str, wanted: str, have: str) -> bool:
    if wanted == have:
        return True
    # libvirt expands a machine alias to the versioned type it stands for
    alias = rf"(pc-)?{re.escape(wanted)}(-[\d.]+)?"
    return name == "machine" and re.fullmatch(alias, have) is not None


def _project(have: Any, wanted: Any) -> Any:
    """``have`` cut down to what ``wanted`` speaks of: its attributes, its text, and for each
    wanted child the best counterpart among have's children of that tag."""
    out = etree.Element(have.tag, nsmap=wanted.nsmap)  # the rendered prefixes, not ns0
    for name, value in wanted.attrib.items():
        got = have.get(name)
        if got is not None:
            out.set(name, value if _value_matches(name, value, got) else got)
    if wanted.text is not None:
        out.text = have.text
    unused = [c for c in have if isinstance(c.tag, str)]
    for child in wanted:
        if not isinstance(child.tag, str):
            continue
        same_tag = [c for c in unused if c.tag == child.tag]
        if not same_tag:
            continue
        best = max(same_tag, key=lambda c: _likeness(c, child))
        unused.remove(best)
        out.append(_project(best, child))
    if etree.QName(wanted).localname == "devices":
        # devices libvirt never adds by itself: one the domain has and the rendering lacks
        # (a card taken out of the guest) is a difference, shown next to its kind
        for extra in (c for c in unused if c.tag in _OWNED_DEVICES):
            kin = [i for i, c in enumerate(out) if c.tag == extra.tag]
            out.insert(kin[-1] + 1 if kin else len(out), copy.deepcopy(extra))
    return out


def _likeness(have: Any, wanted: Any) -> tuple[int, int]:
    """How well ``have`` stands for ``wanted``: a whole match first, else shared attributes;
    ties keep libvirt's order (max takes the first)."""
    whole = _text(_project(have, wanted)) == _text(wanted)
    shared = sum(
        1
        for k, v in wanted.attrib.items()
        if have.get(k) is not None and _value_matches(k, v, have.get(k))
    )
    return (int(whole), shared)


def _text(el: Any) -> str:
    # a round trip drops namespace declarations repeated below the root; indent() writes
    # whitespace into the tree it is given, hence the copy
    el = etree.fromstring(etree.tostring(copy.deepcopy(el)), etree.XMLParser(ns_clean=True))
    etree.indent(el, space="  ")
    return str(etree.tostring(el, encoding="unicode")) + "\n"


def compare(existing_xml: str, rendered_xml: str) -> tuple[str, str]:
    """(before, after): the existing domain as far as the rendered XML speaks, and the rendered
    XML, both normalised the same way; equal strings mean the domain is what was rendered."""
    have = _normalised(etree.fromstring(existing_xml.encode()))
    wanted = _normalised(etree.fromstring(rendered_xml.encode()))
    return _text(_project(have, wanted)), _text(wanted)


def with_uuid(rendered_xml: str, uuid: str) -> str:
    """The rendered XML carrying the existing domain's UUID, so that defining it updates that
    domain instead of being refused as a second domain of the same name."""
    doc = etree.fromstring(rendered_xml.encode())
    if doc.find("uuid") is None:
        node = etree.Element("uuid")
        node.text = uuid
        name = doc.find("name")
        doc.insert(0 if name is None else doc.index(name) + 1, node)
    return str(etree.tostring(doc, encoding="unicode"))


def lookup(conn: Any, name: str) -> Any:
    """The domain ``name``, or None when libvirt says there is none (VIR_ERR_NO_DOMAIN); any
    other libvirt error is raised."""
    import libvirt

    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def inactive_xml(dom: Any) -> str:
    """The domain's persistent definition (what the next start uses)."""
    import libvirt

    return str(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
