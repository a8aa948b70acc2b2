# SPDX-License-Identifier: Apache-2.0
"""Applying a vGPU layout through the journal, and taking it back.

One apply transaction of the journal every host change goes through: ``sriov-manage -e``
as a command step (its inverse ``-d``), then, for a heterogeneous layout, ``nvidia-smi vgpu
-shm 1 -i PF`` (its inverse ``-shm 0``) before the first type write, each type write (vendor VFIO: the decimal id into
the VF's ``nvidia/current_vgpu_type``; mdev: a UUID into the type's ``create``) as a
``sysfs`` step naming PF, VF, id and name, read back, retried once, and the whole layout
taken back when the driver does not take it; then the record of the layout and the boot
unit that re-applies it, as file steps. The VF stays on the nvidia driver throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from passthrough.actions import Action, Run, WriteFile
from passthrough.errors import EXIT_HOST_STEP, PassthroughError
from passthrough.host.discover import discover
from passthrough.host.holders import find_holders, holder_fix
from passthrough.host.root import HostRoot
from passthrough.journal import apply as engine
from passthrough.journal import devices
from passthrough.journal.journal import (
    Journal,
    Step,
    StepKind,
    StepState,
    Transaction,
    TxKind,
    TxState,
)
from passthrough.vgpu.discover import (
    CATALOG,
    CURRENT,
    MDEV_TYPES,
    NVIDIA_SMI,
    SRIOV_MANAGE,
    parent_dir,
    parse_catalog,
    read_vgpu,
)
from passthrough.vgpu.model import Mode, VgpuCard
from passthrough.vgpu.plan import LayoutRefused, Placement, VgpuPlan, replan
from passthrough.vgpu.unit import LAYOUT, UNIT, UNIT_NAME, unit_text

Say = Callable[[str], None]
SHM = ["vgpu", "-shm"]  # nvidia-smi vgpu -shm 0|1 -i PF: heterogeneous mode off/on
Tool = Callable[[list[str]], subprocess.CompletedProcess[str]]


class VgpuFailed(PassthroughError):
    exit_code = EXIT_HOST_STEP


def tool_runner(root: HostRoot, allow_root_tools: bool) -> Tool | None:
    """How the host's ``sriov-manage`` runs: on the live root, itself; on another root only
    when asked (``allow_root_tools``: a test root whose sriov-manage is a stand-in acting on
    that root, told where through PASSTHROUGH_ROOT); otherwise None (not run)."""
    if not root.is_live and not allow_root_tools:
        return None
    env = dict(os.environ, PASSTHROUGH_ROOT=root.path)

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, check=False, env=env)

    return run


def card_now(root: HostRoot, address: str) -> VgpuCard:
    from passthrough.vgpu.plan import find_card

    return find_card(read_vgpu(root, discover(root)), address)


def refuse_holders(root: HostRoot, card: VgpuCard) -> None:
    """NVML clients (DCGM, nv-hostengine, dcgm-exporter) holding the card make
    ``sriov-manage`` fail with "Cannot obtain unbindLock": named before anything is done."""
    held = find_holders(root, [str(card.address)]).get(str(card.address), [])
    if held:
        raise LayoutRefused(
            f"{card.address}: held open, sriov-manage would fail with 'Cannot obtain unbindLock': "
            + "; ".join(h.describe() for h in held)
            + f"; {holder_fix(held)}"
        )


def _device(card: VgpuCard, p: Placement | None = None) -> dict[str, str]:
    out = {"pf": str(card.address), "mode": card.mode.value}
    if p is not None:
        out |= {"vf": str(p.vf), "type_id": str(p.type_id), "type_name": p.type_name}
        if p.uuid:
            out["uuid"] = p.uuid
    return out


def run_tool(
    journal: Journal,
    tx: Transaction,
    tool: Tool,
    argv: list[str],
    undo: list[str],
    path: str = SRIOV_MANAGE,
) -> Step:
    """The root's sriov-manage (or nvidia-smi) as a journaled command step (its inverse
    recorded)."""
    root = journal.root
    step = Step(
        n=len(tx.steps),
        kind=StepKind.RUN,
        state=StepState.BEGUN,
        argv=["/" + path, *argv],
        undo_argv=["/" + path, *undo],
    )
    tx.steps.append(step)
    journal.save()
    result = tool([root.real(path), *argv])
    if result.returncode != 0:
        tail = (result.stderr or result.stdout or "").strip().splitlines()[-1:] or [""]
        step.state, step.error = (
            StepState.FAILED,
            f"{os.path.basename(path)} {' '.join(argv)}: exit {result.returncode}: {tail[0]}",
        )
    else:
        step.state = StepState.DONE
    journal.save()
    return step


def _place(
    journal: Journal, tx: Transaction, card: VgpuCard, p: Placement, kernel: devices.Kernel | None
) -> None:
    root = journal.root
    dev = _device(card, p)
    if p.uuid is not None:
        parent = parent_dir(root, str(p.vf))
        rel = f"{parent}/{MDEV_TYPES}/nvidia-{p.type_id}/create"
        step = devices.write_attr(
            journal,
            tx,
            rel,
            p.uuid,
            undo_path=f"sys/bus/mdev/devices/{p.uuid}/remove",
            undo_value="1",
            device=dev,
            kernel=kernel,
        )
        if step.state is StepState.DONE and not root.exists(f"sys/bus/mdev/devices/{p.uuid}"):
            step.state, step.error = StepState.FAILED, f"no mdev {p.uuid} after the write"
            journal.save()
        if step.state is not StepState.DONE:
            raise VgpuFailed(f"{p.vf}: mdev {p.type_name} not created: {step.error}")
        return
    rel = f"sys/bus/pci/devices/{p.vf}/{CURRENT}"
    offered = parse_catalog(root.read(f"sys/bus/pci/devices/{p.vf}/{CATALOG}") or "", rel)
    if not any(t.id == p.type_id for t in offered):
        now = ", ".join(t.name for t in offered) or "nothing"
        raise VgpuFailed(f"{p.vf}: {p.type_name} is no longer creatable there (it offers {now})")
    error = ""
    for _attempt in (1, 2):  # the driver may reset a write to 0: once more, then give up
        step = devices.write_attr(
            journal, tx, rel, str(p.type_id), undo_value="0", device=dev, kernel=kernel
        )
        got = devices.read_attr(root, rel)
        if step.state is StepState.DONE and got == str(p.type_id):
            return
        error = step.error or f"read back {got!r}, not {p.type_id}"
        step.state, step.error = StepState.FAILED, error
        journal.save()
    raise VgpuFailed(f"{p.vf}: the driver did not take type {p.type_id} ({p.type_name}): {error}")


@dataclass
class Applied:
    tx: Transaction
    placements: list[Placement]
    listed: list[list[str]]


def record_layout(
    root: HostRoot, card: VgpuCard, placements: list[Placement], heterogeneous: bool = False
) -> bytes:
    """The layout file with this card's vGPUs added (other cards' kept). VFs (vendor VFIO
    or mdev on VFs) are gone after a reboot: the record says to enable them again."""
    try:
        data = json.loads(root.read(LAYOUT) or "{}")
    except ValueError:
        data = {}
    cards = data.get("cards") if isinstance(data, dict) else None
    cards = cards if isinstance(cards, dict) else {}
    entry = cards.setdefault(
        str(card.address), {"mode": card.mode.value, "enable_vfs": False, "vgpus": []}
    )
    entry["enable_vfs"] = card.mode in (Mode.VENDOR_VFIO, Mode.MDEV_VF)
    if heterogeneous:  # set again at boot, after the VFs and before the first type
        entry["heterogeneous"] = True
    entry["vgpus"] = [*entry.get("vgpus", []), *(p.to_json() for p in placements)]
    return (json.dumps({"version": 1, "cards": cards}, indent=2, sort_keys=True) + "\n").encode()


def apply_layout(
    root: HostRoot,
    plan: VgpuPlan,
    *,
    tool: Tool | None,
    kernel: devices.Kernel | None = None,
    say: Say = lambda _m: None,
    unit_command: str,
) -> Applied:
    card = plan.card
    for needed, what in (
        (plan.enable_vfs, "its VFs must be enabled first and sriov-manage"),
        (plan.set_heterogeneous, "heterogeneous mode is set with nvidia-smi, which"),
    ):
        if needed and tool is None:
            raise LayoutRefused(
                f"{card.address}: {what} is not run on a root that is not this machine "
                "(--run-root-tools runs the root's own, for a test root whose tools are stand-ins)"
            )
    if plan.enable_vfs:
        refuse_holders(root, card)
    placements = list(plan.placements)
    with engine.session(root) as journal:
        tx = journal.begin(TxKind.APPLY)
        try:
            if tool is not None and (plan.enable_vfs or plan.set_heterogeneous):
                card = before_types(journal, tx, plan, tool, say)
                placements = replan(card, plan)
            for p in placements:
                say(f"{p.vf}: {p.type_name} (id {p.type_id})")
                _place(journal, tx, card, p, kernel)
        except (VgpuFailed, LayoutRefused) as exc:
            back = rollback(journal, tx, tool, kernel, say)
            raise VgpuFailed(f"{exc}; {back}") from None
        listed: list[list[str]] = []
        files: list[Action] = [
            WriteFile(
                LAYOUT,
                record_layout(root, card, placements, plan.heterogeneous),
                "the vGPU layout the boot unit re-applies",
            ),
            WriteFile(UNIT, unit_text(unit_command).encode(), "re-applies the layout at boot"),
            Run(
                ("systemctl", "enable", UNIT_NAME),
                "start it at boot",
                undo_argv=("systemctl", "disable", UNIT_NAME),
            ),
        ]
        for action in files:
            failure = engine._step(journal, tx, len(tx.steps), action, engine._default_runner, say)
            if failure is not None:
                tx.state = TxState.FAILED
                journal.save()
                raise VgpuFailed(
                    f"{failure}; the layout is applied but not recorded: run `passthrough vgpu undo`"
                )
            if tx.steps[-1].state is StepState.LISTED:
                listed.append(tx.steps[-1].argv)
        tx.state = TxState.COMPLETE
        journal.save()
        return Applied(tx, placements, listed)


def before_types(
    journal: Journal, tx: Transaction, plan: VgpuPlan, tool: Tool, say: Say
) -> VgpuCard:
    """What comes before the first type write, in this order: the VFs enabled
    (``sriov-manage -e``), then heterogeneous mode set (``nvidia-smi vgpu -shm 1``). The card
    as it is after them."""
    pf = str(plan.card.address)
    steps = []
    if plan.enable_vfs:
        steps.append((SRIOV_MANAGE, ["-e", pf], ["-d", pf]))
    if plan.set_heterogeneous:
        steps.append((NVIDIA_SMI, [*SHM, "1", "-i", pf], [*SHM, "0", "-i", pf]))
    for path, argv, undo in steps:
        say(f"run /{path} {' '.join(argv)}")
        step = run_tool(journal, tx, tool, argv, undo, path)
        if step.state is not StepState.DONE:
            raise VgpuFailed(step.error or f"{path} failed")
    return card_now(journal.root, pf)


def rollback(
    journal: Journal, tx: Transaction, tool: Tool | None, kernel: devices.Kernel | None, say: Say
) -> str:
    """A layout the driver did not take: its writes taken back, its VFs disabled again."""
    tx.state = TxState.UNDOING
    back = journal.begin(TxKind.UNDO, undid=[tx.id])
    failed = devices.take_back(journal, back, [tx], say, kernel)
    failed += inverse_tools(journal, back, [tx], tool, say)
    done = not failed
    tx.state = TxState.UNDONE if done else TxState.FAILED
    back.state = TxState.COMPLETE if done else TxState.FAILED
    journal.save()
    if done:
        return "rolled back: the card is as it was"
    return f"rolling back failed too ({'; '.join(failed)}): run `passthrough vgpu undo`"


def inverse_tools(
    journal: Journal, back: Transaction, targets: list[Transaction], tool: Tool | None, say: Say
) -> list[str]:
    """``sriov-manage -d`` for each ``-e`` that ran and ``nvidia-smi vgpu -shm 0`` for each
    ``-shm 1``, newest first (run here, where the apply ran them, rather than listed by the
    generic undo)."""
    failed = []
    for tx in reversed(targets):
        for step in reversed(tx.steps):
            if not is_tool(step) or step.state is not StepState.DONE:
                continue
            if tool is None or step.undo_argv is None:
                continue  # the generic undo lists it
            say(f"run {' '.join(step.undo_argv)}")
            path = step.argv[0][1:]
            done = run_tool(journal, back, tool, step.undo_argv[1:], step.argv[1:], path)
            if done.state is StepState.DONE:
                step.state = StepState.UNDONE
            else:
                failed.append(done.error or f"{' '.join(step.undo_argv)} failed")
            journal.save()
    return failed


def is_tool(step: Step) -> bool:
    return step.kind is StepKind.RUN and step.argv[:1] in (["/" + SRIOV_MANAGE], ["/" + NVIDIA_SMI])


def is_vgpu(tx: Transaction) -> bool:
    return any(s.kind is StepKind.SYSFS or is_tool(s) or s.path == LAYOUT for s in tx.steps)


def undo_layouts(
    root: HostRoot,
    *,
    tool: Tool | None,
    kernel: devices.Kernel | None = None,
    say: Say = lambda _m: None,
) -> tuple[int, list[str]]:
    """Every vGPU transaction taken back: the type writes and mdevs first, then the VFs
    disabled, then (the generic undo) the layout record and the unit. (How many, what
    failed.)"""
    from passthrough.journal.state import STATE, own
    from passthrough.journal.undo import undo

    if not os.path.lexists(own(root, STATE)):
        return 0, []
    with engine.session(root) as journal:
        targets = [t for t in journal.live() if is_vgpu(t)]
        if not targets:
            return 0, []
        back = journal.begin(TxKind.UNDO)
        failed = devices.take_back(journal, back, targets, say, kernel)
        if not failed:
            failed += inverse_tools(journal, back, targets, tool, say)
        back.state = TxState.FAILED if failed else TxState.COMPLETE
        journal.save()
    if failed:
        raise VgpuFailed("; ".join(failed) + ": run `passthrough vgpu undo` again")
    undo(root, progress=say, only=is_vgpu, kernel=kernel)
    return len(targets), failed
