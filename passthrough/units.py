# SPDX-License-Identifier: Apache-2.0
"""Sizes, parsed and formatted in one place (binary units throughout)."""

from __future__ import annotations

import re

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40

_FACTORS = {"": 1, "K": KIB, "M": MIB, "G": GIB, "T": TIB}
# "16G", "16g", "16GiB", "16GB", "16 G" (a GB is a GiB here, as in QEMU and libvirt's "G")
_SIZE_RE = re.compile(r"^(\d+)\s*(?:([KMGT])(?:I?B)?|B)?$", re.IGNORECASE)
_STEPS = (("T", TIB), ("G", GIB), ("M", MIB), ("K", KIB))


def parse_size(text: str, unit: int = 1) -> int | None:
    """``16M`` → bytes; a bare number counts in ``unit``. None: not a size."""
    m = _SIZE_RE.match(text.strip())
    # 20 digits hold any 64-bit size; Python refuses int() of more than 4,300 of them
    if m is None or not m[1].isascii() or len(m[1]) > 20:
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


# libvirt's scaled units (virScaleInteger): one letter and *iB are binary, *B decimal
_PIB = TIB << 10
_LIBVIRT = {"b": 1, "bytes": 1, "k": KIB, "kib": KIB, "m": MIB, "mib": MIB, "g": GIB, "gib": GIB}
_LIBVIRT.update({"t": TIB, "tib": TIB, "p": _PIB, "pib": _PIB, "e": _PIB << 10, "eib": _PIB << 10})
_LIBVIRT.update({"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15, "eb": 10**18})


def libvirt_size(value: str | None, unit: str | None, default: str = "KiB") -> int | None:
    """A size of a libvirt domain (``<memory unit='GiB'>16</memory>``) in bytes, read as
    libvirt reads it (``default`` when no unit is given); None: not a size."""
    factor = _LIBVIRT.get((unit or default).lower())
    text = (value or "").strip()
    # libvirt reads an unsigned long long (20 digits): longer is no size (and int() of
    # thousands of digits is refused by Python itself)
    if factor is None or not text.isdigit() or not text.isascii() or len(text) > 20:
        return None
    return int(text) * factor
