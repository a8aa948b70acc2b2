"""``passthrough provision``: the playbooks (host → vm → guest) through ansible-runner."""

from __future__ import annotations

import argparse
import os
import time

from passthrough.cli.common import Subparsers, command, common, dump, examples, progress
from passthrough.errors import EXIT_OK, PassthroughError, echo, output_file


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "provision",
        run,
        help="run the playbooks (host → vm → guest) through ansible-runner",
        description="Run playbooks/site.yml (or --playbook host.yml|vm.yml|guest.yml) against an "
        "inventory through ansible-runner, with live progress, a per-host summary and the full "
        "log. Exits 1 when any host failed or was unreachable; other hosts go on (--forks).",
        epilog=examples(
            "passthrough provision -i inventory/example/hosts.yml --check --diff",
            "passthrough provision -i hosts.yml --playbook host.yml --limit gpu-node-01",
            "passthrough provision -i inventory/sample/hosts.yml --sample",
        ),
    )
    p.add_argument("-i", "--inventory", required=True, metavar="INVENTORY")
    p.add_argument(
        "--playbook", default="site.yml", help="site.yml (default), host.yml, vm.yml or guest.yml"
    )
    p.add_argument("--limit", metavar="PATTERN")
    p.add_argument("--check", action="store_true", help="check mode: show, change nothing")
    p.add_argument("--diff", action="store_true", help="show file diffs")
    p.add_argument("--tags", metavar="TAGS")
    p.add_argument("--forks", type=int, default=5)
    p.add_argument("-e", "--extra-var", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--log",
        metavar="FILE",
        help="full Ansible output (default: under ~/.local/state/passthrough/)",
    )
    p.add_argument(
        "--sample",
        action="store_true",
        help="build the bundled sample host for inventory/sample first",
    )
    common(p, root=None)


def _extravars(items: list[str]) -> dict[str, str]:
    extravars: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PassthroughError(f"-e '{echo(item)}': expected KEY=VALUE")
        extravars[key] = value
    return extravars


def run(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.provision.runner import ProvisionFailed, run, summary_table

    extravars = _extravars(args.extra_var)
    env: dict[str, str] = {}
    if args.sample:
        import tempfile

        from passthrough import fakehost

        tmp = tempfile.mkdtemp(prefix="passthrough-sample-")
        stack.append(tmp)
        root = fakehost.build(fakehost.load("hgx-h100"), os.path.join(tmp, "hgx-h100"))
        env["PASSTHROUGH_SAMPLE_ROOT"] = str(root)  # inventory/sample reads it (env lookup)
    log = (args.log and output_file(args.log, "--log")) or os.path.join(
        os.path.expanduser("~/.local/state/passthrough"),
        time.strftime("provision-%Y%m%dT%H%M%S.log"),
    )
    result = run(
        args.inventory,
        args.playbook,
        args.limit,
        args.check,
        args.diff,
        args.tags,
        args.forks,
        extravars,
        progress=progress(args, prefix=""),
        log_path=log,
        env=env,
    )
    if args.json:
        dump(result.to_json(), "provision")
        return EXIT_OK if result.ok else ProvisionFailed.exit_code
    print(summary_table(result))
    print(f"\n{'ok' if result.ok else 'FAILED'} in {result.seconds:.1f}s · full log: {result.log}")
    if not result.ok:
        raise result.failure()
    return EXIT_OK
