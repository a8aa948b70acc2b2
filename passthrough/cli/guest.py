# SPDX-License-Identifier: Apache-2.0
"""``passthrough guest check``: inside a VM, does it see its GPU and is the stack wired?

Standard library only, like the guest package: ``python3 -m passthrough guest check``
runs on a guest with no pip.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import ExitStack

from passthrough.cli.common import (
    GUEST,
    Parser,
    Subparsers,
    command,
    common,
    dump,
    examples,
    open_root,
)
from passthrough.errors import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    NotAHostRoot,
    PassthroughError,
    echo_path,
)


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "guest",
        run,
        description="Run inside the VM (standard library only: works from a checkout with "
        "python3 and no pip). Checks the GPU's functions, BARs, driver, device nodes, kernel "
        "log, nvidia-smi, a real CUDA vector add, container runtime, CDI and Kubernetes.",
        epilog=examples(
            "python3 -m passthrough guest check",
            "passthrough guest check --root guest.tar.gz --json",
        ),
    )
    actions = p.add_subparsers(dest="guest_command", metavar="ACTION", parser_class=Parser)
    check = actions.add_parser(
        "check",
        help="PASS/WARN/FAIL/SKIP, each with a fix; exits 1 when an applicable check fails",
        epilog=examples(
            "python3 -m passthrough guest check",
            "passthrough guest check --root guest.tar.gz --commands recorded/ --json",
        ),
    )
    common(check, GUEST)
    check.add_argument("--no-compute", action="store_true", help="do not run the CUDA vector add")
    check.add_argument(
        "--commands",
        metavar="DIR",
        help="replay recorded outputs of nvidia-smi -q -x, dmesg, ... from DIR instead of "
        "running the tools (default: run them on the live root, none on a captured one)",
    )


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.guest.check import run_guest_checks
    from passthrough.guest.report import FAIL, WARN, render
    from passthrough.guest.root import GuestRoot, find_root
    from passthrough.guest.runner import BadRecording, runner_for
    from passthrough.output.text import Painter, wants_color

    if args.guest_command is None:
        raise PassthroughError("guest: say which action (check); see --help")
    if not os.path.exists(args.root):
        raise NotAHostRoot(args.root, "no such file or directory")
    path = open_root(args.root, stack)
    if not os.path.isdir(path):
        raise NotAHostRoot(args.root, "neither a directory nor a .tar.gz")
    root = GuestRoot(find_root(path))
    if not root.isdir("sys") and not root.isdir("proc"):
        raise NotAHostRoot(args.root, "does not look like a guest root (no sys, no proc)")
    if args.commands is not None and not os.path.isdir(args.commands):
        raise PassthroughError(f"--commands {args.commands}: not a directory")
    try:
        report = run_guest_checks(
            root, runner_for(root.is_live, args.commands), compute=not args.no_compute
        )
    except BadRecording as exc:
        raise PassthroughError(f"--commands {echo_path(args.commands)}: {exc}") from None
    if args.json:
        dump(report.to_json(), "guest-check")
    else:
        painter = Painter(wants_color(sys.stdout, args.color))
        styles = {FAIL: "red", WARN: "yellow", "PASS": "green", "SKIP": "dim"}
        print(render(report, lambda text, level: painter(text, styles[level], "bold")))
    return EXIT_CHECK_FAILED if report.failed else EXIT_OK
