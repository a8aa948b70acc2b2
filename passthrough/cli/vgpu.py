# SPDX-License-Identifier: Apache-2.0
"""``passthrough vgpu``: each card's vGPU types and free VFs, a layout planned, applied and
taken back through the journal, and re-applied at boot by the unit apply installs."""

from __future__ import annotations

import argparse
import shlex
import sys
from contextlib import ExitStack
from typing import Any

from passthrough.cli.common import (
    CHANGES,
    Parser,
    Subparsers,
    command,
    common,
    confirm,
    dump,
    examples,
    open_root,
    progress,
    yes_flag,
)
from passthrough.errors import EXIT_CHECK_FAILED, EXIT_HOST_STEP, EXIT_OK, PassthroughError

ACTIONS = (
    ("list", "each NVIDIA card's vGPU mode, its VFs and the types it can still create"),
    ("plan", "show what apply would do for --card/--type/--count (nothing written)"),
    ("apply", "create the vGPUs (through the journal) and install the boot unit"),
    ("undo", "take every vGPU layout back: types, mdevs, VFs, the record and the unit"),
    ("restore", "re-apply the recorded layout (what the boot unit runs)"),
    ("verify", "after a reboot: check each recorded vGPU's type in sysfs against the record"),
)
EXAMPLES = {
    "list": ("passthrough vgpu list", "passthrough vgpu list --json | jq '.cards[].mode'"),
    "plan": (
        "passthrough vgpu plan --card 0000:41:00.0 --type L40S-12Q --count 4",
        "passthrough vgpu plan --layout vgpu.yaml",
    ),
    "apply": ("passthrough vgpu apply --card 0000:41:00.0 --type L40S-12Q --count 4",),
    "undo": ("passthrough vgpu undo",),
    "restore": ("passthrough vgpu restore  # ExecStart of passthrough-vgpu.service",),
    "verify": ("passthrough vgpu verify", "passthrough vgpu verify --json"),
}


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "vgpu",
        run,
        description="NVIDIA vGPU on this host: each card's mode (vendor VFIO on SR-IOV VFs, mdev "
        "on VFs or on the card), a layout of types by name applied through the journal and taken "
        "back by undo, and the boot unit that re-applies it (docs/vgpu.md).",
        epilog=examples("passthrough vgpu list", *EXAMPLES["plan"]),
    )
    actions = p.add_subparsers(dest="vgpu_command", metavar="ACTION", parser_class=Parser)
    actions.required = True
    for action, text in ACTIONS:
        a = actions.add_parser(
            action,
            help=text,
            description=text[0].upper() + text[1:] + ".",
            epilog=examples(*EXAMPLES[action]),
        )
        common(
            a,
            CHANGES if action in ("apply", "undo", "restore") else "host root to read (default: /)",
        )
        if action in ("plan", "apply"):
            a.add_argument("--card", metavar="ADDRESS", help="the card (its PF)")
            a.add_argument("--type", metavar="NAME", help="a type by name, e.g. L40S-12Q")
            a.add_argument("--count", type=int, metavar="N", help="how many vGPUs")
            a.add_argument(
                "--layout",
                metavar="FILE.yaml",
                help="instead of --card/--type/--count: 'cards:' mapping each card's quoted "
                'address to {TYPE: COUNT} ("0000:41:00.0": {L40S-12Q: 4}); several types on '
                "a card with 'heterogeneous: true' (docs/vgpu.md)",
            )
        if action in ("apply", "undo", "restore"):
            a.add_argument(
                "--run-root-tools",
                action="store_true",
                help="on a root that is not this machine, run the root's own sriov-manage "
                "(a test root's stand-in); never needed on the live host",
            )
        if action in ("apply", "undo"):
            yes_flag(a)


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.host.root import HostRoot

    changing = args.vgpu_command if args.vgpu_command in ("apply", "undo", "restore") else None
    root = HostRoot(open_root(args.root, stack, changing=changing))
    handler = {
        "list": _list,
        "plan": _plan,
        "apply": _apply,
        "undo": _undo,
        "restore": _restore,
        "verify": _verify,
    }
    return handler[args.vgpu_command](args, root)


def _cards(root: Any) -> Any:
    from passthrough.host.discover import discover
    from passthrough.vgpu.discover import read_vgpu

    return read_vgpu(root, discover(root))


def list_text(cards: Any) -> str:
    lines = []
    for c in cards:
        lines.append(f"{c.address} {c.name or ''}  mode: {c.mode.value} ({c.why})")
        for vf in c.vfs:
            state = "free" if vf.free else f"{vf.type_name or '?'} (id {vf.type_id})"
            if vf.mdevs:
                state = ", ".join(f"mdev {m.uuid} {m.type_name}" for m in vf.mdevs)
            used = f", in use by {vf.guest}" if vf.guest else ""
            lines.append(f"  {vf.address}  {state}{used}")
        types = c.types()
        if types:
            names = ", ".join(
                t.short + (f" ({t.available} left)" if t.available is not None else "")
                for t in types
            )
            lines.append(f"  creatable: {names}")
    return "\n".join(lines) + "\n" if lines else "No NVIDIA card.\n"


def _list(args: argparse.Namespace, root: Any) -> int:
    cards = _cards(root)
    if args.json:
        dump({"root": root.path, "cards": [c.to_json() for c in cards]}, "vgpu")
    else:
        sys.stdout.write(list_text(cards))
    return EXIT_OK


def _planned(args: argparse.Namespace, root: Any) -> list[Any]:
    """One plan per card (--layout), or the one of --card/--type/--count; every one made
    before anything is done, so that a bad entry changes nothing."""
    from passthrough.vgpu.layoutfile import load_layout
    from passthrough.vgpu.plan import LayoutRefused, find_card, plan_card

    given = [f for f in ("card", "type", "count") if getattr(args, f) is not None]
    if args.layout is not None:
        if given:
            raise LayoutRefused(f"--layout or --{'/--'.join(given)}: not both")
        wanted = load_layout(args.layout)
    elif len(given) < 3:
        raise LayoutRefused("--card, --type and --count are needed (or --layout FILE.yaml)")
    else:
        wanted = [(args.card, [(args.type, args.count)], False)]
    cards = _cards(root)
    plans = [plan_card(find_card(cards, c), types, mixed) for c, types, mixed in wanted]
    seen = [str(p.card.address) for p in plans]
    if len(set(seen)) < len(seen):
        raise LayoutRefused("a card is named twice in the layout")
    return plans


def _plan(args: argparse.Namespace, root: Any) -> int:
    plans = _planned(args, root)
    if args.json:
        dump(
            {"root": root.path, **plans[0].to_json(), "plans": [p.to_json() for p in plans]}, "vgpu"
        )
    else:
        sys.stdout.write("".join(line + "\n" for p in plans for line in p.lines()))
    return EXIT_OK


def _apply(args: argparse.Namespace, root: Any) -> int:
    from passthrough.vgpu.apply import VgpuFailed, apply_layout, tool_runner
    from passthrough.vgpu.unit import unit_command

    plans = _planned(args, root)
    confirm(args, "apply", lambda: "\n".join(line for p in plans for line in p.lines()))
    tool = tool_runner(root, args.run_root_tools)
    done = []
    for plan in plans:  # each card its own transaction
        try:
            done.append(
                apply_layout(root, plan, tool=tool, say=progress(args), unit_command=unit_command())
            )
        except VgpuFailed as exc:
            if done:
                cards = ", ".join(str(p.card.address) for p in plans[: len(done)])
                exc.message += (
                    f"; applied before it: {cards} (`passthrough vgpu undo` takes them back)"
                )
            raise
    applied = [
        {**p.to_json(), "vgpus": [v.to_json() for v in d.placements], "transaction": d.tx.id}
        for p, d in zip(plans, done, strict=True)
    ]
    listed = [argv for d in done for argv in d.listed]
    if args.json:
        dump(
            {"root": root.path, **applied[-1], "applied": applied, "commands_not_run": listed},
            "vgpu",
        )
        return EXIT_OK
    for p, d in zip(plans, done, strict=True):
        print(
            f"Created {len(d.placements)} {p.type_name} on {p.card.address} (transaction {d.tx.id})."
        )
    for argv in {tuple(a): a for a in listed}.values():
        print(f"Not run on this root (run it on the host): {shlex.join(argv)}")
    return EXIT_OK


def _undo(args: argparse.Namespace, root: Any) -> int:
    from passthrough.vgpu.apply import tool_runner, undo_layouts

    confirm(args, "undo", lambda: "every vGPU layout passthrough created")
    count, _ = undo_layouts(root, tool=tool_runner(root, args.run_root_tools), say=progress(args))
    if args.json:
        dump({"root": root.path, "undone": count}, "vgpu")
    else:
        print(f"Took back {count} vGPU layout(s)." if count else "No vGPU layout to take back.")
    return EXIT_OK


def _restore(args: argparse.Namespace, root: Any) -> int:
    from passthrough.vgpu.apply import VgpuFailed, tool_runner
    from passthrough.vgpu.converge import restore_from_record

    def say(line: str) -> None:
        print(line, flush=True)  # to the journal of systemd, line by line

    tool = tool_runner(root, args.run_root_tools or root.is_live)
    try:
        failed = restore_from_record(root, tool, say)
    except VgpuFailed as exc:  # a broken record: one line, nothing done
        raise PassthroughError(exc.message) from None
    return EXIT_HOST_STEP if failed else EXIT_OK


def _verify(args: argparse.Namespace, root: Any) -> int:
    from passthrough.vgpu.unit import LAYOUT
    from passthrough.vgpu.verify import summary, verify_layout

    try:
        found = verify_layout(root)
    except ValueError as exc:
        raise PassthroughError(str(exc)) from None
    ok = all(f.ok for f in found or [])
    if args.json:
        checked = [f.to_json() for f in found or []]
        dump(
            {"root": root.path, "recorded": found is not None, "ok": ok, "checked": checked}, "vgpu"
        )
    elif found is None:
        print(f"No vGPU layout recorded (/{LAYOUT}): nothing to verify.")
    else:
        for f in found:
            print(f.line())
        print(summary(found) + ".")
    return EXIT_OK if ok else EXIT_CHECK_FAILED


def kube_vgpus(out: Any, host: Any, wanted: list[str]) -> None:
    """``kubevirt render --vgpu``: the entries added to the KubeVirt patch (made when the
    manifests have none) and the gpus to each VirtualMachine; what they cannot say, warned."""
    from passthrough.host.root import HostRoot
    from passthrough.kube.objects import kubevirt_patch
    from passthrough.vgpu.discover import read_vgpu
    from passthrough.vgpu.kubevirt import vgpu_devices

    ids = {str(f.address): f"{f.vendor_id:04X}:{f.device_id:04X}" for f in host.functions}
    permitted, gpus, notes = vgpu_devices(read_vgpu(HostRoot(host.root), host), wanted, ids)
    patch = next((d for d in out.documents if d.get("kind") == "KubeVirt"), None)
    if patch is None:
        patch = kubevirt_patch([], [])
        out.documents.insert(0, patch)
    config = patch["spec"]["configuration"]
    if "pciHostDevices" in permitted:
        gates = config.setdefault("developerConfiguration", {}).setdefault("featureGates", [])
        if "HostDevices" not in gates:
            gates.append("HostDevices")
    devices = config.setdefault("permittedHostDevices", {})
    for key, entries in permitted.items():
        devices.setdefault(key, []).extend(e for e in entries if e not in devices.get(key, []))
    vms = [d for d in out.documents if d.get("kind") == "VirtualMachine"]
    for doc in vms:
        domain = doc["spec"]["template"]["spec"]["domain"]
        domain.setdefault("devices", {}).setdefault("gpus", []).extend(gpus)
    if not vms:
        out.decisions.append(
            "vGPUs only: the stream holds the KubeVirt patch; the VM's "
            "spec.template.spec.domain.devices.gpus takes "
            + ", ".join(f"{{name: {g['name']}, deviceName: {g['deviceName']}}}" for g in gpus)
        )
    out.warnings.extend(notes)
