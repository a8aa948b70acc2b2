# SPDX-License-Identifier: Apache-2.0
"""The one domain-XML reader (passthrough/vm/domxml.py over vm/xmlfield.py): each declared
field written and read back by the same declaration, PCI addresses read in libvirt's base 0,
libvirt's own test domains read without error, and the collection's comparison agreeing with
it on those domains (validate, the layout check and vm status keep their own tests:
test_validate_*.py, test_layout.py, test_vm.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from passthrough.pciaddr import PciAddress
from passthrough.vm import domxml
from passthrough.vm.domxml import (
    Cpu,
    Domain,
    HostDev,
    Interface,
    Memory,
    MemoryDevice,
    NumaCell,
    StorageSource,
)
from passthrough.vm.xmlfield import INT, XMLField, XMLObject, sourceline
from passthrough.vm.xmlfield import Path as FieldPath
from passthrough.vm.xmlns import NSMAP, POLICY_NS, QEMU_NS

from .test_libvirt_corpus import accepted_files, libvirt_tests

REPO = Path(__file__).parents[1]
GOLDEN = REPO / "tests/golden/vm"
COLLECTIONS = REPO / "playbooks"

# (class, field, a value to write, what the written XML then holds): every XMLField of
# domxml's classes has a row (a test below checks that none is missing)
ROUND_TRIPS: list[tuple[type[XMLObject], str, object, str]] = [
    (domxml.Domain, "type", "kvm", "<domain type='kvm'/>"),
    (domxml.Domain, "arch", "ppc64le", "<domain><os><type arch='ppc64le'/></os></domain>"),
    (domxml.Domain, "machine", "q35", "<domain><os><type machine='q35'/></os></domain>"),
    (domxml.Domain, "firmware", "efi", "<domain><os firmware='efi'/></domain>"),
    (
        domxml.Domain,
        "loader",
        "/usr/share/OVMF/OVMF_CODE_4M.fd",
        "<domain><os><loader>/usr/share/OVMF/OVMF_CODE_4M.fd</loader></os></domain>",
    ),
    (domxml.HostDev, "type", "pci", "<hostdev type='pci'/>"),
    (domxml.HostDev, "mode", "subsystem", "<hostdev mode='subsystem'/>"),
    (domxml.HostDev, "driver", "vfio", "<hostdev><driver name='vfio'/></hostdev>"),
    (domxml.HostDev, "iommufd", "yes", "<hostdev><driver iommufd='yes'/></hostdev>"),
    (domxml.StorageSource, "type", "nvme", "<backingStore type='nvme'/>"),
    (domxml.Controller, "type", "pci", "<controller type='pci'/>"),
    (domxml.Controller, "model", "pci-root", "<controller model='pci-root'/>"),
    (domxml.Device, "multifunction", True, "<video><address multifunction='on'/></video>"),
    (domxml.Console, "target_type", "serial", "<console><target type='serial'/></console>"),
    (domxml.VendorId, "state", True, "<vendor_id state='on'/>"),
    (domxml.VendorId, "value", "passthrough", "<vendor_id value='passthrough'/>"),
    (
        domxml.Features,
        "kvm_hidden",
        False,
        "<features><kvm><hidden state='off'/></kvm></features>",
    ),
    (domxml.Memory, "value", 16777216, "<memory>16777216</memory>"),
    (domxml.Memory, "unit", "KiB", "<memory unit='KiB'/>"),
    (domxml.MaxPhysAddr, "mode", "emulate", "<maxphysaddr mode='emulate'/>"),
    (domxml.MaxPhysAddr, "bits", 46, "<maxphysaddr bits='46'/>"),
    (domxml.MaxPhysAddr, "limit", 39, "<maxphysaddr limit='39'/>"),
    (domxml.Cpu, "mode", "host-passthrough", "<cpu mode='host-passthrough'/>"),
    (domxml.NumaCell, "memory", 1048576, "<cell memory='1048576'/>"),
    (domxml.NumaCell, "unit", "MiB", "<cell unit='MiB'/>"),
    (domxml.FwCfgEntry, "name", "opt/ovmf/X-PciMmio64Mb", "<entry name='opt/ovmf/X-PciMmio64Mb'/>"),
    (domxml.FwCfgEntry, "value", "65536", "<entry>65536</entry>"),
    (domxml.QemuArg, "value", "-fw_cfg", "<arg value='-fw_cfg'/>"),
    (domxml.PolicyMarker, "hide", False, "<policy hide='off'/>"),
]


def _tag(text: str) -> str:
    return str(etree.fromstring(text).tag)


def _same(el: Any, text: str) -> None:
    assert etree.tostring(el) == etree.tostring(etree.fromstring(text))


@pytest.mark.parametrize(("kind", "field", "value", "xml"), ROUND_TRIPS)
def test_each_field_is_read_and_written_by_its_one_declaration(
    kind: type[XMLObject], field: str, value: object, xml: str
) -> None:
    obj = kind(etree.Element(_tag(xml)))
    assert getattr(obj, field) is None  # nothing there yet
    setattr(obj, field, value)
    _same(obj.element, xml)  # written where the path says, as the converter writes it
    assert getattr(obj, field) == value  # and read back by the same declaration
    assert getattr(kind(etree.fromstring(xml)), field) == value  # as it reads a parsed one
    setattr(obj, field, None)
    assert getattr(obj, field) is None  # None takes it out again


def test_every_declared_field_has_a_round_trip() -> None:
    declared = {
        (cls.__name__, name)
        for cls in vars(domxml).values()
        if isinstance(cls, type) and issubclass(cls, XMLObject)
        for name, attr in vars(cls).items()
        if isinstance(attr, XMLField)
    }
    assert declared == {(kind.__name__, field) for kind, field, _v, _x in ROUND_TRIPS}


def test_pci_addresses_are_read_in_base_0_and_written_in_hex() -> None:
    """libvirt reads each attribute in base 0 (strtoul): '10' is ten, '0x10' sixteen, '010'
    eight; it writes them back in hex. A value libvirt refuses reads as None."""
    read = {
        "bus='10' slot='1'": PciAddress(0, 10, 1, 0),
        "bus='0x10' slot='0x1f' function='7'": PciAddress(0, 16, 31, 7),
        "bus='010' slot='00' function='01'": PciAddress(0, 8, 0, 1),
        "domain='0x10000' bus=' +2'": PciAddress(0x10000, 2, 0, 0),
        "bus='0x100'": None,  # above libvirt's bus range
        "bus='-1'": None,
        "bus='ten'": None,
    }
    for attrs, want in read.items():
        hd = HostDev(etree.fromstring(f"<hostdev><address type='pci' {attrs}/></hostdev>"))
        assert hd.address == want, attrs
    untyped = HostDev(etree.fromstring("<hostdev><address type='drive' bus='1'/></hostdev>"))
    assert untyped.address is None  # only a type='pci' address is a guest PCI address
    # the source carries no type: read all the same
    src = HostDev(etree.fromstring("<hostdev><source><address bus='24'/></source></hostdev>"))
    assert src.source == PciAddress(0, 24, 0, 0)

    hd = HostDev(etree.Element("hostdev"))
    hd.source = PciAddress(0, 0x18, 0, 1)
    hd.address = PciAddress(0, 6, 0, 1)
    _same(
        hd.element,
        "<hostdev><source><address domain='0x0000' bus='0x18' slot='0x00' function='0x1'/>"
        "</source><address type='pci' domain='0x0000' bus='0x06' slot='0x00' function='0x1'/>"
        "</hostdev>",
    )
    assert (hd.source, hd.address) == (PciAddress(0, 0x18, 0, 1), PciAddress(0, 6, 0, 1))
    hd.address = None
    assert hd.address is None and hd.element.find("address") is None


def test_an_empty_guest_address_is_left_for_libvirt_to_assign() -> None:
    hd = HostDev(etree.fromstring("<hostdev><address type='pci' function='1'/></hostdev>"))
    assert hd.address == PciAddress(0, 0, 0, 1) and hd.guest is None


@pytest.mark.parametrize(
    ("unit", "bytes_"),
    [
        (None, 4 << 10),  # libvirt's default unit: KiB
        ("b", 4),
        ("bytes", 4),
        ("KB", 4000),
        ("k", 4 << 10),
        ("KiB", 4 << 10),
        ("MB", 4 * 1000**2),
        ("M", 4 << 20),
        ("GiB", 4 << 30),
        ("gb", 4 * 1000**3),
        ("TiB", 4 << 40),
        ("TB", 4 * 1000**4),
        ("PiB", 4 << 50),
        ("furlongs", None),
    ],
)
def test_memory_in_each_libvirt_unit(unit: str | None, bytes_: int | None) -> None:
    mem = Memory(etree.Element("memory"))
    mem.value, mem.unit = 4, unit
    assert mem.bytes == bytes_


def test_children_are_added_and_listed() -> None:
    dom = Domain(etree.Element("domain"))
    assert dom.hostdevs == [] and dom.memory is None and dom.policy is None
    one, two = Domain.hostdevs.add(dom), Domain.hostdevs.add(dom)
    one.type, two.type = "pci", "usb"
    one.source = PciAddress(0, 1, 0, 0)
    assert [h.source for h in dom.pci_hostdevs] == [PciAddress(0, 1, 0, 0)]
    assert len(dom.element.findall("devices")) == 1  # the second went into the same <devices>
    Domain.policy.make(dom).hide = False
    assert dom.element.find(f"metadata/{{{POLICY_NS}}}policy").get("hide") == "off"
    assert dom.policy is not None and dom.policy.hide is False
    arg = Domain.qemu_args.add(dom)
    arg.value = "-fw_cfg"
    assert dom.element.find(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg") is not None
    entry = Domain.fwcfg.add(dom)
    entry.name, entry.value = "opt/ovmf/X-PciMmio64Mb", "65536"
    again = Domain.parse(dom.tostring())
    assert [(e.name, e.value) for e in again.fwcfg] == [("opt/ovmf/X-PciMmio64Mb", "65536")]
    assert [a.value for a in again.qemu_args] == ["-fw_cfg"]


def test_the_memlock_estimates_children_are_written_and_read_back() -> None:
    """What the memlock estimate reads (vm/memlock.py): sizes, markers, the interfaces,
    disks (with their backing chain), controllers and memory devices, each made through
    its declaration and read back from the XML written."""
    dom = Domain(etree.Element("domain"))
    for child, size in ((Domain.max_memory, 64), (Domain.hard_limit, 20)):
        mem = child.make(dom)
        mem.value, mem.unit = size, "GiB"
    Domain.locked.make(dom)
    cpu = Domain.cpu.make(dom)
    for _ in range(2):
        cell = Cpu.numa_cells.add(cpu)
        cell.memory, cell.unit = 2, "GiB"
    Domain.memory_devices.add(dom)
    dimm = MemoryDevice.size.make(Domain.memory_devices.add(dom))
    dimm.value = 524288  # KiB: libvirt's default unit
    Domain.interfaces.add(dom).type = "vdpa"
    nic = Domain.interfaces.add(dom)
    nic.type, nic.driver, nic.source = "hostdev", "vfio", PciAddress(0, 0x3B, 0, 2)
    Interface.placed.make(nic)  # an <address> of no type: placed all the same
    Domain.disks.add(dom).type = "file"
    disk = Domain.disks.add(dom)
    disk.type = "file"
    layer = StorageSource(etree.SubElement(disk.element, "backingStore"))
    layer.type = "file"
    StorageSource(etree.SubElement(layer.element, "backingStore")).type = "nvme"
    root = Domain.controllers.add(dom)
    root.type, root.model = "pci", "pci-root"
    Domain.iommu.make(dom)

    again = Domain.parse(dom.tostring())
    assert again.max_memory is not None and again.max_memory.bytes == 64 << 30
    assert again.hard_limit is not None and again.hard_limit.bytes == 20 << 30
    assert again.locked is not None and again.iommu is not None
    assert again.cpu is not None and [c.bytes for c in again.cpu.numa_cells] == [2 << 30] * 2
    assert [m.size.bytes if m.size else None for m in again.memory_devices] == [None, 512 << 20]
    assert [(i.type, i.driver, i.source) for i in again.interfaces] == [
        ("vdpa", None, None),
        ("hostdev", "vfio", PciAddress(0, 0x3B, 0, 2)),
    ]
    assert [i.placed is not None for i in again.interfaces] == [False, True]
    assert [[layer.type for layer in d.chain] for d in again.disks] == [
        ["file"],
        ["file", "file", "nvme"],
    ]
    assert [(c.type, c.model) for c in again.controllers] == [("pci", "pci-root")]
    # what is not there reads as not there
    bare = Domain.parse("<domain><devices><disk type='file'/></devices></domain>")
    assert (bare.max_memory, bare.hard_limit, bare.locked, bare.iommu, bare.arch) == (None,) * 5
    assert bare.disks[0].backing_store is None
    # libvirt follows the first <backingStore> child of each layer (virXPathNode), nothing
    # elsewhere: the nvme one under <source> and the second sibling are no layers of it
    stray = Domain.parse(
        "<domain><devices><disk type='file'><source><backingStore type='nvme'/></source>"
        "<backingStore type='file'/><backingStore type='nvme'/></disk></devices></domain>"
    )
    assert [layer.type for layer in stray.disks[0].chain] == ["file", "file"]


def test_a_size_is_read_as_libvirt_reads_its_text() -> None:
    """``<memory>`` and a NUMA cell's ``memory`` read by units.libvirt_size on the text as
    written: what it refuses (a sign, an underscore) is no size, as it is to memlock."""
    for text, want in (("1024", 1 << 20), (" 1024 ", 1 << 20), ("+1024", None), ("1_024", None)):
        assert Memory(etree.fromstring(f"<memory>{text}</memory>")).bytes == want, text
        assert NumaCell(etree.fromstring(f"<cell memory='{text}'/>")).bytes == want, text


def test_a_rendered_domain_reads_as_render_wrote_it() -> None:
    dom = Domain.parse((GOLDEN / "consumer-2fn.xml").read_bytes())
    assert dom.type == "kvm"
    assert dom.memory is not None and dom.memory.bytes == 16 << 30
    assert [(h.source, h.guest) for h in dom.pci_hostdevs] == [
        (PciAddress(0, 1, 0, 0), PciAddress(0, 1, 0, 0)),
        (PciAddress(0, 1, 0, 1), PciAddress(0, 1, 0, 1)),
    ]
    assert dom.policy is not None and dom.features is not None
    assert dom.features.kvm_hidden is True
    assert [(v.state, v.value) for v in dom.features.vendor_ids] == [(True, "passthrough")]
    assert [a.value for a in dom.qemu_args] == [
        "-fw_cfg",
        "name=opt/ovmf/X-PciMmio64Mb,string=65536",
    ]


def test_the_console_alias_is_serial_0_itself() -> None:
    def alias(devices: str) -> bool:
        return (
            Domain.parse(f"<domain><devices>{devices}</devices></domain>").console_alias is not None
        )

    assert alias("<serial type='pty'/><console type='pty'><target type='serial'/></console>")
    assert alias("<serial type='pty'/><console type='pty'/>")
    assert not alias("<serial type='pty'/><console type='pty'><target type='virtio'/></console>")
    assert not alias("<console type='pty'><target type='serial'/></console>")  # no serial


def test_paths_are_checked_when_declared() -> None:
    with pytest.raises(ValueError, match="not a path step"):
        FieldPath("devices/host dev")
    with pytest.raises(ValueError, match="cannot be written"):
        XMLField("*/@x", INT).__set__(XMLObject(etree.Element("a")), 1)
    assert set(NSMAP.values()) == {POLICY_NS, QEMU_NS}


def test_sourceline_of_parsed_and_built_elements() -> None:
    doc = etree.fromstring(b"<domain>\n  <name>x</name>\n</domain>")
    assert sourceline(doc.find("name")) == 2 and sourceline(etree.Element("x")) == 0


# -- libvirt's own test domains (the realworld tier: fetched into the test cache) -----------


def _read_everything(dom: Domain) -> tuple[object, ...]:
    """Every declared field of the domain, read (what any caller could ask)."""
    f, c, m = dom.features, dom.cpu, dom.memory
    return (
        dom.type,
        m.bytes if m else None,
        c.mode if c else None,
        (c.maxphysaddr.mode, c.maxphysaddr.bits, c.maxphysaddr.limit)
        if c and c.maxphysaddr
        else None,
        (f.kvm_hidden, [(v.state, v.value) for v in f.vendor_ids]) if f else None,
        dom.policy.hide if dom.policy else None,
        [(d.tag, d.guest) for d in dom.devices],
        [(h.type, h.source, h.address) for h in dom.hostdevs],
        dom.console_alias,
        [(e.name, e.value) for e in dom.fwcfg],
        [a.value for a in dom.qemu_args],
        # what the memlock estimate reads
        dom.arch,
        [s.bytes if s else None for s in (dom.max_memory, dom.hard_limit)],
        (dom.locked is None, dom.iommu is None),
        [cell.bytes for cell in c.numa_cells] if c else None,
        [m.size.bytes if m.size else None for m in dom.memory_devices],
        [(h.mode, h.driver, h.placed is None) for h in dom.hostdevs],
        [(i.type, i.driver, i.source, i.placed is None) for i in dom.interfaces],
        [[layer.type for layer in d.chain] for d in dom.disks],
        [(k.type, k.model) for k in dom.controllers],
    )


@pytest.mark.realworld
def test_libvirts_test_domains_read_without_error() -> None:
    files = accepted_files(libvirt_tests())
    assert len(files) > 1000
    sources = 0
    for path in files:
        dom = Domain.parse(path.read_bytes())
        _read_everything(dom)
        for h in dom.pci_hostdevs:
            sources += h.source is not None
    assert sources > 50  # the corpus's PCI hostdevs, read


@pytest.mark.realworld
def test_the_collections_comparison_and_the_reader_agree_on_libvirts_domains() -> None:
    """The module's normalisation (sizes to KiB, PCI addresses as libvirt writes them) run on
    each of libvirt's test domains, then read by the package's reader: the same hostdevs and
    guest addresses, the same memory (to the KiB libvirt keeps), as the domain as written."""
    if str(COLLECTIONS) not in sys.path:
        sys.path.append(str(COLLECTIONS))
    from ansible_collections.passthrough.gpu.plugins.module_utils import domain as module

    checked = 0
    for path in accepted_files(libvirt_tests()):
        raw = Domain.parse(path.read_bytes())
        if not raw.pci_hostdevs:
            continue
        norm = Domain(module._normalised(raw.element))
        before = [(h.source, h.address) for h in raw.pci_hostdevs]
        assert [(h.source, h.address) for h in norm.pci_hostdevs] == before, path.name
        size = raw.memory.bytes if raw.memory else None
        if size is not None:
            assert norm.memory is not None and norm.memory.bytes == size // 1024 * 1024
        checked += 1
    assert checked >= 30  # libvirt 9.0.0 has 34 accepted domains with PCI hostdevs
