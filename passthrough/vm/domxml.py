# SPDX-License-Identifier: Apache-2.0
"""A libvirt domain, read (and written) through declared fields: the one reader of domain XML
for validate, the layout check, the memlock estimate, ``vm status`` and the collection's
domain comparison.

Only the fields those callers use are declared; each is one :class:`XMLField` (path and
converter, see :mod:`passthrough.vm.xmlfield`), so what is read is what would be written.
PCI addresses are read as libvirt reads them (each attribute in base 0,
:meth:`PciAddress.from_libvirt`) and written as libvirt writes them back (hex).

    dom = Domain.parse(xml_bytes)
    for hd in dom.pci_hostdevs:
        print(hd.source, hd.guest)
"""

from __future__ import annotations

from typing import overload

from lxml import etree

from passthrough.errors import InvalidPciAddress
from passthrough.pciaddr import PciAddress, libvirt_attrs
from passthrough.units import libvirt_size
from passthrough.vm.xmlfield import (
    INT,
    ON_OFF,
    STR,
    Element,
    Path,
    XMLChild,
    XMLChildren,
    XMLField,
    XMLObject,
)

__all__ = ["Domain", "HostDev", "PciAddressField"]


class Marker(XMLObject):
    """An element that says what it says by being there (``<memoryBacking><locked/>``, a
    device's ``<address>`` of any type, ``<iommu>``)."""

    __slots__ = ()


class PciAddressField:
    """A PCI ``<address>`` element at ``path``: read as libvirt reads it (None where it is
    missing, of another type when ``typed``, or refused by libvirt), written as libvirt
    writes it back (``type='pci'`` and the four attributes in hex); None removes it.

    ``typed``: only an ``<address type='pci'>`` counts (a guest address; a hostdev's
    ``<source><address>`` carries no type)."""

    def __init__(self, path: str, typed: bool = True) -> None:
        self.path = Path(path)
        self.typed = typed

    @overload
    def __get__(self, obj: None, owner: type[XMLObject]) -> PciAddressField: ...
    @overload
    def __get__(self, obj: XMLObject, owner: type[XMLObject]) -> PciAddress | None: ...
    def __get__(
        self, obj: XMLObject | None, owner: type[XMLObject]
    ) -> PciAddressField | PciAddress | None:
        if obj is None:
            return self
        node = self.node(obj)
        if node is None:
            return None
        try:
            return PciAddress.from_libvirt(node.attrib)
        except InvalidPciAddress:
            return None

    def node(self, obj: XMLObject) -> Element | None:
        """The ``<address>`` element itself (None where missing or not of type pci)."""
        node = self.path.find(obj.element)
        if node is None or (self.typed and node.get("type") != "pci"):
            return None
        return node

    def __set__(self, obj: XMLObject, value: PciAddress | None) -> None:
        node = self.path.find(obj.element)
        if value is None:
            if node is not None and (parent := node.getparent()) is not None:
                parent.remove(node)
            return
        if node is None:
            node = self.path.make(obj.element)
        if self.typed:
            node.set("type", "pci")
        for name, text in libvirt_attrs(value).items():
            node.set(name, text)


class Device(XMLObject):
    """Any element under ``<devices>``; what the guest-slot rules read of it."""

    __slots__ = ()
    address = PciAddressField("address")
    # any <address>, of whatever type: the device is placed already
    placed = XMLChild(Marker, "address")
    # on function 0: whether the slot's other functions show (left out, libvirt decides)
    multifunction = XMLField("address/@multifunction", ON_OFF)

    @property
    def tag(self) -> str:
        return str(self.element.tag)

    @property
    def guest(self) -> PciAddress | None:
        """The guest PCI address; None where there is none, or where it is libvirt's
        "empty" address (domain, bus and slot 0: libvirt picks one)."""
        a = self.address
        return None if a is None or a.is_unassigned else a


class HostDev(Device):
    """``<hostdev>``: the host function (``<source><address>``) and where the guest sees it."""

    __slots__ = ()
    type = XMLField("@type", STR)
    mode = XMLField("@mode", STR)  # left out: libvirt's "subsystem"
    source = PciAddressField("source/address", typed=False)
    driver = XMLField("driver/@name", STR)  # left out: QEMU's default, vfio
    iommufd = XMLField("driver/@iommufd", STR)  # yes: on iommufd (libvirt 12.1+)


class Interface(HostDev):
    """``<interface>``: of ``type='hostdev'`` it is a PCI hostdev to libvirt (the same
    ``<source><address>``, ``<driver name>`` and guest address), of ``type='vdpa'`` a vDPA
    device."""

    __slots__ = ()


class StorageSource(XMLObject):
    """A disk or one of its ``<backingStore>`` layers: ``type='nvme'`` is a host NVMe
    controller handed to QEMU's userspace driver (over VFIO)."""

    __slots__ = ()
    type = XMLField("@type", STR)

    @property
    def backing_store(self) -> StorageSource | None:
        """The next layer down (``<backingStore>``); None at the bottom."""
        # declared below the class: the XMLChild names the class it is on
        return _BACKING_STORE.__get__(self, StorageSource)

    @property
    def chain(self) -> list[StorageSource]:
        """This layer and every one below it, top first."""
        layers: list[StorageSource] = []
        layer: StorageSource | None = self
        while layer is not None:
            layers.append(layer)
            layer = layer.backing_store
        return layers


_BACKING_STORE = XMLChild(StorageSource, "backingStore")


class Disk(Device, StorageSource):
    """``<disk>``: a device whose storage is a chain of :class:`StorageSource` layers."""

    __slots__ = ()


class Controller(Device):
    __slots__ = ()
    type = XMLField("@type", STR)
    model = XMLField("@model", STR)


class Console(XMLObject):
    __slots__ = ()
    target_type = XMLField("target/@type", STR)


class VendorId(XMLObject):
    """``<features><hyperv><vendor_id state='on' value='...'/>``."""

    __slots__ = ()
    state = XMLField("@state", ON_OFF)
    value = XMLField("@value", STR)


class Features(XMLObject):
    __slots__ = ()
    kvm_hidden = XMLField("kvm/hidden/@state", ON_OFF)
    vendor_ids = XMLChildren(VendorId, "hyperv/vendor_id")
    vendor_id = XMLChild(VendorId, "hyperv/vendor_id")


class Memory(XMLObject):
    """A size as libvirt writes one: ``<memory unit='KiB'>N</memory>`` (libvirt's default
    unit is KiB); ``<maxMemory>``, ``<memtune><hard_limit>``, a memory device's
    ``<target><size>`` alike."""

    __slots__ = ()
    value = XMLField(".", INT)
    unit = XMLField("@unit", STR)

    @property
    def bytes(self) -> int | None:
        """The size in bytes, the text read as libvirt reads it; None where the number or
        the unit is unreadable."""
        return libvirt_size(Memory.value.raw(self), self.unit)


class MemoryDevice(Device):
    """``<devices><memory>`` (a DIMM, virtio-mem...): its size is ``<target><size>``."""

    __slots__ = ()
    size = XMLChild(Memory, "target/size")


class NumaCell(XMLObject):
    """``<cpu><numa><cell memory='N' unit='KiB'/>``."""

    __slots__ = ()
    memory = XMLField("@memory", INT)
    unit = XMLField("@unit", STR)

    @property
    def bytes(self) -> int | None:
        """The cell's memory in bytes (as :attr:`Memory.bytes` reads a size)."""
        return libvirt_size(NumaCell.memory.raw(self), self.unit)


class MaxPhysAddr(XMLObject):
    """``<cpu><maxphysaddr mode='emulate' bits='42'/>`` or ``mode='passthrough' limit='..'``."""

    __slots__ = ()
    mode = XMLField("@mode", STR)
    bits = XMLField("@bits", INT)
    limit = XMLField("@limit", INT)


class Cpu(XMLObject):
    __slots__ = ()
    mode = XMLField("@mode", STR)
    maxphysaddr = XMLChild(MaxPhysAddr, "maxphysaddr")
    numa_cells = XMLChildren(NumaCell, "numa/cell")


class FwCfgEntry(XMLObject):
    """``<sysinfo type='fwcfg'><entry name='opt/...'>value</entry>``."""

    __slots__ = ()
    name = XMLField("@name", STR)
    value = XMLField(".", STR)


class QemuArg(XMLObject):
    """``<qemu:commandline><qemu:arg value='...'/>``."""

    __slots__ = ()
    value = XMLField("@value", STR)


class PolicyMarker(XMLObject):
    """render's ``<metadata><passthrough:policy hide='on'/>``: written only into domains
    render made, for whole GPU cards."""

    __slots__ = ()
    hide = XMLField("@hide", ON_OFF)


class Domain(XMLObject):
    __slots__ = ()
    type = XMLField("@type", STR)
    arch = XMLField("os/type/@arch", STR)
    machine = XMLField("os/type/@machine", STR)
    firmware = XMLField("os/@firmware", STR)  # efi, bios, or absent (a <loader> decides)
    loader = XMLField("os/loader", STR)  # the firmware image's path
    memory = XMLChild(Memory, "memory")
    max_memory = XMLChild(Memory, "maxMemory")
    hard_limit = XMLChild(Memory, "memtune/hard_limit")
    locked = XMLChild(Marker, "memoryBacking/locked")
    cpu = XMLChild(Cpu, "cpu")
    features = XMLChild(Features, "features")
    policy = XMLChild(PolicyMarker, "metadata/passthrough:policy")
    devices = XMLChildren(Device, "devices/*")
    hostdevs = XMLChildren(HostDev, "devices/hostdev")
    interfaces = XMLChildren(Interface, "devices/interface")
    disks = XMLChildren(Disk, "devices/disk")
    controllers = XMLChildren(Controller, "devices/controller")
    memory_devices = XMLChildren(MemoryDevice, "devices/memory")
    iommu = XMLChild(Marker, "devices/iommu")
    console = XMLChild(Console, "devices/console")
    serial = XMLChild(Device, "devices/serial")
    fwcfg = XMLChildren(FwCfgEntry, "sysinfo[@type='fwcfg']/entry")
    qemu_args = XMLChildren(QemuArg, "qemu:commandline/qemu:arg")

    @classmethod
    def parse(cls, text: bytes | str) -> Domain:
        """A domain from its XML (entities not resolved, nothing fetched)."""
        data = text.encode() if isinstance(text, str) else text
        parser = etree.XMLParser(resolve_entities=False, no_network=True)
        return cls(etree.fromstring(data, parser))

    @classmethod
    def of(cls, doc: Domain | Element) -> Domain:
        """``doc`` as a Domain (an lxml ``<domain>`` element is wrapped, not copied)."""
        return doc if isinstance(doc, Domain) else cls(doc)

    @property
    def pci_hostdevs(self) -> list[HostDev]:
        """The ``<hostdev type='pci'>`` devices, in document order."""
        return [h for h in self.hostdevs if h.type == "pci"]

    @property
    def console_alias(self) -> Console | None:
        """The ``<console>`` that is serial 0 itself (libvirt's compatibility console: the
        first console, of target type serial or none, while the domain has a serial): it
        repeats serial 0's address. None where there is no such console."""
        console = self.console
        if console is None or self.serial is None:
            return None
        return console if console.target_type in (None, "serial") else None

    def tostring(self) -> str:
        return str(etree.tostring(self.element, encoding="unicode"))
