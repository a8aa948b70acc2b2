# SPDX-License-Identifier: Apache-2.0
from __future__ import annotations

import pytest

from passthrough.errors import InvalidPciAddress
from passthrough.model import PciAddress


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:01:00.0", "0000:01:00.0"),
        ("01:00.1", "0000:01:00.1"),
        ("0000:c1:00.0", "0000:c1:00.0"),  # hex bus: rejected by naive regexes
        ("0000:C1:1F.7", "0000:c1:1f.7"),
        ("10000:00:02.0", "10000:00:02.0"),  # VMD domains are wider than 4 digits
        (" 0000:2b:00.3 ", "0000:2b:00.3"),
    ],
)
def test_parse_and_format_round_trip(text: str, expected: str) -> None:
    address = PciAddress.parse(text)
    assert str(address) == expected
    assert PciAddress.parse(str(address)) == address


@pytest.mark.parametrize(
    "text",
    ["", "01:00", "0000:01:00.8", "0000:01:20.0", "0000:100:00.0", "zz:00.0", "0000-01-00.0"],
)
def test_malformed_addresses_are_refused_with_the_text(text: str) -> None:
    with pytest.raises(InvalidPciAddress) as info:
        PciAddress.parse(text)
    assert repr(text) in str(info.value)


def test_ordering_is_numeric_not_textual() -> None:
    addrs = [
        PciAddress.parse(a)
        for a in ("0000:0a:00.0", "0000:09:00.0", "0000:c1:00.0", "0000:1a:00.0")
    ]
    assert [str(a) for a in sorted(addrs)] == [
        "0000:09:00.0",
        "0000:0a:00.0",
        "0000:1a:00.0",
        "0000:c1:00.0",
    ]


def test_slot_groups_functions_of_one_card() -> None:
    assert PciAddress.parse("01:00.0").slot == PciAddress.parse("01:00.3").slot
    assert PciAddress.parse("01:00.0").slot != PciAddress.parse("01:01.0").slot
