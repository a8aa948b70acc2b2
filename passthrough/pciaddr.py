# SPDX-License-Identifier: Apache-2.0
"""The one PCI address type: parsed once (from sysfs names, command lines and libvirt's
XML attributes), formatted in one place. ``passthrough.model`` re-exports it."""

from __future__ import annotations

import re
from functools import lru_cache, total_ordering

from passthrough.errors import InvalidPciAddress
from passthrough.records import frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class Attributes(Protocol):
        """An element's attributes (an lxml or ElementTree ``attrib``, or a dict)."""

        def get(self, key: str) -> str | None: ...


CARD_METAVAR = "ADDRESS|VENDOR:DEVICE"  # how --gpu (a card) reads in every command's help

_PCI_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<device>[0-9a-fA-F]{1,2})\.(?P<function>[0-7])$"
)


@total_ordering
@frozen(slots=True)
class PciAddress:
    """domain:bus:device.function, parsed once and formatted in one place."""

    domain: int
    bus: int
    device: int
    function: int

    def __post_init__(self) -> None:
        if not (
            0 <= self.domain <= 0xFFFFFFFF
            and 0 <= self.bus <= 0xFF
            and 0 <= self.device <= 0x1F
            and 0 <= self.function <= 7
        ):
            raise InvalidPciAddress(
                f"{self.domain:x}:{self.bus:x}:{self.device:x}.{self.function:x}"
            )

    @classmethod
    def parse(cls, text: str) -> PciAddress:
        m = _PCI_RE.match(text.strip())
        if m is None:
            raise InvalidPciAddress(text)
        try:
            return cls(
                int(m["domain"] or "0", 16),
                int(m["bus"], 16),
                int(m["device"], 16),
                int(m["function"], 16),
            )
        except InvalidPciAddress:
            raise InvalidPciAddress(text) from None

    @classmethod
    def from_libvirt(cls, attrs: Attributes) -> PciAddress:
        """The address of a libvirt ``<address type='pci'>`` (a hostdev's source or a guest
        address), its attributes read exactly as libvirt reads them: each number in base 0
        (``bus='10'`` is decimal 10, ``bus='0x10'`` is 16, ``bus='010'`` octal 8), a missing
        one is 0, and bus ≤ 0xFF, slot ≤ 0x1F, function ≤ 7 (libvirt's own ranges; the
        domain is any 32-bit value). Raises :class:`InvalidPciAddress` naming the attribute
        where libvirt would refuse the element."""
        values = []
        for name in LIBVIRT_FIELDS:
            text = attrs.get(name)
            value = 0 if text is None else libvirt_uint(text)
            if value is None:
                raise InvalidPciAddress(
                    f"{name}={text!r}", "libvirt reads a non-negative integer (10, 0x0a or 012)"
                )
            values.append(value)
        try:
            return cls(*values)
        except InvalidPciAddress:
            shown = " ".join(f"{n}={attrs.get(n) or '0'!r}" for n in LIBVIRT_FIELDS)
            raise InvalidPciAddress(
                shown, "libvirt's ranges: bus <= 0xFF, slot <= 0x1F, function <= 7"
            ) from None

    @property
    def is_unassigned(self) -> bool:
        """libvirt's "empty" address (domain, bus and slot all 0): on a guest device it
        means "assign one for me", never slot 0 of bus 0."""
        return not (self.domain or self.bus or self.device)

    @classmethod
    def looks_like(cls, text: str) -> bool:
        """True for a full sysfs-style name such as ``0000:01:00.0``."""
        m = _PCI_RE.match(text)
        return m is not None and m["domain"] is not None

    @property
    def slot(self) -> tuple[int, int, int]:
        """The card a function belongs to: domain, bus and device."""
        return (self.domain, self.bus, self.device)

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, PciAddress):
            return NotImplemented
        return (self.domain, self.bus, self.device, self.function) < (
            other.domain,
            other.bus,
            other.device,
            other.function,
        )


# How libvirt reads each attribute of a PCI <address> (virXMLPropUInt with base 0, that is
# strtoul's base 0): optional leading white space and '+', then "0x"/"0X" and hex digits,
# a leading 0 and octal digits, or decimal; nothing may follow, no '-', at most 32 bits.
_LIBVIRT_UINT = re.compile(r"[ \t\n\v\f\r]*\+?(?:(0[xX][0-9a-fA-F]+)|(0[0-7]*)|([1-9][0-9]*))")
LIBVIRT_FIELDS = ("domain", "bus", "slot", "function")


@lru_cache(maxsize=4096)  # a domain repeats few values (a 10,000-hostdev one: 300)
def libvirt_uint(text: str) -> int | None:
    """An attribute value as libvirt reads it (base 0), or None where libvirt refuses it:
    ``'10'`` is 10, ``'0x10'`` 16, ``'010'`` 8."""
    m = _LIBVIRT_UINT.fullmatch(text)
    if m is None:
        return None
    hex_, octal, decimal = m.groups()
    value = int(hex_, 16) if hex_ else int(octal, 8) if octal else int(decimal)
    return value if value <= 0xFFFFFFFF else None


def libvirt_attrs(a: PciAddress) -> dict[str, str]:
    """The attributes of a PCI ``<address>`` as libvirt writes them back (hex, fixed width:
    ``domain='0x0000' bus='0x01' slot='0x00' function='0x0'``)."""
    return {
        "domain": f"0x{a.domain:04x}",
        "bus": f"0x{a.bus:02x}",
        "slot": f"0x{a.device:02x}",
        "function": f"0x{a.function:x}",
    }
