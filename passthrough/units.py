"""Sizes, parsed and formatted in one place (binary units throughout)."""

from __future__ import annotations

import re

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40

# libvirt's size units (``<memory unit='...'>``, virScaleInteger): a bare letter or an IEC
# name is binary, an SI name decimal; case does not matter. Bytes per unit.
LIBVIRT_UNITS = {"b": 1, "bytes": 1}
for _i, _letter in enumerate("kmgtpe", start=1):
    LIBVIRT_UNITS.update({_letter: 1024**_i, f"{_letter}ib": 1024**_i, f"{_letter}b": 1000**_i})


def libvirt_size(value: int, unit: str | None, default: str = "KiB") -> int | None:
    """``value`` in ``unit`` (libvirt's default: KiB) as bytes; None for a unit libvirt
    does not know."""
    factor = LIBVIRT_UNITS.get((unit or default).lower())
    return None if factor is None else value * factor


_FACTORS = {"": 1, "K": KIB, "M": MIB, "G": GIB, "T": TIB}
# "16G", "16g", "16GiB", "16GB", "16 G" (a GB is a GiB here, as in QEMU and libvirt's "G")
_SIZE_RE = re.compile(r"^(\d+)\s*(?:([KMGT])(?:I?B)?|B)?$", re.IGNORECASE)
_STEPS = (("T", TIB), ("G", GIB), ("M", MIB), ("K", KIB))


def parse_size(text: str, unit: int = 1) -> int | None:
    """``16M`` → bytes; a bare number counts in ``unit``. None: not a size."""
    m = _SIZE_RE.match(text.strip())
    if m is None or not m[1].isascii():
        return None
    if m[2] is None:
        return int(m[1]) * (1 if text.strip()[-1:].upper() == "B" else unit)
    return int(m[1]) * _FACTORS[m[2].upper()]


def format_size(size: int, compact: bool = False) -> str:
    """``1.5 GiB``; ``compact``: ``64G``, the notation :func:`parse_size` reads, used only
    where the unit divides exactly (else bytes)."""
    for unit, factor in _STEPS:
        if compact and size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
        # exact to 1/1024 of the unit (whole KiB at least), so ":g" shows what it is
        if not compact and size >= factor and size % max(factor // KIB, KIB) == 0:
            return f"{size / factor:g} {unit}iB"
    return str(size) if compact else f"{size} B"
