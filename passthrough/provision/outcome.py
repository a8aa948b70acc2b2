# SPDX-License-Identifier: Apache-2.0
"""What happened to each host of the rolling host play, from the tasks' own results rather than
from the play recap's counts: a plan made in check mode before a reboot is "changed" in the
recap although nothing was written, so a host whose batch stopped right after it read
"changed, reboot required". Here a host is

- ``applied``: the host task wrote its change and no reboot is due;
- ``reboot pending``: written, not rebooted (so not verified); ``rebooted``: a reboot command
  ran in place of the reboot, not verified; ``verified``: rebooted and ``verify`` passed;
- ``unchanged``: nothing to do; ``would change``: a check run's plan;
- ``skipped``: left as it was on purpose (``passthrough_guests: skip``), with why;
- ``not started``: its batch was never reached, or was stopped before its change was written;
- ``failed`` / ``unreachable``, with the first line of why.

A host the role never saw (vm.yml, guest.yml alone) keeps the recap's ``changed``/``ok``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HOST_TASK = "passthrough_host"  # the role's module (its action), by its short name
VERIFY_TASK = "Verify the host after the reboot"
REBOOT_TASKS = (
    "Reboot into the new kernel command line",
    'Restart a root other than "/" in place of a reboot',
)


@dataclass
class Outcome:
    """One host's facts as the events told them."""

    seen: bool = False  # the host task reported (ok or changed)
    planned: bool = False  # a plan with changes (check mode: nothing written)
    applied: bool = False  # the change written (a transaction, or an undo's restore)
    reboot_due: bool = False
    rebooted: bool = False
    verified: bool = False
    skipped: str | None = None  # why the host was left as it was
    warnings: list[str] = field(default_factory=list)  # the policy's, once each
    vgpu: list[dict[str, Any]] = field(default_factory=list)  # the layout's cards, as last told

    def observe(self, data: dict[str, Any], res: dict[str, Any]) -> None:
        """An ok (or changed) result of one of the role's tasks."""
        action = str(data.get("task_action") or "")
        task = str(data.get("task") or "")
        if action.rsplit(".", 1)[-1] == HOST_TASK and "changed" in res:
            self.seen = True
            written = (
                "transaction" in res
                or "restored" in res
                or bool(res.get("vgpu_transactions") or res.get("vgpu_restored"))
            )
            self.applied = self.applied or (written and bool(res.get("changed")))
            self.planned = self.planned or (not written and bool(res.get("changed")))
            self.reboot_due = self.reboot_due or res.get("reboot_required") is True
            if isinstance(res.get("vgpu"), list):
                self.vgpu = [c for c in res["vgpu"] if isinstance(c, dict)]
            for line in res.get("policy_warnings") or []:
                if line not in self.warnings:
                    self.warnings.append(str(line))
        elif task in REBOOT_TASKS and res.get("changed"):
            self.rebooted = True
        elif task == VERIFY_TASK and not res.get("failures"):
            self.verified = True
        msg = res.get("msg")
        if isinstance(msg, dict) and msg.get("passthrough_skipped"):
            self.skipped = " ".join(str(msg["passthrough_skipped"]).split())

    def status(self, check: bool) -> str | None:
        """The host's status where the role ran on it; None where it did not (no host task)."""
        if self.skipped:
            return "skipped"
        if not self.seen:
            return None
        if self.applied:
            if self.verified:
                return "verified"
            if self.reboot_due:
                return "rebooted" if self.rebooted else "reboot pending"
            return "applied"
        if self.planned:
            # a plan and nothing written: a check run, or a batch stopped before the change
            return "would change" if check else "not started"
        return "unchanged"


DESCRIBED = {
    "reboot pending": "applied: reboot pending, not verified",
    "rebooted": "applied: restarted by passthrough_host_reboot_command, not verified",
    "verified": "applied: rebooted and verified",
    "not started": "not started: its batch was stopped before its change was written",
}


def canary_line(name: str, status: str) -> str | None:
    """What the canary proved, said plainly."""
    if status == "verified":
        return f"canary {name}: booted with the new arguments and verify passed"
    if status == "rebooted":
        return (
            f"canary {name}: the files were written and passthrough_host_reboot_command ran in "
            "place of the reboot; not verified (verify runs where the root is /)"
        )
    if status == "reboot pending":
        return (
            f"canary {name}: the files were written, the host was not rebooted, so not verified: "
            "the canary proved the files only (passthrough_reboot_ok=true reboots and verifies it)"
        )
    return None


def vgpu_lines(name: str, cards: list[dict[str, Any]], check: bool) -> list[str]:
    """Each card of a host's vGPU layout, one line: what it holds, where, and whether this
    run made it (a card whose layout was in place already says so)."""
    lines = []
    for c in cards:
        vfs = ", ".join(str(v) for v in c.get("vfs") or []) or "VFs enabled first"
        state = str(c.get("state"))
        if state == "planned":
            state = "would be created" if check else "planned, not written"
        elif state == "applied":
            state = f"created (transaction {c.get('transaction')})"
        elif state == "restore":
            state = "on record, not in place: would be re-applied" if check else state
        elif state == "restored":
            state = "re-applied from its record (the boot unit had not)"
        else:
            state = "in place, unchanged"
        lines.append(
            f"vgpu {name}: {c.get('card')} {c.get('count')} x {c.get('type')} on {vfs}: {state}"
        )
    return lines
