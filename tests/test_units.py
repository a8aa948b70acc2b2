# SPDX-License-Identifier: Apache-2.0
"""The one size parser and the one size formatter (passthrough/units.py)."""

from __future__ import annotations

import pytest

from passthrough.units import GIB, KIB, MIB, TIB, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "unit", "expected"),
    [
        ("16M", 1, 16 * MIB),
        ("64G", 1, 64 * GIB),
        ("128", 1, 128),
        ("2T", 1, 2 * TIB),
        ("16384", MIB, 16 * GIB),  # a bare number counts in the caller's unit
        ("16g", MIB, 16 * GIB),
        ("16GiB", MIB, 16 * GIB),
        ("16GB", MIB, 16 * GIB),
        (" 8K ", 1, 8 * KIB),
        ("512B", MIB, 512),  # bytes said so are bytes, whatever the default unit
    ],
)
def test_parse_size(text: str, unit: int, expected: int) -> None:
    assert parse_size(text, unit) == expected


@pytest.mark.parametrize("text", ["", "lots", "16Q", "1.5G", "-1G", "G", "١٦G", "16 GiBs"])
def test_parse_size_refuses_what_is_not_a_size(text: str) -> None:
    assert parse_size(text) is None


@pytest.mark.parametrize(
    ("size", "human", "compact"),
    [
        (0, "0 B", "0"),
        (100, "100 B", "100"),
        (16 * KIB, "16 KiB", "16K"),
        (16 * MIB, "16 MiB", "16M"),
        (GIB + GIB // 2, "1.5 GiB", "1536M"),
        (64 * GIB, "64 GiB", "64G"),
        (2 * TIB, "2 TiB", "2T"),
        (GIB + 1, "1073741825 B", "1073741825"),
        (MIB + 512 * KIB, "1.5 MiB", "1536K"),
    ],
)
def test_format_size(size: int, human: str, compact: str) -> None:
    assert format_size(size) == human
    assert format_size(size, compact=True) == compact
    assert parse_size(compact) == size  # the compact form reads back
