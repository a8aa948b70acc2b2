# SPDX-License-Identifier: Apache-2.0
"""``passthrough check``: readiness checks, each with a fix."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack

from passthrough.cli.common import Subparsers, command, common, dump, examples
from passthrough.errors import EXIT_CHECK_FAILED, EXIT_OK


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "check",
        run,
        description="Checks in the spirit of virt-host-validate plus what it misses: IOMMU "
        "enabled and grouped, interrupt remapping, kernel default vs arguments, ACS override, "
        "vfio modules, /dev/kvm, bootloader, viable GPUs. Exits 1 when any check FAILs.",
        epilog=examples(
            "passthrough check",
            "passthrough check --root /tmp/hgx --json | jq '.checks[] | select(.level != \"PASS\")'",
        ),
    )
    common(p)


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.analysis.preflight import held_checks
    from passthrough.cli.scan import analysed, vgpu_cards
    from passthrough.output.json import check_json
    from passthrough.output.text import Painter, machine_line, render_checks, wants_color, write
    from passthrough.vgpu.checks import vgpu_checks

    scan = analysed(args, stack)
    scan.checks.extend(held_checks(scan))
    scan.checks.extend(vgpu_checks(vgpu_cards(scan)))
    if not scan.host.machine.guest:  # what a Windows guest's firmware trusts
        from passthrough.analysis.guest_firmware import secure_boot_check
        from passthrough.host.root import HostRoot

        scan.checks.append(secure_boot_check(HostRoot(scan.host.root)))
    if args.json:
        dump(check_json(scan), "check")
    else:
        paint = Painter(wants_color(sys.stdout, args.color))
        if scan.host.machine.guest:
            write(machine_line(scan, paint) + "\n")
        write(render_checks(scan.checks, paint))
    return EXIT_CHECK_FAILED if scan.failed else EXIT_OK
