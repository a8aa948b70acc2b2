# SPDX-License-Identifier: Apache-2.0
"""The libvirt layer: what a real connection thinks of the file, without touching anything
that was there before.

The file may be ``virsh dumpxml`` of a domain that exists on that connection. Defining it as
it stands would redefine that domain, and undefining it afterwards would delete it (and its
NVRAM). So a copy is defined under a fresh name and UUID, without the file's NVRAM path, and
only the domain this run created — checked by its UUID — is undefined, keeping any NVRAM.
"""

from __future__ import annotations

import uuid
from typing import Any

from .rules import DomainFinding, make


def private_copy(doc: Any) -> tuple[Any, str, str]:
    """``doc`` under a fresh name and UUID, without an NVRAM path: (copy, name, uuid)."""
    import copy

    from lxml import etree

    mine = copy.deepcopy(doc)
    fresh = uuid.uuid4()
    name = f"passthrough-validate-{fresh.hex[:12]}"
    name_el = mine.find("name")
    if name_el is None:
        name_el = etree.Element("name")
        mine.insert(0, name_el)
    name_el.text = name
    uuid_el = mine.find("uuid")
    if uuid_el is None:
        uuid_el = etree.Element("uuid")
        name_el.addnext(uuid_el)
    uuid_el.text = str(fresh)
    for nvram in mine.findall("os/nvram"):
        # another domain's NVRAM file must never be shared, let alone removed
        nvram.getparent().remove(nvram)
    return mine, name, str(fresh)


def libvirt_check(doc: Any, file: str, uri: str) -> list[DomainFinding]:
    """Define a private copy on ``uri``, read it back, undefine that copy."""
    from lxml import etree

    from passthrough.vm.libvirt_ops import binding, connect

    libvirt = binding()
    mine, _name, fresh = private_copy(doc)
    conn = connect(uri)
    try:
        try:
            dom = conn.defineXML(etree.tostring(mine, encoding="unicode"))
        except libvirt.libvirtError as exc:
            return [
                make(
                    "libvirt-refused",
                    f"{uri} refuses it: {exc.get_error_message()}",
                    file,
                    "/domain",
                    doc.sourceline or 0,
                )
            ]
        if dom.UUIDString() != fresh:  # pragma: no cover - libvirt would have to rename it
            raise RuntimeError(f"libvirt defined {dom.UUIDString()}, not our {fresh}")
        try:
            dom.XMLDesc(0)
        finally:
            keep = getattr(libvirt, "VIR_DOMAIN_UNDEFINE_KEEP_NVRAM", 8)
            try:
                dom.undefineFlags(keep)
            except libvirt.libvirtError:
                dom.undefine()  # drivers without NVRAM support (the test driver)
        return []
    finally:
        conn.close()
