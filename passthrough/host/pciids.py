# SPDX-License-Identifier: Apache-2.0
"""Names from the PCI ID database (the ``pci.ids`` file).

Only the IDs present on the host are looked up, in one pass over the file, so a scan
does not pay for building a dictionary of the whole database.
"""

from __future__ import annotations

from collections.abc import Iterable

from passthrough.host.root import HostRoot

PCI_IDS_PATHS = (
    "usr/share/hwdata/pci.ids",
    "usr/share/misc/pci.ids",
    "usr/share/pci.ids",
)

Names = dict[tuple[int, int | None], str]  # (vendor, None) → vendor name; (vendor, device) → name


def find_pci_ids(root: HostRoot) -> str | None:
    for rel in PCI_IDS_PATHS:
        if root.exists(rel):
            return rel
    return None


def lookup(data: bytes, wanted: Iterable[tuple[int, int]]) -> Names:
    """Vendor and device names for the wanted (vendor, device) pairs."""
    want: dict[int, set[int]] = {}
    for wanted_vendor, wanted_device in wanted:
        want.setdefault(wanted_vendor, set()).add(wanted_device)
    names: Names = {}
    vendor: int | None = None
    for raw in data.split(b"\n"):
        if not raw or raw[0] == 0x23:  # '#'
            continue
        if raw[0] == 0x09:  # '\t'
            if vendor is None or raw[1:2] == b"\t":
                continue  # subsystem lines are not needed
            try:
                device = int(raw[1:5], 16)
            except ValueError:
                continue
            if device in want[vendor]:
                names[(vendor, device)] = raw[5:].strip().decode("utf-8", "replace")
            continue
        if raw[:2] == b"C ":
            break  # the class list follows the vendors
        try:
            candidate = int(raw[:4], 16)
        except ValueError:
            vendor = None
            continue
        if candidate in want:
            vendor = candidate
            names[(vendor, None)] = raw[4:].strip().decode("utf-8", "replace")
        else:
            vendor = None
    return names


def render_subset(names: Names) -> str:
    """A pci.ids file holding just these names (snapshots and fixtures carry one)."""
    lines = ["# pci.ids subset written by passthrough; names from the host's database"]
    vendors = sorted({v for v, _ in names})
    for vendor in vendors:
        lines.append(f"{vendor:04x}  {names.get((vendor, None), 'Unknown vendor')}")
        for (v, device), name in sorted(
            ((k, n) for k, n in names.items() if k[0] == vendor and k[1] is not None),
            key=lambda item: item[0][1] or 0,
        ):
            del v
            lines.append(f"\t{device:04x}  {name}")
    return "\n".join(lines) + "\n"
