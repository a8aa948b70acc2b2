"""``passthrough plan`` and ``passthrough apply``: the host changes, shown or made."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from passthrough.cli.common import (
    EPILOG,
    Subparsers,
    command,
    common,
    dump,
    examples,
    open_root,
    positive_int,
    progress,
)
from passthrough.errors import EXIT_OK

if TYPE_CHECKING:
    from passthrough.host.root import HostRoot
    from passthrough.plan.actions import Plan


def plan_flags(p: argparse.ArgumentParser) -> None:
    """Which cards, and how: shared by plan, apply and bind."""
    p.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar="ADDRESS|VENDOR:DEVICE",
        help="a card to hand over (repeatable); default: every viable NVIDIA GPU",
    )
    p.add_argument(
        "--include-group",
        action="store_true",
        help="take every device of the cards' IOMMU groups, knowingly",
    )
    p.add_argument(
        "--allow-boot-gpu",
        action="store_true",
        help="allow the boot VGA (the host loses its console)",
    )


def add_parser(sub: Subparsers) -> None:
    plan = command(
        sub,
        "plan",
        run_plan,
        help="show the host changes (diffs, commands, reboot) without making them",
        description="Compute what preparing this host for GPU passthrough changes: kernel "
        "arguments through the bootloader in use, vfio-pci binding (modprobe.d softdeps, "
        "initramfs, per-device overrides). Writes nothing.",
        epilog=examples(
            "passthrough plan",
            "passthrough plan --gpu 0000:01:00.0 --json",
            "passthrough plan --root /mnt/image --gpu 10de:2684",
        ),
    )
    apply = command(
        sub,
        "apply",
        run_apply,
        help="make the planned changes (atomic, backed up, journaled)",
        description="Execute the plan: lock, back up each file, journal each step before it, write "
        "atomically, run the regeneration commands. Stops at the first failure; `undo` restores. "
        "Re-running on an applied host changes nothing. Under --root, commands run through chroot "
        "when DIR is a full OS tree (and you are root), and are listed otherwise.",
        epilog=EPILOG,
    )
    for p in (plan, apply):
        common(p)
        plan_flags(p)
        p.add_argument("--no-iommu-pt", action="store_true", help="do not add iommu=pt")
        p.add_argument(
            "--hugepages",
            type=positive_int,
            default=0,
            metavar="N",
            help="reserve N x 1 GiB huge pages at boot (at most what the host's RAM can spare)",
        )


def _plan(
    args: argparse.Namespace, stack: list[str], changing: str | None = None
) -> tuple[HostRoot, Plan]:
    from passthrough.host.discover import discover
    from passthrough.host.root import HostRoot
    from passthrough.plan.build import PlanOptions, make_plan

    root_path = open_root(args.root, stack, changing)
    opts = PlanOptions(
        gpus=tuple(args.gpu),
        include_group=args.include_group,
        allow_boot_gpu=args.allow_boot_gpu,
        iommu_pt=not args.no_iommu_pt,
        hugepages_1g=args.hugepages,
    )
    root = HostRoot(root_path)
    plan, _sel = make_plan(root, discover(root_path), opts)
    return root, plan


def run_plan(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.plan.actions import plan_json, plan_text

    root, plan = _plan(args, stack)
    if args.json:
        dump(plan_json(plan, root))
    else:
        print(plan_text(plan, root))
    return EXIT_OK


def run_apply(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.execute.apply import apply, apply_json, command_mode, listed
    from passthrough.execute.status import status

    root, plan = _plan(args, stack, changing="apply")
    tx = apply(root, plan, plan.record(), progress=progress(args))
    # nothing to do here, but commands an earlier apply could only list are still owed
    owed = [p.argv for p in status(root).pending] if tx is None else []
    if args.json:
        dump(apply_json(tx, plan, owed))
        return EXIT_OK
    if tx is None:
        print("Nothing to do: the host already matches the plan.")
        for argv in owed:
            print("  still pending (run it inside the root): " + " ".join(argv))
        return EXIT_OK
    print(f"Applied {len(tx.steps)} steps (transaction {tx.id}).")
    if listed(tx):
        print(
            f"Not run ({command_mode(root)} mode: --root is not a full OS tree, or not root): "
            "run them inside it:"
        )
        for argv in listed(tx):
            print("  " + " ".join(argv))
    print("Reboot, then run `passthrough verify`." if plan.reboot else "No reboot required.")
    return EXIT_OK
