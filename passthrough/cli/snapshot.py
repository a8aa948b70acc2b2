# SPDX-License-Identifier: Apache-2.0
"""``passthrough snapshot``: capture what discovery reads into a .tar.gz."""

from __future__ import annotations

import argparse
from contextlib import ExitStack

from passthrough.cli.common import Subparsers, command, common, dump, examples, open_root
from passthrough.errors import EXIT_OK, PassthroughError, output_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from passthrough.host.root import HostRoot
    from passthrough.model import Host


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "snapshot",
        run,
        description="Capture the attributes, links and the few proc/etc/boot files that discovery "
        "reads (no binary config space) so that `scan --root FILE` elsewhere gives the same report. "
        "Inside a virtual machine it also keeps what `guest check` reads (the GPU's IDs, BARs and "
        "driver, /proc/driver/nvidia, the /dev/nvidia* names, runtime and Kubernetes "
        "configuration), so `guest check --root FILE` judges it the same way. Attach it to bug "
        "reports.",
        epilog=examples(
            "passthrough snapshot -o host.tar.gz",
            "passthrough snapshot --root /tmp/hgx -o hgx.tar.gz && passthrough scan --root hgx.tar.gz",
        ),
    )
    common(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE.tar.gz", help="where to write")


def _also(root: HostRoot, host: Host) -> None:
    """What plan reads and the vGPU side of each NVIDIA card (catalogs, mdev types, VFs)."""
    from passthrough.plan.record import record_plan
    from passthrough.vgpu.discover import read_vgpu

    record_plan(root, host)
    read_vgpu(root, host)


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.host.snapshot import capture

    if args.output == "-":  # a gzip stream is no text for a terminal or a pipe to read
        raise PassthroughError("-o -: snapshot writes an archive file; name one (FILE.tar.gz)")
    host, stats = capture(open_root(args.root, stack), output_file(args.output), _also)
    if args.json:
        dump({"output": args.output, **stats}, "snapshot")
    else:
        print(
            f"wrote {args.output}: {stats['files']} files, {stats['links']} links "
            f"({len(host.functions)} PCI functions)"
        )
    return EXIT_OK
