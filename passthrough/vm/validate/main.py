# SPDX-License-Identifier: Apache-2.0
"""``validate``'s command line, shared by ``passthrough validate`` and the lean
``passthrough-validate`` entry point (the same flags and output; it skips importing the
whole toolkit, which is what a per-file pre-commit or CI hook pays for every file)."""

from __future__ import annotations

import sys
from contextlib import ExitStack  # loaded by site already: no start-up cost

from passthrough.errors import EXIT_CHECK_FAILED, EXIT_OK, EXIT_USAGE, PassthroughError, output_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from types import SimpleNamespace

    Args = argparse.Namespace | SimpleNamespace

DESCRIPTION = (
    "Validate any domain XML, ours or hand-written, as a CI gate: libvirt's RelaxNG schema "
    "(the local libvirt's, or --schema-dir), generic guest-PCI rules, GPU rules for GPU functions "
    "only (by --host-root facts or render's metadata), host rules with --host-root, and with "
    "--connect URI a define of a private copy. Each finding has a code, a layer, a severity, and "
    "the line and XPath of the element at fault (--list-rules). Settings: "
    "[tool.passthrough.validate] in pyproject.toml. Exits 1 when an error is found (a warning "
    "too with --strict)."
)
EXAMPLES = (
    "examples:\n  passthrough validate vms/*.xml\n"
    "  passthrough validate --host-root host.tar.gz --junit report.xml vms/*.xml\n"
    "  passthrough validate --schema-dir fleet-libvirt/schemas --sarif out.sarif vms/*.xml\n"
    "  passthrough validate --connect test:///default gpu1.xml\n"
    "  passthrough-validate vm.xml  # the same, with the shortest start-up\n"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", metavar="FILE")
    p.add_argument(
        "--host-root",
        metavar="DIR",
        help="host facts (root dir or snapshot; / for this host) for GPU-ness, whole-card, "
        "MMIO and hostdev-exists checks",
    )
    p.add_argument(
        "--connect",
        "--libvirt",  # the older spelling, kept working
        dest="libvirt",
        metavar="URI",
        help="also define a private copy (fresh name and UUID) on this libvirt connection "
        "(as virsh -c / vm --connect), then undefine it; --libvirt is the older name",
    )
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report for CI systems")
    p.add_argument(
        "--sarif", metavar="FILE", help="write a SARIF 2.1.0 log (code-scanning annotations)"
    )
    p.add_argument(
        "--schema-dir",
        metavar="DIR",
        help="libvirt schemas/ directory of the target libvirt (default: the local libvirt's)",
    )
    p.add_argument(
        "--select",
        action="append",
        metavar="CODE",
        help="report only these codes, prefixes or layers (repeatable)",
    )
    p.add_argument(
        "--ignore",
        action="append",
        metavar="CODE",
        help="do not report these codes, prefixes or layers (repeatable)",
    )
    p.add_argument(
        "--schema-only",
        action="store_true",
        default=None,
        help="only the file and schema layers",
    )
    p.add_argument("--strict", action="store_true", default=None, help="warnings fail too")
    p.add_argument(
        "--config", metavar="FILE", help="settings file (default: the nearest pyproject.toml)"
    )
    p.add_argument("--list-rules", action="store_true", help="print the rule catalogue and exit")


def run(args: Args, open_root: Callable[[str], str]) -> int:
    from . import Options, Selection, config, load, reports, validate_files

    if args.list_rules:
        sys.stdout.write(reports.catalogue(args.json))
        return EXIT_OK
    if not args.files:
        raise PassthroughError("validate: no FILE given (or --list-rules)")
    for option, path in (("--junit", args.junit), ("--sarif", args.sarif)):
        if path:
            output_file(path, option)  # before any work: a missing directory is a usage error
    cfg = config.load(args.config)
    selection = Selection(
        tuple(args.select) if args.select else cfg.select,
        cfg.ignore + tuple(args.ignore or ()),
        cfg.strict if args.strict is None else args.strict,
    )
    host = None
    if args.host_root:
        from passthrough.errors import NotAHostRoot
        from passthrough.host.discover import discover

        try:
            host = discover(open_root(args.host_root))
        except NotAHostRoot as exc:  # told as the option validate took it by
            raise NotAHostRoot(exc.root, exc.why, "--host-root") from None
    schema = load(args.schema_dir or cfg.schema_dir)
    schema.rng()  # a missing or broken schema dir is one usage error, before any file
    if args.libvirt:  # so is a missing libvirt-python: one line, before any file
        from passthrough.vm.libvirt_ops import binding

        binding()
    opts = Options(
        host=host,
        schema=schema,
        schema_only=cfg.schema_only if args.schema_only is None else args.schema_only,
        libvirt_uri=args.libvirt,
    )
    results = validate_files(list(args.files), opts, selection.keep)
    if args.junit:
        with open(args.junit, "wb") as fh:
            fh.write(reports.junit(results, selection, schema.label))
    if args.sarif:
        with open(args.sarif, "w") as fh:
            fh.write(reports.sarif(results, schema.label))
    if args.json:
        import json

        indent = 2 if sys.stdout.isatty() else None
        sys.stdout.write(
            json.dumps(reports.as_json(results, selection, schema.label), indent=indent) + "\n"
        )
    else:
        sys.stdout.write(reports.text(results, selection, schema.label))
    failed = any(selection.fails(f) for fs in results.values() for f in fs)
    return EXIT_CHECK_FAILED if failed else EXIT_OK


DEFAULTS = {
    "host_root": None,
    "libvirt": None,
    "junit": None,
    "sarif": None,
    "schema_dir": None,
    "select": None,
    "ignore": None,
    "schema_only": None,
    "strict": None,
    "config": None,
    "list_rules": False,
    "json": False,
    "debug": False,
}


def parse(argv: Sequence[str]) -> Args:
    """Only file names (what pre-commit passes) need no argparse, whose import and set-up
    is a tenth of a hook's start-up; anything else goes through the full parser."""
    if argv and not any(a.startswith("-") for a in argv):
        from types import SimpleNamespace  # already imported by the interpreter

        return SimpleNamespace(files=list(argv), **DEFAULTS)
    return parser().parse_args(argv)


def parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="passthrough-validate",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``passthrough-validate``: errors as one line with the documented exit code."""
    args = parse(sys.argv[1:] if argv is None else argv)
    stack = ExitStack()  # temporary directories (an unpacked --host-root), removed at the end
    try:
        with stack:
            return run(args, lambda path: _open_root(path, stack))
    except PassthroughError as exc:
        if args.debug:
            raise
        sys.stderr.write(f"passthrough-validate: error: {exc}\n")
        return exc.exit_code
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        sys.stderr.write(f"passthrough-validate: error: {where}{exc.strerror or exc}\n")
        return EXIT_USAGE


def _open_root(path: str, stack: ExitStack) -> str:
    from passthrough.host.opening import open_root  # only with --host-root

    return open_root(path, stack)
