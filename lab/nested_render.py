# SPDX-License-Identifier: Apache-2.0
"""Run inside the lab host: the nested guest's domain, rendered by the library.

    python3 nested_render.py NAME CARD BIG MEMORY_MIB
    python3 nested_render.py --check DOMAIN.xml

The card is selected as any GPU is (``build_spec``). The large-BAR stand-in is QEMU's
``ivshmem-plain`` (class 0x0500: no GPU to the toolkit, and QEMU's display devices keep
their VRAM in host RAM, so none of them can carry a 64 GiB BAR on a small machine); it is
given its own guest root port beside the card, and the address planner (``plan_layout``)
decides the guest layout over both, exactly as it does for a card's functions. Prints
``{"xml": ..., "layout": ..., "addresses": {host: guest}}`` as JSON. ``--check`` prints the
planner's findings on a domain file (``layout_findings``: codes and messages) as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from passthrough.host.discover import discover
from passthrough.model import PciAddress
from passthrough.vm.domxml import Domain
from passthrough.vm.layout import plan_layout
from passthrough.vm.layout_check import layout_findings
from passthrough.vm.render import render
from passthrough.vm.spec import GuestCard, GuestFunction, VmOptions, build_spec
from passthrough.vm.versions import read_versions


def check(path: str) -> int:
    findings = layout_findings(Domain.parse(Path(path).read_bytes()), discover("/"))
    print(json.dumps([{"code": f.code, "message": f.message} for f in findings]))
    return 0


def main() -> int:
    if sys.argv[1] == "--check":
        return check(sys.argv[2])
    name, card, big, memory = sys.argv[1:5]
    host = discover("/")
    opts = VmOptions(
        name=name, vcpus=1, memory_mib=int(memory), gpus=(card,), network="none", virt_type="qemu"
    )
    spec = build_spec(host, opts)
    fn = host.function(PciAddress.parse(big))
    if fn is None:
        print(f"{big}: no such PCI function on the lab host", file=sys.stderr)
        return 2
    port = len(spec.cards) + 1
    extra = GuestCard(
        port_index=port,
        port_slot=1 + (port - 1) // 8,
        port_function=(port - 1) % 8,
        functions=(GuestFunction(fn.address, port, 0, False, fn.id, fn.name),),
    )
    cards = (*spec.cards, extra)
    functions = []
    for c in cards:
        found = [host.function(g.host) for g in c.functions]
        functions.append([f for f in found if f is not None])
    layout = plan_layout(
        functions,
        host_bits=host.cpu.phys_bits,
        iommu_bits=host.iommu.address_bits,
        cpu_vendor=host.cpu.vendor,
        memory_mib=opts.memory_mib,
        versions=read_versions(host.root),
        virt_type=opts.virt_type,
    )
    spec = dataclasses.replace(spec, cards=cards, layout=layout, mmio_window_mib=layout.fwcfg_mib)
    addresses = {
        str(g.host): f"0000:{g.guest_bus:02x}:00.{g.function:x}" for c in cards for g in c.functions
    }
    out = {"xml": render(spec), "layout": layout.as_json(), "addresses": addresses}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
