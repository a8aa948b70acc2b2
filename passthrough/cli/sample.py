# SPDX-License-Identifier: Apache-2.0
"""``passthrough sample``: the bundled sample hosts (list, build, umockdev)."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

from passthrough.cli.common import Parser, Subparsers, command, common, dump, examples
from passthrough.errors import EXIT_OK


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "sample",
        run,
        description="Sample hosts modelled on published layouts, built as real directory trees.",
        epilog=examples(
            "passthrough sample list",
            "passthrough sample build hgx-h100 /tmp/hgx",
            "passthrough scan --root /tmp/hgx",
        ),
    )
    actions = p.add_subparsers(dest="sample_command", metavar="ACTION", parser_class=Parser)
    listing = actions.add_parser(
        "list",
        help="list the sample hosts",
        epilog=examples("passthrough sample list", "passthrough sample list --json"),
    )
    common(listing, root=None)
    build = actions.add_parser(
        "build",
        help="build a sample (or a description file) into DIR",
        epilog=examples(
            "passthrough sample build hgx-h100 /tmp/hgx",
            "passthrough sample build my-host.yaml /tmp/mine  # a description of your own",
        ),
    )
    build.add_argument("name", metavar="NAME|FILE.yaml")
    build.add_argument("dest", metavar="DIR")
    common(build, root=None)
    udev = actions.add_parser(
        "umockdev",
        help="print a built sample's PCI devices as a umockdev record",
        epilog=examples("passthrough sample umockdev hgx-h100 /tmp/hgx > hgx.umockdev"),
    )
    udev.add_argument("name", metavar="NAME|FILE.yaml")
    udev.add_argument("root", metavar="BUILT_DIR")
    common(udev, root=None)


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough import fakehost

    action = args.sample_command
    if action in (None, "list"):
        rows = [
            {"name": name, "description": str(fakehost.load(name).data.get("description", ""))}
            for name in fakehost.sample_names()
        ]
        if getattr(args, "json", False):
            dump({"samples": rows}, "sample-list")
        else:
            width = max(len(r["name"]) for r in rows)
            for r in rows:
                print(f"{r['name']:<{width}}  {r['description']}")
        return EXIT_OK
    desc = fakehost.load(args.name)
    if action == "build":
        out = fakehost.build(desc, args.dest)
        if args.json:
            dump(
                {"name": desc.name, "root": str(out), "pci_functions": len(desc.nodes)},
                "sample-build",
            )
        else:
            print(
                f"built {desc.name} in {out} ({len(desc.nodes)} PCI functions); "
                f"try: passthrough scan --root {out}"
            )
        return EXIT_OK
    sys.stdout.write(fakehost.umockdev_record(desc, Path(args.root)))
    return EXIT_OK
