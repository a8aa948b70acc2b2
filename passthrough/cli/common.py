# SPDX-License-Identifier: Apache-2.0
"""What every command shares: the parser class, the common flags, opening a root, printing."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from contextlib import ExitStack

from passthrough.errors import EXIT_USAGE, NotConfirmed, echo
from passthrough.host.opening import open_root as open_root  # the commands take it from here

# Every command imports this module: what it imports, every start pays for. typing,
# json and logging (with its traceback and threading) cost more than argparse itself, so
# typing is for the type checker only and the other two are imported where used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    class Subparsers(Protocol):
        def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...

else:
    Subparsers = argparse._SubParsersAction  # what the commands are handed at run time

EPILOG = """\
exit codes:
  0    ok
  1    a check, verify or validate found problems
  2    usage, input or a refusal: nothing was changed
  3    a host step failed part-way: `passthrough undo` puts back what was changed
  4    libvirt or Ansible failed underneath
  5    apply is done, but what the next boot reads lacks it: `passthrough undo` puts it back
  130  interrupted (Ctrl-C)
docs: README.md, docs/ (--json: passthrough/schemas/COMMAND-v1.schema.json, named by its "schema" key)
"""

# Every command, in the order --help lists them, with the line --help gives it. Each is the
# module passthrough/cli/<name>.py; this table is all `passthrough --help` and
# `passthrough --version` need, so they import none of those modules.
COMMANDS: dict[str, str] = {
    "scan": "IOMMU groups, GPUs and a verdict with reasons for each",
    "check": "readiness checks (PASS/WARN/FAIL, each with a fix)",
    "snapshot": "capture what discovery reads into a .tar.gz",
    "sample": "bundled sample hosts (build one to try the toolkit)",
    "plan": "show the host changes (diffs, commands, reboot) without making them",
    "apply": "make the planned changes (atomic, backed up, journaled)",
    "undo": "return every file apply changed to its original, then regenerate",
    "status": "what apply/undo did to this host, drift since, pending commands",
    "verify": "after the reboot: arguments live, IOMMU on, cards on vfio-pci",
    "bind": "bind idle cards to vfio-pci now, without a reboot (live host)",
    "release": "give cards on vfio back to their host drivers now, without a reboot (live host)",
    "render": "domain XML for a guest with the whole card(s) and the hypervisor hidden",
    "validate": "check domain XML: libvirt schema, passthrough policy, optionally libvirt",
    "kubevirt": "KubeVirt/DRA manifests, their validation, and the node preflight",
    "vm": "define, start, stop, undefine and inspect guests (libvirt)",
    "vgpu": "NVIDIA vGPU: types and free VFs per card; create, keep at boot and undo a layout",
    "provision": "run the playbooks (host → vm → guest) through ansible-runner",
    "guest": "inside a guest: does it see its GPU, and is the stack above it wired?",
    "completion": "print a shell completion script (bash or zsh)",
    "man": "the manual page of passthrough or of one command",
}

# A command's body: the parsed flags, and a list of temporary directories main() removes.
Run = Callable[[argparse.Namespace, ExitStack], int]


class Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line, as every other input error does, and shows
    the exit-code table under every command's --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EPILOG)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        # `--allow` must not quietly mean --allow-boot-gpu: every flag is spelled in full
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse asks for a formatter on every add_argument, and without a width its
        # formatter imports shutil (and with it bz2, lzma) for the terminal's: a tenth of
        # the start-up. The same width, found as shutil finds it.
        return self.formatter_class(prog=self.prog, width=_columns() - 2)  # type: ignore[call-arg]

    def error(self, message: str) -> Any:
        # argparse quotes the offending value back: keep the line short
        self.exit(EXIT_USAGE, f"passthrough: error: {echo(message, 200)} (see --help)\n")


def _columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` gives it: $COLUMNS, else the
    terminal on stdout, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def once(warnings: list[str]) -> list[str]:
    """One line per warning: the same one for each of eight cards is said once, with the
    count before its code in brackets (which stays last)."""
    counted: dict[str, int] = {}
    for w in warnings:
        counted[w] = counted.get(w, 0) + 1
    out = []
    for w, n in counted.items():
        if n > 1:
            head, sep, code = w.rpartition(" [")
            w = f"{head} (the same for {n} cards){sep}{code}" if sep else f"{w} ({n} times)"
        out.append(w)
    return out


def examples(*lines: str) -> str:
    """An epilog: the examples, then the exit-code table."""
    return "examples:\n" + "".join(f"  {line}\n" for line in lines) + "\n" + EPILOG


def command(sub: Subparsers, name: str, run: Run, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand whose body is ``run``, its one-line help from :data:`COMMANDS`."""
    p = sub.add_parser(name, help=COMMANDS[name], **kwargs)
    p.set_defaults(run=run)
    return p


# What --root means, by what the command does with it.
READS = (
    "host root to read: / (live), an unpacked snapshot, a fixture, or a snapshot .tar.gz "
    "(default: /)"
)
CHANGES = (
    "host root to change: / (live) or a mounted image or directory tree; a snapshot .tar.gz "
    "is refused, it is read-only (default: /)"
)
GUEST = "guest root to read: / (inside the guest), an unpacked capture, or a .tar.gz (default: /)"


def common(p: argparse.ArgumentParser, root: str | None = READS, json: bool = True) -> None:
    """--root (its help as given; None: no --root), --json (unless the command has no JSON
    to give: ``json=False``), --color, --debug."""
    if root is not None:
        p.add_argument("--root", default="/", metavar="DIR", help=root)
    if json:
        p.add_argument(
            "--json", action="store_true", help="one JSON object on stdout, for machines"
        )
    else:
        p.set_defaults(json=False)  # what reads args.json (progress, notes) finds no JSON
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour output (default: auto; NO_COLOR honoured)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress lines or notes on stderr: only results, warnings and errors",
    )
    if "--verbose" not in p._option_string_actions:  # provision's -v is Ansible's own
        p.add_argument(
            "-v",
            "--verbose",
            action="count",
            default=0,
            help="say more on stderr: -v each file written or removed and each command run "
            "with its exit code; -vv also what was read and each command's output",
        )


LOG_PREFIX = "  | "


def verbosity(args: argparse.Namespace) -> None:
    """-v/-vv: the ``passthrough`` logger on stderr, each line marked so it never reads
    like a result or an error. Nothing is logged without -v (the logger stays silent). Each
    call sets it afresh, so ``main()`` called twice in one process (the Python API, tests)
    neither doubles the lines nor keeps an earlier call's level."""
    level = getattr(args, "verbose", 0) or 0
    quiet = not isinstance(level, int) or level < 1 or getattr(args, "command", "") == "provision"
    if quiet and "logging" not in sys.modules:
        return  # nothing configured it yet, so nothing to undo (and no import to pay for)
    import logging

    log = logging.getLogger("passthrough")
    for old in [h for h in log.handlers if getattr(h, "passthrough_cli", False)]:
        log.removeHandler(old)
    if quiet:
        log.setLevel(logging.WARNING)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_PREFIX + "%(message)s"))
    handler.passthrough_cli = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(logging.INFO if level == 1 else logging.DEBUG)
    log.propagate = False


def yes_flag(p: argparse.ArgumentParser) -> None:
    """--yes: for the commands that change the live host."""
    p.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="on the live host (--root /), go ahead without asking; required when stdin is "
        "not a terminal (scripts, CI, ssh without a tty). Other roots are never asked about",
    )


def is_live(root: str) -> bool:
    """Whether ``root`` is this machine's own /."""
    return os.path.realpath(root) == "/"


def confirm(args: argparse.Namespace, command: str, show: Callable[[], str]) -> None:
    """A change to the live host is shown and confirmed first: on a terminal the person
    is asked; without one, ``--yes`` must say so. Other roots (images, fixtures) are not
    asked about: nothing there boots this machine."""
    if getattr(args, "yes", False) or not is_live(args.root):
        return
    if not sys.stdin.isatty():
        raise NotConfirmed(command, "stdin is not a terminal to ask on; add --yes to go ahead")
    sys.stderr.write(show().rstrip("\n") + "\n")
    sys.stderr.write(f"{command} these changes on this host? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise NotConfirmed(command, "not confirmed")


def dump(obj: dict[str, Any], schema: str) -> None:
    """``--json`` output: one object whose ``schema`` key names its JSON Schema,
    ``passthrough.NAME/v1`` (passthrough/schemas/NAME-v1.schema.json)."""
    import json

    out = {"schema": f"passthrough.{schema}/v1", **{k: v for k, v in obj.items() if k != "schema"}}
    if isinstance(out.get("root"), str):  # a snapshot archive, not where it was unpacked
        from passthrough.host.opening import shown_root

        out["root"] = shown_root(out["root"])
    # Pretty for a person at a terminal; compact (and much faster) into a pipe or file.
    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(json.dumps(out, indent=indent) + "\n")


def progress(args: argparse.Namespace, prefix: str = "  · ") -> Callable[[str], None]:
    """Progress lines on stderr, none under --json or --quiet."""

    def say(message: str) -> None:
        if not args.json and not getattr(args, "quiet", False):
            sys.stderr.write(f"{prefix}{message}\n")

    return say


def note(args: argparse.Namespace, text: str) -> None:
    """A note on stderr for a person (the reasons behind a decision): not under --json or
    --quiet, and never dressed like an error (``passthrough: error:`` is for those)."""
    if not args.json and not getattr(args, "quiet", False):
        sys.stderr.write(f"note: {text}\n")


def warn(text: str) -> None:
    """A warning on stderr: always shown (also under --quiet and --json)."""
    sys.stderr.write(f"warning: {text}\n")


def say_listed(why: str, argvs: list[list[str]], then: str) -> None:
    """Commands a change could only list (``why``: not a full OS tree, not root, no
    sandbox here), to run inside the root first; ``then`` (the reboot) is said after them:
    it comes only after them."""
    import shlex

    print(f"Not run ({why}): run them inside the root first:")
    for argv in argvs:
        print("  " + shlex.join(argv))
    print(then)
