# SPDX-License-Identifier: Apache-2.0
"""A thin, typed wrapper over ansible-runner: runs the playbooks, turns runner events into
progress lines, and never reports success after a failure — ansible-runner itself does not
raise when a playbook fails, so ``status`` and ``rc`` are checked here."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from passthrough.errors import EXIT_BACKEND, Interrupted, PassthroughError, echo_path
from passthrough.provision.outcome import DESCRIBED, Outcome, canary_line, vgpu_lines
from passthrough.provision.settings import flags, user_config


class ProvisionFailed(PassthroughError):
    exit_code = EXIT_BACKEND


@dataclass
class HostResult:
    name: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    reason: str | None = None
    reboot: bool = False  # a task reported reboot_required (the host module)
    batch: int | None = None  # the rolling batch it ran in (1: the canary), None: no batches
    waiting: bool = False  # in the rolling play, not reached: an earlier batch stopped it
    check: bool = False  # a check run: plans only
    outcome: Outcome = field(default_factory=Outcome)  # what the role's tasks told

    @property
    def status(self) -> str:
        if self.waiting:
            return "not started"
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        return self.outcome.status(self.check) or ("changed" if self.changed else "ok")

    @property
    def reboot_required(self) -> bool:
        """A reboot is due and has not been done: written (or, in a check run, planned) and
        neither rebooted nor verified; hosts the role never saw: what a task reported."""
        if not self.outcome.seen:
            return self.reboot and not (self.waiting or self.failed or self.unreachable)
        return self.outcome.reboot_due and self.status in ("reboot pending", "would change")

    @property
    def why(self) -> str | None:
        """The reason shown: the failure, why it was skipped, or what its status means."""
        if self.waiting:
            return "not started: an earlier batch stopped the rolling play"
        return self.reason or self.outcome.skipped or DESCRIBED.get(self.status)


@dataclass
class RunResult:
    status: str
    rc: int
    hosts: dict[str, HostResult] = field(default_factory=dict)
    log: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.status == "successful"
            and self.rc == 0
            and not any(h.failed or h.unreachable for h in self.hosts.values())
        )

    def notes(self) -> list[str]:
        """Below the table: what the canary proved, and each host's policy warnings once."""
        lines: list[str] = []
        for host in sorted(self.hosts.values(), key=lambda h: h.name):
            line = canary_line(host.name, host.status) if host.batch == 1 else None
            lines += [line] if line else []
        for h in sorted(self.hosts.values(), key=lambda h: h.name):
            lines += vgpu_lines(h.name, h.outcome.vgpu, h.check)
        for h in sorted(self.hosts.values(), key=lambda h: h.name):
            lines += [f"warning: {h.name}: {w}" for w in h.outcome.warnings]
        return lines

    def failure(self) -> ProvisionFailed:
        """The one-line error for a run that was not ok: the hosts that failed."""
        failed = [h.name for h in self.hosts.values() if h.failed or h.unreachable]
        waiting = sum(h.waiting for h in self.hosts.values())
        return ProvisionFailed(
            f"{', '.join(sorted(failed or ['(playbook)']))} failed (status {self.status}, "
            f"rc {self.rc})"
            + (f"; {waiting} host(s) not started (the rolling play stopped)" if waiting else "")
            + "; see the log"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "status": self.status,
            "rc": self.rc,
            "log": self.log,
            "seconds": round(self.seconds, 1),
            "hosts": {
                h.name: {
                    "status": h.status,
                    "ok": h.ok,
                    "changed": h.changed,
                    "failed": h.failed,
                    "unreachable": h.unreachable,
                    "reason": h.why,
                    "reboot_required": h.reboot_required,
                    "batch": h.batch,
                    "warnings": h.outcome.warnings,
                    "vgpu": h.outcome.vgpu,
                }
                for h in self.hosts.values()
            },
            "notes": self.notes(),
        }


def playbooks_dir() -> Path:
    """The installed wheel's playbooks, or playbooks/ of the checkout."""
    from passthrough import resources

    try:
        return resources.find("playbooks", "site.yml", "PASSTHROUGH_PLAYBOOKS")
    except FileNotFoundError as exc:
        raise ProvisionFailed(str(exc)) from None


def _reason(event: dict[str, Any]) -> str:
    data = event.get("event_data", {})
    res = data.get("res", {}) or {}
    # argument_specs failures name the variable in argument_errors, not in msg; a loop's
    # failures are in its items
    items = [
        i.get("msg") for i in res.get("results") or [] if isinstance(i, dict) and i.get("failed")
    ]
    msg = (
        res.get("argument_errors")
        or [m for m in items if m]
        or res.get("msg")
        or res.get("stderr")
        or res.get("reason")
        or "failed"
    )
    if isinstance(msg, list):
        msg = "; ".join(str(m) for m in msg)
    text = (
        " ".join(line.strip() for line in str(msg).strip().splitlines() if line.strip()) or "failed"
    )
    if len(text) > 300:
        text = text[:297] + "..."
    code = res.get("exit_code")  # the CLI's exit code for the same refusal (the modules')
    if isinstance(code, int) and not isinstance(code, bool):
        text += f" (exit {code})"
    return f"{data.get('task', '?')}: {text}"


def _preflight(inventory: str, playbook: str) -> tuple[Path, str]:
    """(the playbooks folder, the inventory's absolute path), or why Ansible cannot run."""
    if (
        shutil.which("ansible-playbook") is None
        and not (Path(sys.executable).parent / "ansible-playbook").exists()
    ):
        raise ProvisionFailed("ansible-playbook not found: install ansible-core")
    books = playbooks_dir()
    if not (books / playbook).exists():
        raise PassthroughError(f"no playbook {echo_path(playbook)} in {books}")  # input: exit 2
    inv = os.path.abspath(inventory)
    if not os.path.exists(inv):
        raise PassthroughError(f"inventory {echo_path(inventory)}: no such file or directory")
    return books, inv


class _Events:
    """ansible-runner's events as they come: progress lines, each host's first failure, the log."""

    def __init__(
        self,
        say: Callable[[str], None],
        show: Callable[[str], None] | None,
        verbose: bool,
        check: bool = False,
    ) -> None:
        self.check = check
        self.say = say
        self.show = show  # where diffs go (--diff), as ansible-playbook prints them
        self.verbose = verbose  # -v: Ansible's own output, live, instead of progress lines
        self.note = (lambda _m: None) if verbose else say  # the batch lines
        self.hosts: dict[str, HostResult] = {}
        self.lines: list[str] = []
        self.fleet: list[str] = []  # the rolling play's hosts, in order (its Batch task)
        self.batches: list[list[str]] = []
        self.open: list[str] = []  # the batch running now, not yet reported

    def host(self, name: str) -> HostResult:
        return self.hosts.setdefault(name, HostResult(name, check=self.check))

    def __call__(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        stdout = event.get("stdout")
        if stdout:
            self.lines.append(stdout)
        name = data.get("host")
        res = data.get("res") or {}
        if name and isinstance(res, dict) and res.get("reboot_required") is True:
            self.host(name).reboot = True
        if name and kind == "runner_on_ok" and isinstance(res, dict):
            self.host(name).outcome.observe(data, res)
        batch = _batch_of(kind, data, res)
        if batch is not None:
            self.start_batch(*batch)
        elif kind in ("playbook_on_play_start", "playbook_on_stats"):
            self.end_batch()
        if self.verbose:
            if stdout:
                self.say(stdout)
            return True
        if self.show and stdout and kind == "runner_on_file_diff":
            self.show(stdout)  # the default callback's rendering of a task's diff
        say = self.say
        if kind == "playbook_on_play_start":
            say(f"PLAY {data.get('play', '')}")
        elif kind == "playbook_on_task_start":
            say(f"  TASK {data.get('task', '')}")
        elif kind == "runner_on_failed" and name and not data.get("ignore_errors"):
            self.host(name).reason = self.host(name).reason or _reason(event)
            say(f"    ✘ {name}: {_reason(event)}")
        elif kind == "runner_on_unreachable" and name:
            self.host(name).reason = self.host(name).reason or f"unreachable: {_reason(event)}"
            say(f"    ✘ {name}: unreachable")
        elif kind == "runner_on_ok" and name and isinstance(res, dict) and res.get("changed"):
            say(f"    ~ {name}: changed")
        return True

    def start_batch(self, batch: list[str], fleet: list[str]) -> None:
        """A progress line per batch: its hosts, and how many wait for a later one."""
        self.end_batch()
        self.fleet = fleet
        self.batches.append(batch)
        self.open = batch
        for name in batch:
            self.host(name).batch = len(self.batches)
        started = {n for b in self.batches for n in b}
        waiting = sum(name not in started for name in fleet)
        label = "canary" if len(self.batches) == 1 else f"batch {len(self.batches)}"
        self.note(f"{label}: {', '.join(batch)} ({waiting} waiting)")

    def end_batch(self) -> None:
        """A progress line per host of the batch that ended: done or failed."""
        for name in self.open:
            host = self.host(name)
            if host.reason:
                self.note(f"  {name}: failed: {host.reason}")
            elif host.outcome.skipped:
                self.note(f"  {name}: skipped: {host.outcome.skipped}")
            else:
                self.note(f"  {name}: {DESCRIBED.get(host.status, host.status)}")
        self.open = []

    def tally(self, stats: dict[str, Any]) -> None:
        """The play recap's counts, per host."""
        for stat, attr in (
            ("ok", "ok"),
            ("changed", "changed"),
            ("failures", "failed"),
            ("dark", "unreachable"),
            ("skipped", "skipped"),
        ):
            for name, count in (stats.get(stat) or {}).items():
                setattr(self.host(name), attr, int(count))
        for name in self.fleet:  # never reached: an earlier batch failed
            if self.host(name).batch is None:
                self.host(name).waiting = True


def _batch_of(kind: str, data: dict[str, Any], res: Any) -> tuple[list[str], list[str]] | None:
    """(the batch, every host of the play) where the event is host.yml's Batch task."""
    if kind != "runner_on_ok" or data.get("task") != "Batch" or not isinstance(res, dict):
        return None
    msg = res.get("msg")
    if not isinstance(msg, dict) or not isinstance(msg.get("batch"), list):
        return None
    return [str(h) for h in msg["batch"]], [str(h) for h in msg.get("hosts") or []]


def run(
    inventory: str,
    playbook: str = "site.yml",
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    tags: str | None = None,
    forks: int = 5,
    extravars: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    log_path: str | None = None,
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
    verbosity: int = 0,
    show: Callable[[str], None] | None = None,
) -> RunResult:
    """Run ``playbook``. ``extra``: ansible-playbook arguments as a list (``-e`` forms, from
    settings.extra_vars); ``show``: where diffs are printed under ``diff``."""
    try:
        import ansible_runner
    except ImportError as exc:  # pragma: no cover - a dependency
        raise ProvisionFailed(f"ansible-runner cannot be imported ({exc})") from None
    books, inv = _preflight(inventory, playbook)
    events = _Events(progress or (lambda _m: None), show if diff else None, verbosity > 0, check)
    private = tempfile.mkdtemp(prefix="passthrough-runner-")
    started = time.monotonic()
    try:
        r = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(books),
            playbook=playbook,
            inventory=inv,
            # limit, tags, forks and verbosity: ansible-runner's keywords, each its own argv
            # item; the rest as one string only because that is what ansible-runner takes:
            # it shlex.splits it, which shlex.join inverts exactly (nothing is injected)
            cmdline=shlex.join(flags(check, diff, extra or [])),
            limit=limit,
            tags=tags,
            forks=forks,
            verbosity=verbosity,
            extravars=extravars or {},
            envvars={
                # the user's ansible.cfg where they have one (Ansible's own search, from where
                # they stand: ansible-runner runs in the playbooks folder); else the playbooks'.
                # The passthrough.gpu collection is found beside the playbooks
                # (playbooks/collections/), whatever the configuration says.
                "ANSIBLE_CONFIG": user_config() or str(books / "ansible.cfg"),
                "ANSIBLE_NOCOLOR": "1",
                "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
                **(env or {}),  # e.g. PASSTHROUGH_SAMPLE_ROOT for the sample inventory
            },
            event_handler=events,
            quiet=True,
        )
        # read everything from the artifacts before they are removed
        stats: dict[str, Any] = r.stats or {}
        status, rc = str(r.status), int(r.rc if r.rc is not None else 1)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    events.tally(stats)
    result = RunResult(status=status, rc=rc, hosts=events.hosts, seconds=time.monotonic() - started)
    if log_path:
        write_private(Path(log_path), "\n".join(events.lines) + "\n")
        result.log = log_path
    if status == "canceled":  # ansible-runner took the Ctrl-C itself
        raise Interrupted()
    return result


def write_private(path: Path, text: str) -> None:
    """The run log may carry secrets a task printed: 0600, in a folder created 0700 (an existing
    folder is the user's and keeps its mode); never through a link."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)
        f.write(text)


def summary_table(result: RunResult) -> str:
    """One row per host: in batch order (the hosts a stop left waiting last), then by name."""
    head = ("host", "status", "ok", "changed", "failed", "unreachable", "reboot", "batch")
    rows: list[tuple[str, ...]] = [(*head, "reason")]
    order = sorted(result.hosts.values(), key=lambda h: (h.batch or 1 << 30, h.name))
    for h in order:
        counts = (h.ok, h.changed, h.failed, h.unreachable)
        reboot = "required" if h.reboot_required else "-"
        batch = "-" if h.batch is None else str(h.batch)
        rows.append((h.name, h.status, *map(str, counts), reboot, batch, h.why or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join(
        [
            "  ".join(r[i].ljust(widths[i]) for i in range(len(head))).rstrip()
            + ("  " + r[-1] if r[-1] else "")
            for r in rows
        ]
        + result.notes()
    )
