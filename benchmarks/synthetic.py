# SPDX-License-Identifier: Apache-2.0
"""A synthetic host with many PCI functions, built with the same builder as the samples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from passthrough import fakehost

FUNCTIONS_PER_CARD = 8  # a GPU with seven companion functions (as some multi-function cards have)


def description(ports_per_domain: int = 111, domains: int = 2) -> dict[str, Any]:
    pci: list[dict[str, Any]] = []
    for domain in range(domains):
        pci.append(
            {
                "addr": f"{domain:04x}:00:00.0",
                "id": "8086:09a2",
                "class": "host-bridge",
                "name": "Host bridge",
            }
        )
        for port in range(ports_per_domain):
            root_bus = port + 1
            child_bus = 0x80 + port if port < 0x7F else None
            if child_bus is None:
                raise ValueError("too many ports for one domain")
            functions = [
                {
                    "addr": f"{domain:04x}:{child_bus:02x}:00.{fn}",
                    "id": "10de:2330" if fn == 0 else f"10de:{0x2331 + fn:04x}",
                    "class": "3d" if fn == 0 else "audio",
                    "name": "GH100 [H100 SXM5 80GB]" if fn == 0 else f"Companion function {fn}",
                    "driver": "nvidia" if fn == 0 else None,
                    "bars": {0: "16M", 1: "64G p64"} if fn == 0 else {0: "16K"},
                    "reset": ["flr"],
                }
                for fn in range(FUNCTIONS_PER_CARD)
            ]
            pci.append(
                {
                    "addr": f"{domain:04x}:{root_bus:02x}:01.0",
                    "id": "8086:352a",
                    "class": "bridge",
                    "name": "Root Port",
                    "children": functions,
                }
            )
    return {
        "description": "synthetic host for benchmarks",
        "distro": "ubuntu-24.04",
        "cpu": {"vendor": "intel", "model": "Synthetic", "cpus": 2},
        "vendors": {"8086": "Intel Corporation", "10de": "NVIDIA Corporation"},
        "pci": pci,
    }


def build_functions(dest: Path, functions: int) -> tuple[Path, int]:
    """A host of ``functions`` PCI functions, a multiple of 1,000: one PCI domain (host
    bridge, 111 root ports, a card of 8 functions behind each) per thousand."""
    if functions <= 0 or functions % 1000:
        raise ValueError(f"{functions}: a positive multiple of 1,000 functions")
    return build(dest, 111, functions // 1000)


def build(dest: Path, ports_per_domain: int = 111, domains: int = 2) -> tuple[Path, int]:
    desc = fakehost.Description(description(ports_per_domain, domains), "synthetic")
    return fakehost.build(desc, dest), len(desc.nodes)
