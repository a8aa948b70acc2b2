# SPDX-License-Identifier: Apache-2.0
"""The host role's task on a host: read it, plan, apply (or show) and report, as one result dict.

Two ways in, one body (``run``): the collection's ``passthrough_host`` module (Ansible's
AnsiballZ wrapper, which brings ``ansible.module_utils`` along and compiles it on the host at
every call), and ``python -I -m passthrough.hosttask PAYLOAD`` (``main``), the command the
collection's action runs under the host's runtime venv where the library is installed already:
one process, no wrapper to compile, no temporary directory to make, fill and remove. The
action checks the arguments on the controller with the module's own argument spec first, so
both ways see the same validated parameters.

``main`` reads the venv's identity file before it imports anything else of the library: where
it is not the controller's, it reports ``passthrough_runtime`` and does nothing (the action
installs, then runs the task again).
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from passthrough.host.root import HostRoot

# the line of the command's output that carries its result (a login or sudo may print first)
RESULT = "passthrough-task-result:"
MARKER = "passthrough-runtime"  # the identity file the runtime module writes into the venv
# how a fleet user writes huge pages that cannot be checked (the module has no --force)
FLEET_FORCE = (
    "passthrough_host_hugepages is written only where the host reports its RAM; "
    "`passthrough apply --hugepages-1g N --force` on the host writes it anyway"
)


def _preflight(host: Any, required: list[str]) -> dict[str, Any] | None:
    """A failed result where a required readiness check fails, naming each with its summary
    and fix; None where none does."""
    if not required:
        return None
    from passthrough.analysis.scan import analyse
    from passthrough.model import Level
    from passthrough.output.json import scan_json

    checks = scan_json(analyse(host))["checks"]
    blocking = [c for c in checks if c["level"] == Level.FAIL.value and c["id"] in required]
    if not blocking:
        return None
    fixes = "; ".join(c["fix"] for c in blocking if c.get("fix"))
    return {
        "failed": True,
        "msg": f"preflight: {', '.join(c['id'] for c in blocking)} failed: "
        f"{'; '.join(c['summary'] for c in blocking)}" + (f" (fix: {fixes})" if fixes else ""),
        "checks": checks,
        "exit_code": 1,  # EXIT_CHECK_FAILED: what `passthrough check` exits with here
    }


def _undo(root: Any, check_mode: bool, run_root_tools: bool = False) -> dict[str, Any]:
    from passthrough.journal.journal import Journal
    from passthrough.journal.undo import undo
    from passthrough.vgpu.apply import is_vgpu

    live = Journal.load(root).live()
    vgpu = [tx for tx in live if is_vgpu(tx)]  # taken back as `passthrough vgpu undo` does
    pending = [tx for tx in live if not is_vgpu(tx)]
    # the cards the applied changes bound: undone, they go back to the host's drivers
    given_back = sorted({f for tx in pending if tx.record for f in tx.record.functions})
    if check_mode or not live:
        return {
            "changed": bool(live),
            "reboot_required": bool(pending),
            "functions": given_back,
            **({"vgpu_undone": len(vgpu)} if vgpu else {}),
        }
    undone = 0
    if vgpu:  # first, where sriov-manage can still disable the VFs it enabled
        from passthrough.vgpu.apply import tool_runner, undo_layouts

        undone, _ = undo_layouts(root, tool=tool_runner(root, run_root_tools))
    restored = undo(root).changed if pending else []
    return {
        "changed": bool(restored) or bool(undone),
        "reboot_required": bool(restored),
        "restored": restored,
        "functions": given_back,
        **({"vgpu_undone": undone} if vgpu else {}),
    }


def run(params: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    """The task's result for validated module parameters (``failed`` set where a required
    check refuses). A refusal of the library (a PassthroughError) is raised, as the command
    line would exit on it."""
    from passthrough.host.discover import discover
    from passthrough.host.root import HostRoot
    from passthrough.journal.selection import plan_options
    from passthrough.plan.build import make_plan
    from passthrough.plan.options import values
    from passthrough.plan.reserve import refuse_unsized

    root = HostRoot(params["root"])
    layout = params.get("vgpu_layout")
    if params["state"] == "absent":
        return _undo(root, check_mode, bool(params.get("vgpu_run_root_tools")))
    host = discover(root)
    asked = values(params, module=True)
    opts = plan_options(root, asked, via="module")
    # a vGPU host's cards stay on the nvidia driver: with a layout and no card named, no
    # whole card is planned for vfio-pci
    plan = None
    if not layout or params.get("gpus") or params.get("iommu_only"):
        plan, _sel = make_plan(root, host, opts)
    # huge pages where the root reports no RAM: refused as `passthrough apply` refuses them
    # (the module has no --force; a check run says what the real one would do)
    refuse_unsized(root, asked["hugepages_1g"], force=False, hint=FLEET_FORCE)
    # the whole layout planned (and refused, naming the problem) before anything is written
    cards = _vgpu_plan(root, layout, plan)
    # a card to make, or one whose recorded layout the boot unit did not re-apply
    vgpu_change = any(c.plan is not None or c.state == "restore" for c in cards)
    if (plan is not None and not plan.empty) or vgpu_change:
        # the checks guard a change; with nothing to change, none is due
        refused = _preflight(host, params["preflight"])
        if refused is not None:
            return refused
    # a regeneration an earlier run left pending (it failed, or was cut off) runs again, as
    # `passthrough apply` runs it: the boot's sources change, so a reboot is due
    empty = plan is None or plan.empty
    owed = _owed(root) if empty else []
    result: dict[str, Any] = {
        "changed": not empty or bool(owed) or vgpu_change,
        "reboot_required": (plan is not None and plan.reboot) or bool(owed),
        "functions": list(plan.functions) if plan is not None else [],
        "diff": _diff(root, plan),
        "pending": owed,
        # the policy's warnings on the cards (NVSwitch, large BARs...), one line each: the
        # fleet's summary shows them once per host
        "policy_warnings": list(plan.warnings) if plan is not None else [],
    }
    if plan is not None:  # none where a vGPU layout alone is asked for
        result["plan"] = plan.to_json(root)
    if cards:
        result["vgpu"] = [c.to_json() for c in cards]
    if check_mode or (empty and not owed and not vgpu_change):
        return result
    if plan is not None and (not empty or owed):
        from passthrough.journal.apply import apply  # only where there is something to do

        tx = apply(root, plan, plan.record())
        steps = tx.steps if tx else []
        result["transaction"] = tx.id if tx else None
        result["commands_not_run"] = [s.argv for s in steps if s.state.value == "listed"]
    if vgpu_change:
        from passthrough.vgpu.apply import tool_runner
        from passthrough.vgpu.converge import apply_host
        from passthrough.vgpu.unit import unit_command

        tool = tool_runner(root, bool(params.get("vgpu_run_root_tools")))
        result["vgpu_transactions"] = apply_host(
            root, cards, tool=tool, unit_command=unit_command()
        )
        result["vgpu"] = [c.to_json() for c in cards]
        restored = [str(c.card.address) for c in cards if c.state == "restored"]
        if restored:
            result["vgpu_restored"] = restored
    return result


def _diff(root: HostRoot, plan: Any) -> list[dict[str, str]]:
    """Each file the plan writes or removes, before and after, as Ansible shows a diff."""
    from passthrough.actions import RemoveFile, WriteFile

    diff = []
    for action in plan.actions if plan is not None else []:
        if isinstance(action, WriteFile | RemoveFile):
            before = root.read_bytes(action.path)
            diff.append(
                {
                    "before_header": "/" + action.path,
                    "after_header": "/" + action.path,
                    "before": before.decode("utf-8", "replace") if before is not None else "",
                    "after": action.content.decode("utf-8", "replace")
                    if isinstance(action, WriteFile)
                    else "",
                }
            )
    return diff


def _vgpu_plan(root: HostRoot, layout: Any, plan: Any) -> list[Any]:
    """The layout's cards against what each holds; refused where a card is also one the
    plan hands to vfio-pci (a vGPU card stays on the nvidia driver)."""
    if not layout:
        return []
    from passthrough.vgpu.converge import plan_host
    from passthrough.vgpu.plan import LayoutRefused

    where = "passthrough_host_vgpu_layout"
    cards = plan_host(root, layout, where)
    bound = set(plan.functions) if plan is not None else set()
    for c in cards:
        if str(c.card.address) in bound:
            raise LayoutRefused(
                f"{where}: {c.card.address} is also a card passthrough_host_gpus hands to "
                "vfio-pci; a vGPU card stays on the nvidia driver: name it in one of the two"
            )
    return cards


def _owed(root: HostRoot) -> list[list[str]]:
    """The regenerations an earlier apply left pending that apply runs again here (what
    `passthrough apply` with nothing else to do runs): read without the lock, as a no-op
    run reads (apply decides again under it); apply's module only where one is owed."""
    from passthrough.journal.state import JOURNAL, full_os

    # where commands are only listed (a tree that is no full OS: the tests' and the fleet
    # benchmark's roots) nothing runs again: not even the journal is read
    if not (root.is_live or full_os(root)) or not root.exists(JOURNAL):
        return []
    from passthrough.journal.journal import Journal

    owed = [list(s.argv) for _tx, s in Journal.load(root).pending(regenerations=True)]
    if not owed:
        return []
    from passthrough.journal.apply import command_mode

    return owed if command_mode(root) != "list" else []


def _identity(path: str) -> str:
    """The venv's identity file, "" where it is absent or no regular file. Opened
    non-blocking (a FIFO there must not hang the task) with the standard library alone:
    nothing else of the library is imported before the identity is known to be ours (so
    not passthrough.inputs.read_head, which does the same)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, 4096).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)


def _stale(runtime: dict[str, Any]) -> dict[str, Any] | None:
    """What the venv this runs in holds, where it is not the identity the action expects."""
    have = _identity(os.path.join(str(runtime.get("venv")), MARKER))
    lacking: list[str] = []
    if runtime.get("requires"):
        import importlib.util

        lacking = [m for m in runtime["requires"] if importlib.util.find_spec(m) is None]
    if have == runtime.get("identity") and not lacking:
        return None
    return {"have": have, "lacking": lacking}


def _outcome(payload: dict[str, Any]) -> dict[str, Any]:
    stale = _stale(payload.get("runtime") or {})
    if stale is not None:
        return {"changed": False, "passthrough_runtime": stale}
    try:
        return run(payload["params"], bool(payload["check_mode"]))
    except Exception as exc:
        from passthrough.errors import PassthroughError

        if not isinstance(exc, PassthroughError):
            raise
        # exit_code: what `passthrough` itself exits with for the same refusal (docs/cli.md)
        return {
            "failed": True,
            "msg": str(exc),
            "codes": list(getattr(exc, "codes", ())),
            "exit_code": int(exc.exit_code),
        }


def _payload(text: str) -> dict[str, Any] | str:
    """The decoded payload, or why it is not one (the action writes it: anything else was
    typed or cut short on the way)."""
    import binascii

    try:
        payload = json.loads(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError, RecursionError):  # ValueError: JSON, UTF-8, digits
        return "not base64 of a JSON object"
    if not isinstance(payload, dict):
        return "not a JSON object"
    params = payload.get("params")
    if not isinstance(params, dict) or not isinstance(payload.get("check_mode"), bool):
        return "no params object or no check_mode true/false"
    if not all(isinstance(params.get(k), str) for k in ("root", "state")):
        return "params without root and state strings"
    if not isinstance(payload.get("runtime") or {}, dict):
        return "runtime is not an object"
    return payload


def main(argv: list[str]) -> int:
    """``PAYLOAD``: base64 of ``{"params": …, "check_mode": …, "runtime": {identity, venv}}``.
    Prints the result on one line after ``RESULT``; a payload that is not one is a line on
    stderr and exit 2 (nothing done); a bug shows as its traceback (exit 1)."""
    if len(argv) != 1:
        print("usage: python -I -m passthrough.hosttask PAYLOAD", file=sys.stderr)
        return 2
    payload = _payload(argv[0])
    if isinstance(payload, str):
        print(f"passthrough.hosttask: bad PAYLOAD: {payload}", file=sys.stderr)
        return 2
    result = _outcome(payload)
    result["invocation"] = {"module_args": payload["params"]}
    print(RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
