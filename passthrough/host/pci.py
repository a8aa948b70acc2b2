# SPDX-License-Identifier: Apache-2.0
"""PCI functions as sysfs shows them under a root."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import stat
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Protocol

from passthrough.errors import MalformedHostData, echo
from passthrough.guest.virt import HEX, parse_uevent
from passthrough.host.root import HostRoot
from passthrough.model import Bar, PciAddress, PciFunction
from passthrough.pciclass import SUBCLASS_VGA

PCI_DEVICES = "sys/bus/pci/devices"

# include/linux/ioport.h
IORESOURCE_IO = 0x00000100
IORESOURCE_PREFETCH = 0x00002000
IORESOURCE_MEM_64 = 0x00100000


_UNUSED = "0x0000000000000000 0x0000000000000000 "


def parse_resource(text: str, where: str) -> tuple[Bar, ...]:
    """BAR sizes from a ``resource`` file: one "start end flags" line per region."""
    bars: list[Bar] = []
    for index, line in enumerate(text.splitlines()[:6]):  # lines 0-5 are the BARs
        if line.startswith(_UNUSED):
            continue
        fields = line.split()
        if len(fields) != 3:
            raise MalformedHostData(where, f"line {index + 1}: expected 'start end flags'")
        try:
            start, end, flags = (int(x, 16) for x in fields)
        except ValueError:
            raise MalformedHostData(where, f"line {index + 1}: expected hex numbers") from None
        if start == 0 and end == 0:
            continue
        if end < start:
            raise MalformedHostData(where, f"line {index + 1}: end before start")
        bars.append(
            Bar(
                index=index,
                size=end - start + 1,
                is_io=bool(flags & IORESOURCE_IO),
                is_64bit=bool(flags & IORESOURCE_MEM_64),
                prefetchable=bool(flags & IORESOURCE_PREFETCH),
            )
        )
    return tuple(bars)


def parents_from_path(real: str) -> tuple[PciAddress, ...]:
    """Upstream bridges, root port first, from a device path such as
    ``sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0``."""
    head, _, last = real.rpartition("/")
    above = _addresses_in(head)  # the functions of a card share it: read once
    return above if PciAddress.looks_like(last) else above[:-1]


@lru_cache(maxsize=1024)
def _addresses_in(path: str) -> tuple[PciAddress, ...]:
    return tuple(PciAddress.parse(p) for p in path.split("/") if PciAddress.looks_like(p))


def hex_field(value: str | None, where: str) -> int | None:
    if value is None or value == "":
        return None
    if not HEX.fullmatch(value):  # int(x, 16) alone takes signs, "_" and non-ASCII digits
        raise MalformedHostData(where, f"expected a hex number, got {value[:40]!r}")
    return int(value, 16)


def hex_pair(text: str | None, where: str) -> tuple[int, int] | None:
    """``10DE:2684`` → (0x10de, 0x2684); None when the text is not a pair."""
    if text is None or text.count(":") != 1:
        return None
    a, b = text.split(":")
    first, second = hex_field(a, where), hex_field(b, where)
    return None if first is None or second is None else (first, second)


Namer = Callable[[int, int], tuple[str | None, str | None]]
NamerFactory = Callable[[set[tuple[int, int]]], Namer]


# What every function's directory is asked for: taken at once through one descriptor of the
# directory (its listing says which exist; no failed open, no lookup from the root per file)
_EAGER_FILES = ("uevent", "numa_node", "reset_method", "resource", "sriov_totalvfs")
_EAGER_LINKS = ("iommu_group", "physfn")
_PAGE = 1 << 16  # sysfs attributes fit in one page; anything longer goes the root's way
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK

Eager = dict[str, "str | None"]  # name -> text or link's last component; None: absent


def _eager(root: HostRoot, real: str) -> Eager:
    """The files and links of ``real`` that every function is asked for, read through one
    descriptor of it. What this cannot read as a plain file or link (a link where a file
    belongs, a device node, an error, a long file) is left out, and the root reads it as it
    reads any file (containment, bounds, problems noted): the same answers either way."""
    fd = root.open_dir(real)
    if fd is None:
        return {}
    got: Eager = {}
    try:
        for name in _EAGER_LINKS:
            try:
                got[name] = posixpath.basename(os.readlink(name, dir_fd=fd).rstrip("/"))
            except OSError:  # absent, or not a link: what the root's readlink answers too
                got[name] = None
        for name in _EAGER_FILES:
            try:
                f = os.open(name, _READ, dir_fd=fd)
            except FileNotFoundError:
                got[name] = None
                continue
            except OSError:
                continue  # a link (ELOOP), no permission: the root's way
            try:
                if stat.S_ISREG(os.fstat(f).st_mode):
                    data = os.read(f, _PAGE)
                    if len(data) < _PAGE:
                        got[name] = data.decode("utf-8", "replace").strip()
            except OSError:
                pass
            finally:
                os.close(f)
    finally:
        os.close(fd)
    return got


Located = tuple[str, dict[str, str], Eager]


def _locate(root: HostRoot, name: str) -> Located | None:
    """Real device path, uevent variables and the eagerly read facts of one
    ``sys/bus/pci/devices`` entry."""
    link = f"{PCI_DEVICES}/{name}"
    target = root.readlink(link)
    if target is None:
        real = link
    elif target.startswith("/"):
        real = root.resolve(link) or link
    else:
        real = posixpath.normpath(posixpath.join(PCI_DEVICES, target))
    eager = _eager(root, real)
    if not eager and not root.isdir(real):
        root.problems.append(f"{link}: dangling link to {target}")
        return None
    if "uevent" in eager:
        return real, parse_uevent(eager["uevent"]), eager
    return real, parse_uevent(root.read(f"{real}/uevent")), eager


def _event_id(event: dict[str, str]) -> tuple[int, int] | None:
    try:
        return hex_pair(event.get("PCI_ID"), "uevent")
    except MalformedHostData:
        return None  # reported with its path when the record is built


class FunctionFacts(Protocol):
    """Where one function's facts are read: its sysfs directory under a root (below) or
    pyudev on a live host (``udev.py``). Each answers None for what is absent."""

    def event(self, key: str) -> str | None:
        """A uevent property (PCI_ID, PCI_CLASS, MODALIAS, ...)."""

    def attr(self, name: str) -> str | None:
        """A sysfs attribute's text, whitespace stripped."""

    def link(self, name: str) -> str | None:
        """The last component of a link's target (iommu_group, physfn)."""

    def where(self, name: str) -> str:
        """The path an error about ``name`` names."""


def _hex(src: FunctionFacts, name: str, required: bool) -> int | None:
    value = hex_field(src.attr(name), src.where(name))
    if value is None and required:
        raise MalformedHostData(src.where(name), "missing or empty (every PCI function has it)")
    return value


def _int(src: FunctionFacts, name: str, text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise MalformedHostData(src.where(name), f"expected a number, got {text[:40]!r}") from None


def build_function(
    address: PciAddress,
    src: FunctionFacts,
    *,
    driver: str | None,
    parents: tuple[PciAddress, ...],
    sysfs_path: str,
    names: Namer | None,
) -> PciFunction:
    """One PciFunction from its facts, read the same way from sysfs and from udev: the
    uevent properties first (one read carries IDs, class and modalias), the individual
    attribute files as the fallback (the authority, were they to disagree, would be a
    kernel bug, not ours to arbitrate)."""
    uevent = src.where("uevent")
    vendor, device = hex_pair(src.event("PCI_ID"), uevent) or (
        _hex(src, "vendor", True),
        _hex(src, "device", True),
    )
    class_code = hex_field(src.event("PCI_CLASS"), uevent)
    if class_code is None:
        class_code = _hex(src, "class", True)
    sub_vendor, sub_device = hex_pair(src.event("PCI_SUBSYS_ID"), uevent) or (
        _hex(src, "subsystem_vendor", False),
        _hex(src, "subsystem_device", False),
    )
    assert vendor is not None and device is not None and class_code is not None
    vendor_name, device_name = names(vendor, device) if names else (None, None)
    numa = _int(src, "numa_node", src.attr("numa_node"))
    # boot_vga exists on VGA-class functions only
    boot_vga = src.attr("boot_vga") if class_code >> 8 == SUBCLASS_VGA else None
    reset = src.attr("reset_method")
    resource = src.attr("resource")
    physfn = src.link("physfn")
    return PciFunction(
        address=address,
        vendor_id=vendor,
        device_id=device,
        subsystem_vendor_id=sub_vendor,
        subsystem_device_id=sub_device,
        class_code=class_code,
        driver=driver,
        iommu_group=_int(src, "iommu_group", src.link("iommu_group")),
        numa_node=numa if numa is not None and numa >= 0 else None,
        boot_vga=None if boot_vga in (None, "") else boot_vga == "1",
        reset_methods=tuple(reset.split()) if reset is not None else None,
        bars=parse_resource(resource, src.where("resource")) if resource else (),
        parents=parents,
        physfn=PciAddress.parse(physfn) if physfn and PciAddress.looks_like(physfn) else None,
        sriov_totalvfs=_int(src, "sriov_totalvfs", src.attr("sriov_totalvfs")),
        modalias=src.event("MODALIAS") or src.attr("modalias"),
        sysfs_path=sysfs_path,
        vendor_name=vendor_name,
        device_name=device_name,
        vgpu_vf=physfn is not None and _serves_vgpu(src),
    )


def _serves_vgpu(src: FunctionFacts) -> bool:
    """A VF NVIDIA's vGPU manager serves: vendor VFIO (its ``nvidia/`` type files) or
    mdev on the VF (``mdev_supported_types``)."""
    return src.attr("nvidia/current_vgpu_type") is not None or os.path.isdir(
        src.where("mdev_supported_types")
    )


class _SysfsFacts:
    """A function's sysfs directory under a root, the uevent file and the facts read at
    once from it (what is not among those is read file by file)."""

    def __init__(
        self, root: HostRoot, real: str, event: dict[str, str], eager: Eager | None = None
    ) -> None:
        self.root, self.real, self.uevent = root, real, event
        self.eager = eager or {}

    def event(self, key: str) -> str | None:
        return self.uevent.get(key)

    def attr(self, name: str) -> str | None:
        if name in self.eager:
            return self.eager[name]
        return self.root.read(f"{self.real}/{name}")

    def link(self, name: str) -> str | None:
        if name in self.eager:
            return self.eager[name]
        return self.root.link_name(f"{self.real}/{name}")

    def where(self, name: str) -> str:
        return self.root.abs(f"{self.real}/{name}")


def read_function(
    root: HostRoot,
    name: str,
    names: Namer | None = None,
    located: Located | None = None,
) -> PciFunction | None:
    """One function from ``sys/bus/pci/devices/NAME``; None (and a problem noted) when
    the entry is a dangling link."""
    address = PciAddress.parse(name)
    if located is None:
        located = _locate(root, name)
        if located is None:
            return None
    real, event, eager = located
    facts = _SysfsFacts(root, real, event, eager)
    return build_function(
        address,
        facts,
        driver=event.get("DRIVER") if event else facts.link("driver"),
        parents=parents_from_path(real),
        sysfs_path=real,
        names=names,
    )


def read_functions(root: HostRoot, namer_factory: NamerFactory | None = None) -> list[PciFunction]:
    """Every PCI function under the root. ``namer_factory`` receives the IDs seen in the
    uevent files (one pass) and returns the name lookup used while building records."""
    located: dict[str, Located] = {}
    for name in root.listdir(PCI_DEVICES):
        if not PciAddress.looks_like(name):
            root.problems.append(f"{PCI_DEVICES}/{echo(name)}: not a PCI address, ignored")
            continue
        found = _locate(root, name)
        if found is not None:
            located[name] = found
    namer = None
    if namer_factory is not None:
        ids = {i for _, event, _ in located.values() if (i := _event_id(event)) is not None}
        namer = namer_factory(ids)
    functions = []
    for name, found in located.items():
        fn = read_function(root, name, namer, found)
        if fn is not None:
            functions.append(fn)
    functions.sort(key=lambda f: f.address)
    return functions


def with_names(
    functions: Iterable[PciFunction], names: dict[tuple[int, int | None], str]
) -> list[PciFunction]:
    return [
        dataclasses.replace(
            f,
            vendor_name=f.vendor_name or names.get((f.vendor_id, None)),
            device_name=f.device_name or names.get((f.vendor_id, f.device_id)),
        )
        for f in functions
    ]
