# SPDX-License-Identifier: Apache-2.0
"""``passthrough vm``: seed, define, start, stop, undefine and inspect guests (libvirt)."""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from passthrough.cli.common import Parser, Subparsers, command, common, dump, examples, warn
from passthrough.errors import EXIT_OK, PassthroughError, output_file

if TYPE_CHECKING:
    from passthrough.vm.disk import ExistingDisk

ACTIONS = (
    ("define", "define a domain from an XML file"),
    ("start", "start a defined domain"),
    ("stop", "shut a domain down (--force: destroy; a vGPU guest: SIGTERM only, never SIGKILL)"),
    ("undefine", "undefine a stopped domain, with its NVRAM"),
    ("status", "state and live hostdevs"),
)
# each action's examples (test:///default: libvirt's in-process test driver)
EXAMPLES = {
    "vm": (
        "passthrough render --root /tmp/hgx --name gpu1 --gpu 18:00.0 -o gpu1.xml",
        "passthrough vm define gpu1.xml --start",
        "passthrough vm status gpu1",
    ),
    "seed": ("passthrough vm seed --hostname gpu1 --ssh-key ~/.ssh/id_ed25519.pub -o seed.iso",),
    "define": (
        "passthrough vm define gpu1.xml --connect test:///default  # libvirt's test driver",
        "passthrough vm define gpu1.xml --start",
    ),
    "start": ("passthrough vm start gpu1",),
    "stop": (
        "passthrough vm stop gpu1",
        "passthrough vm stop gpu1 --force  # destroy",
        "passthrough vm stop desk1 --grace 120  # a vGPU guest: 120 s to shut down, then SIGTERM",
    ),
    "undefine": ("passthrough vm undefine gpu1",),
    "status": ("passthrough vm status gpu1 --json",),
}


def add_parser(sub: Subparsers) -> None:
    from passthrough.vm.vgpustop import GRACE

    p = command(sub, "vm", run, epilog=examples(*EXAMPLES["vm"]))
    actions = p.add_subparsers(dest="vm_command", metavar="ACTION", parser_class=Parser)
    seed = actions.add_parser(
        "seed",
        help="write a cloud-init seed ISO (user + SSH key) for --seed",
        epilog=examples(*EXAMPLES["seed"]),
    )
    seed.add_argument("--hostname", required=True)
    seed.add_argument("--user", default="passthrough", help="the guest user Ansible logs in as")
    seed.add_argument("--ssh-key", required=True, metavar="FILE.pub", help="OpenSSH public key(s)")
    seed.add_argument("-o", "--output", required=True, metavar="FILE.iso")
    common(seed, root=None)
    for action, text in ACTIONS:
        a = actions.add_parser(action, help=text, epilog=examples(*EXAMPLES[action]))
        a.add_argument("target", metavar="FILE.xml" if action == "define" else "NAME")
        a.add_argument(
            "--connect",
            default="qemu:///system",
            metavar="URI",
            help="libvirt URI (default qemu:///system)",
        )
        if action == "define":
            a.add_argument("--start", action="store_true", help="start it too")
            a.add_argument(
                "--base-image",
                metavar="PATH",
                help="make the qcow2 overlay the XML points at on this image; a file already "
                "there is refused (exit 2) unless --reuse-disk or --overwrite-disk says",
            )
            disk = a.add_mutually_exclusive_group()
            disk.add_argument(
                "--reuse-disk",
                action="store_true",
                help="with --base-image: keep a disk already at the overlay's path as it is",
            )
            disk.add_argument(
                "--overwrite-disk",
                action="store_true",
                help="with --base-image: replace a disk already there by a new overlay "
                "(its data is lost)",
            )
        if action == "stop":
            a.add_argument(
                "--force",
                action="store_true",
                help="destroy instead of a clean shutdown (a vGPU guest: SIGTERM, no SIGKILL)",
            )
            a.add_argument(
                "--grace",
                type=_seconds,
                default=GRACE,
                metavar="SECONDS",
                help="a guest holding a vGPU: how long its clean shutdown may take before "
                "QEMU gets SIGTERM alone (sent by passthrough on this machine's qemu:///system, "
                f"else libvirt's graceful destroy; a plain destroy never; default {GRACE})",
            )
        common(a, root=None)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds from 0 to 3600")
    return value


def _seed(args: argparse.Namespace) -> int:
    from passthrough.vm.seed import write_seed

    write_seed(output_file(args.output), args.hostname, args.user, args.ssh_key)
    if args.json:
        dump({"seed": args.output, "user": args.user}, "vm-seed")
    else:
        print(f"wrote {args.output} (cloud-init NoCloud: user {args.user}, host {args.hostname})")
    return EXIT_OK


def _existing(args: argparse.Namespace) -> ExistingDisk:
    from passthrough.vm.disk import ExistingDisk

    if (args.reuse_disk or args.overwrite_disk) and not args.base_image:
        flag = "--reuse-disk" if args.reuse_disk else "--overwrite-disk"
        raise PassthroughError(
            f"{flag} goes with --base-image (it says what to do with its overlay)"
        )
    if args.reuse_disk:
        return ExistingDisk.REUSE
    return ExistingDisk.OVERWRITE if args.overwrite_disk else ExistingDisk.REFUSE


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.vm import libvirt_ops as lv

    action = args.vm_command
    if action is None:
        names = ", ".join(["seed", *(name for name, _help in ACTIONS)])
        raise PassthroughError(f"vm: an action is needed ({names})")
    if action == "seed":
        return _seed(args)
    lv.binding()  # without libvirt-python: how to install it, before any file is read
    uri = args.connect
    result: dict[str, Any]
    if action == "define":
        result = lv.define_file(
            uri, args.target, args.base_image, start_it=args.start, existing=_existing(args)
        )
    elif action == "start":
        lv.start(uri, args.target)
        result = lv.status(uri, args.target)
    elif action == "stop":
        said = lv.stop(uri, args.target, force=args.force, grace=args.grace)
        result = lv.status(uri, args.target)
        if said:
            result["stopped"] = said
    elif action == "undefine":
        lv.undefine(uri, args.target)
        result = {"name": args.target, "uri": uri, "state": "undefined"}
    else:
        result = lv.status(uri, args.target)
    for line in result.get("warnings", []):
        warn(line)
    if args.json:
        dump(result, "vm")
    else:
        if "stopped" in result:
            print(result["stopped"])
        print(f"{result['name']} on {uri}: {result['state']}")
        for h in result.get("hostdevs", []):
            print(f"  hostdev {h['host']} → guest {h['guest'] or '?'}")
        if "disk" in result:
            from passthrough.vm.disk import Overlay

            print("  " + Overlay(**result["disk"]).text())
    return EXIT_OK
