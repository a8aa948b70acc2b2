"""``passthrough plan``: the host changes, shown, not made (``apply`` makes them)."""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from typing import TYPE_CHECKING

from passthrough.analysis.cards import METAVAR
from passthrough.cli.common import (
    READS,
    Subparsers,
    command,
    common,
    dump,
    examples,
    open_root,
    positive_int,
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
        metavar=METAVAR,
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
        run,
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
    plan_arguments(plan)


def plan_arguments(p: argparse.ArgumentParser, root: str = READS) -> None:
    """The flags plan and apply share: the root, the cards, and the kernel's options."""
    common(p, root)
    plan_flags(p)
    p.add_argument(
        "--release",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="a card an earlier apply bound that goes back to the host (repeatable); without "
        "it a new plan keeps every card an earlier apply bound, and says so",
    )
    p.add_argument(
        "--iommu-only",
        action="store_true",
        help="only the kernel arguments that turn the IOMMU on, no card: the first step on a "
        "host whose IOMMU is off (its groups are known only after the reboot)",
    )
    p.add_argument("--no-iommu-pt", action="store_true", help="do not add iommu=pt")
    p.add_argument(
        "--hugepages",
        type=positive_int,
        default=0,
        metavar="N",
        help="reserve N x 1 GiB huge pages at boot (at most what the host's RAM can spare)",
    )


def planned(
    args: argparse.Namespace, stack: ExitStack, changing: str | None = None
) -> tuple[HostRoot, Plan]:
    from passthrough.host.discover import discover
    from passthrough.host.root import HostRoot
    from passthrough.plan.build import PlanOptions, make_plan

    root = HostRoot(open_root(args.root, stack, changing))
    gpus, notes = selection(root, args)
    opts = PlanOptions(
        gpus=gpus,
        include_group=args.include_group,
        allow_boot_gpu=args.allow_boot_gpu,
        iommu_pt=not args.no_iommu_pt,
        hugepages_1g=args.hugepages,
        iommu_only=args.iommu_only,
        notes=notes,
    )
    plan, _sel = make_plan(root, discover(root), opts)
    return root, plan


def selection(root: HostRoot, args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The cards to plan, and what the plan should say about them. A host an earlier apply
    prepared keeps those cards unless --release gives one back: a second ``plan --gpu X``
    adds X, it never silently drops what is bound (the selection is explicit)."""
    from passthrough.errors import PassthroughError, quote
    from passthrough.execute.apply import last_applied
    from passthrough.model import PciAddress

    record = last_applied(root)
    earlier = [c.address for c in record.cards] if record else []
    release = [str(PciAddress.parse(a)) for a in args.release]
    for addr in release:
        if addr not in earlier:
            raise PassthroughError(
                f"--release {quote(addr)}: not a card an earlier apply bound "
                f"({', '.join(earlier) or 'none'})"
            )
    if args.iommu_only:
        if args.gpu or release or earlier:
            raise PassthroughError(
                "--iommu-only plans no card: "
                + (
                    "cards are bound here already (plan them, or `passthrough undo`)"
                    if earlier
                    else "leave out --gpu and --release"
                )
            )
        return (), ()
    kept = [a for a in earlier if a not in release]
    if not earlier:
        return tuple(args.gpu), ()
    if not kept and not args.gpu:
        raise PassthroughError(
            "--release gives back every card an earlier apply bound: that is `passthrough undo`"
        )
    notes = tuple(
        f"{a}: kept from the earlier apply (--release {a} gives it back to the host)" for a in kept
    ) + tuple(f"{a}: released, goes back to the host after the reboot" for a in release)
    return (*args.gpu, *kept), notes


def owed(root: HostRoot) -> list[list[str]]:
    """Commands an earlier apply could only list (or that failed) and that are still owed:
    plan, apply and status name the same ones."""
    from passthrough.execute.status import status

    return [p.argv for p in status(root).pending]


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    import shlex

    from passthrough.plan.actions import plan_text

    root, plan = planned(args, stack)
    pending = owed(root)
    if args.json:
        dump({**plan.to_json(root), "pending": pending}, "plan")
        return EXIT_OK
    print(plan_text(plan, root))
    if pending:
        print("\nStill pending from an earlier apply (run it inside the root, or `apply` again):")
        for argv in pending:
            print("  " + shlex.join(argv))
    return EXIT_OK
