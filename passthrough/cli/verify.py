# SPDX-License-Identifier: Apache-2.0
"""``passthrough verify``: after the reboot, is the host what apply made it?"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack

from passthrough.cli.common import Subparsers, command, common, dump, examples, open_root
from passthrough.errors import EXIT_CHECK_FAILED, EXIT_OK


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "verify",
        run,
        description="Check the running host against the last apply: kernel arguments in "
        "/proc/cmdline, IOMMU on, every function of the handed-over cards bound to vfio-pci, "
        "nothing the host needs taken; functions on vfio-pci that passthrough did not bind are "
        "named as such. On a host passthrough never prepared (by hand, another tool): the "
        "IOMMU and vfio arguments that are live, what is bound to vfio-pci, cards only partly "
        "bound, and nothing the host needs taken. Where a vGPU layout is recorded, one line "
        "on it (`passthrough vgpu verify` names each vGPU). Exits 1 when a check fails.",
        epilog=examples(
            "passthrough verify",
            "passthrough verify --root /tmp/hgx --json",
        ),
    )
    common(p)


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.host.discover import discover
    from passthrough.host.root import HostRoot
    from passthrough.live.verify import verify
    from passthrough.output.json import verify_json
    from passthrough.output.text import Painter, render_checks, wants_color

    root = HostRoot(open_root(args.root, stack))
    results = verify(root, discover(root))
    report = verify_json(results)
    if args.json:
        dump({"root": root.path, **report}, "verify")
    else:
        print(render_checks(results, Painter(wants_color(sys.stdout, args.color))))
    return EXIT_OK if report["ok"] else EXIT_CHECK_FAILED
