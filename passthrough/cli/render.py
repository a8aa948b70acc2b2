# SPDX-License-Identifier: Apache-2.0
"""``passthrough render``: domain XML for a guest with the whole card(s)."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from passthrough.cli.common import (
    Subparsers,
    command,
    common,
    dump,
    examples,
    note,
    once,
    open_root,
    warn,
)
from passthrough.errors import EXIT_OK, PassthroughError, count, output_file

if TYPE_CHECKING:
    from passthrough.model import Host
    from passthrough.vm.spec import VmOptions


def add_parser(sub: Subparsers) -> None:
    from passthrough.vm.options import add_flags

    p = command(
        sub,
        "render",
        run,
        description="Render libvirt domain XML (q35 + OVMF) from the host's facts: every function "
        "of each card on one guest slot behind its own pcie-root-port, KVM hidden and a Hyper-V "
        "vendor_id (on by default), a 64-bit MMIO window sized from the real BARs, vCPUs and "
        "memory on the GPUs' NUMA node. Options may come from --spec FILE.yaml (same names as "
        "the flags).",
        epilog=examples(
            "passthrough render --name gpu1 --gpu 01:00.0 -o gpu1.xml",
            "passthrough render --spec vm.yaml --root snapshot.tar.gz",
            "passthrough render --name win --profile windows --no-hide",
        ),
    )
    common(p)
    p.add_argument("--spec", metavar="FILE.yaml", help="VM options as YAML (flags given too win)")
    add_flags(p)  # one flag per row of the VM options table
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    p.add_argument(
        "--vgpu",
        action="append",
        default=[],
        metavar="VF|UUID",
        help="a vGPU for the guest: a vendor-VFIO VF holding a type (a managed='no' PCI "
        "hostdev, no vfio driver element) or an mdev's UUID (repeat for more)",
    )


def vm_options(args: argparse.Namespace) -> VmOptions:
    """The --spec file's options, with the flags given on top."""
    from passthrough.vm.options import from_flags
    from passthrough.vm.spec import VmOptions
    from passthrough.vm.specfile import load_spec_file

    values: dict[str, Any] = load_spec_file(args.spec) if args.spec else {}
    values.update(from_flags(args))  # flags given too win
    if getattr(args, "vgpu", None) and not values.get("gpus"):
        values["no_gpu"] = True  # the vGPUs are the guest's GPUs: no whole card picked
    if "name" not in values:
        raise PassthroughError("render: a domain name is needed (--name, or name: in --spec)")
    return VmOptions(**values)


def memlock_warnings(xml: str, host: Host) -> list[str]:
    """The memlock estimate of the rendered domain against the host's limits: the same
    check as ``validate --host-root`` on that file. What validate rejects (a daemon capped
    below what libvirt sets: the guest would not start) is refused, nothing written."""
    from passthrough.analysis.policy import Refused
    from passthrough.model import Severity
    from passthrough.vm import memlock
    from passthrough.vm.domxml import Domain

    found = [f for f, _ in memlock.check(Domain.parse(xml), host)]
    refused = [f for f in found if f.severity is Severity.ERROR]
    if refused:
        raise Refused(refused)
    return [f"{f.message} [{f.code}]" for f in found]


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.host.discover import discover
    from passthrough.vm.render import render
    from passthrough.vm.spec import build_spec, nothing_to_boot

    if args.output:
        output_file(args.output)
    host = discover(open_root(args.root, stack))
    spec = build_spec(host, vm_options(args))
    xml = render(spec)
    if args.vgpu:
        from passthrough.host.root import HostRoot
        from passthrough.vgpu.discover import read_vgpu
        from passthrough.vgpu.hostdev import add_hostdevs, hostdev_for

        cards = read_vgpu(HostRoot(host.root), host)
        xml = add_hostdevs(xml, [hostdev_for(cards, v) for v in args.vgpu])
    boot = nothing_to_boot(spec)
    warnings = [*spec.warnings, *memlock_warnings(xml, host), *([boot] if boot else [])]
    for w in once(warnings):
        warn(w)
    layout = spec.layout.as_json() if spec.layout else None
    for line in layout["decisions"] if layout else []:  # the address planner's reasons
        note(args, f"layout: {line}")
    if args.output:
        from passthrough.journal.files import atomic_write

        atomic_write(os.path.abspath(args.output), xml.encode())
        if not args.json:
            hostdevs = sum(len(c.functions) for c in spec.cards) + len(args.vgpu)
            print(f"wrote {args.output} ({spec.name}: {count(hostdevs, 'hostdev')})")
    if args.json:
        dump(
            {
                "root": host.root,
                "name": spec.name,
                "xml": xml,
                "warnings": warnings,
                "output": args.output,
                "layout": layout,
            },
            "render",
        )
    elif not args.output:
        sys.stdout.write(xml)
    return EXIT_OK
