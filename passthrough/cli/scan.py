# SPDX-License-Identifier: Apache-2.0
"""``passthrough scan``: IOMMU groups, GPUs and a verdict for each."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack

from passthrough.cli.common import Subparsers, command, common, dump, examples, open_root
from passthrough.errors import EXIT_OK

# typing for the type checker only: importing it costs every start more than argparse
TYPE_CHECKING = False
if TYPE_CHECKING:
    from passthrough.analysis.scan import Scan
    from passthrough.vgpu.model import VgpuCard


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "scan",
        run,
        description="Read the host (never writes) and show its IOMMU groups as a tree, every GPU "
        "with the other functions of its card, and whether each can be passed through safely.",
        epilog=examples(
            "passthrough scan",
            "passthrough scan --gpus-only --topology",
            "passthrough scan --root host.tar.gz --json | jq '.gpus[] | {address, viable, reasons}'",
            "passthrough scan 0000:01:00.0",
        ),
    )
    common(p)
    p.add_argument("addresses", nargs="*", metavar="ADDRESS", help="only these GPUs (e.g. 01:00.0)")
    p.add_argument(
        "--gpus-only", action="store_true", help="list only the IOMMU groups that hold a GPU"
    )
    p.add_argument(
        "--topology", action="store_true", help="also show GPUs by NUMA node with their PCIe path"
    )
    p.add_argument(
        "--udev",
        choices=("auto", "yes", "no"),
        default="auto",
        help="enumerate PCI through pyudev (names from the hwdb); auto: on the live root only; "
        "yes: refused on any other root (udev knows this machine, not the root)",
    )


def analysed(args: argparse.Namespace, stack: ExitStack) -> Scan:
    """Discover the root given by --root (with --udev, where the command has it) and judge it."""
    from passthrough.analysis.scan import analyse
    from passthrough.host.discover import discover, pci_source_for

    root = open_root(args.root, stack)
    return analyse(discover(root, pci_source=pci_source_for(root, getattr(args, "udev", "auto"))))


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.analysis.scan import only
    from passthrough.model import PciAddress
    from passthrough.output.json import scan_json
    from passthrough.output.text import Painter, render_scan, wants_color, write

    wanted = [PciAddress.parse(a) for a in args.addresses]
    scan = analysed(args, stack)
    if wanted:
        scan = only(scan, wanted)
    cards = vgpu_cards(scan)
    if args.json:
        dump({**scan_json(scan), "vgpu": [c.to_json() for c in cards]}, "scan")
    else:
        from passthrough.cli.vgpu import list_text

        paint = Painter(wants_color(sys.stdout, args.color))
        gpus_only = args.gpus_only or bool(wanted)
        write(render_scan(scan, paint, gpus_only=gpus_only, topology=args.topology))
        if any(c.mode.value != "none" for c in cards):
            write("\nvGPU (passthrough vgpu list):\n" + list_text(cards))
    return EXIT_OK


def vgpu_cards(scan: Scan) -> tuple[VgpuCard, ...]:
    """Each NVIDIA card's vGPU side, read from the root the scan read."""
    from passthrough.host.root import HostRoot
    from passthrough.vgpu.discover import read_vgpu

    return read_vgpu(HostRoot(scan.host.root), scan.host)
