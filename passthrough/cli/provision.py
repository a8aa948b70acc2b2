# SPDX-License-Identifier: Apache-2.0
"""``passthrough provision``: the playbooks (host → vm → guest) through ansible-runner."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack

from passthrough.cli.common import Subparsers, command, common, dump, examples, progress
from passthrough.errors import EXIT_OK, PassthroughError, output_file


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "provision",
        run,
        description="Run playbooks/site.yml (or --playbook host.yml|vm.yml|guest.yml) against an "
        "inventory through ansible-runner, with live progress (a line per batch of the rolling "
        "host play and per host), a per-host summary (what happened to each host: unchanged, "
        "applied, reboot pending, verified, skipped, not started, failed; the canary's proof and "
        "the policy warnings below it) and the full log (0600). The rolling play's settings "
        "(passthrough_canary, passthrough_batch, passthrough_max_fail_percentage) are read from "
        "the inventory, group_vars, host_vars and -e, and every rollout setting is checked before "
        "anything runs (exit 2 naming a bad one). Ansible's configuration is yours: "
        "$ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg or /etc/ansible/ansible.cfg, as Ansible "
        "finds it; the playbooks' own only where you have none. Exit codes: 0 every host ok; "
        "2 bad input (missing inventory, playbook or -e file, a bad rollout setting; nothing ran); "
        "4 a host failed or "
        "was unreachable, or Ansible failed (host.yml stops at the first batch with a failed host: "
        "-e passthrough_max_fail_percentage=N); 130 interrupted.",
        epilog=examples(
            "passthrough provision -i inventory/example/hosts.yml --check --diff",
            "passthrough provision -i hosts.yml --playbook host.yml --limit gpu-node-01",
            "passthrough provision -i hosts.yml -e @fleet.yml -e '{\"passthrough_reboot_ok\": true}'",
            "passthrough provision -i inventory/sample/hosts.yml --sample",
        ),
    )
    p.add_argument("-i", "--inventory", required=True, metavar="INVENTORY")
    p.add_argument(
        "--playbook", default="site.yml", help="site.yml (default), host.yml, vm.yml or guest.yml"
    )
    p.add_argument("--limit", metavar="PATTERN")
    p.add_argument("--check", action="store_true", help="check mode: show, change nothing")
    p.add_argument("--diff", action="store_true", help="print file and domain diffs (stdout)")
    p.add_argument("--tags", metavar="TAGS")
    p.add_argument("--forks", type=int, default=5)
    p.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        default=[],
        metavar="VARS",
        help="as ansible-playbook takes them: KEY=VALUE ..., @FILE (YAML/JSON) or JSON; repeatable",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="Ansible's verbosity (-v … -vvvv); its own output replaces the progress lines",
    )
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


SAMPLE_ENV = "PASSTHROUGH_SAMPLE_ROOT"


def _needs_sample(inventory: str) -> None:
    """inventory/sample drives a sample host built at run time; without --sample (or the
    variable it sets) say so, before Ansible fails on an empty root."""
    from passthrough.inputs import read_head

    # non-blocking: a FIFO named as the inventory must not hang us (Ansible names it then)
    head = read_head(inventory, 1 << 20)
    if head is None:
        return  # a directory or a missing file: the runner's own checks name it
    text = head.decode("utf-8", "replace")
    if SAMPLE_ENV in text and not os.environ.get(SAMPLE_ENV):
        raise PassthroughError(
            f"{inventory} drives the bundled sample host, built at run time: add --sample "
            f"(or set {SAMPLE_ENV} to a root from `passthrough sample build hgx-h100 DIR`)"
        )


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.provision.runner import ProvisionFailed, run, summary_table
    from passthrough.provision.settings import extra_vars

    extra = extra_vars(args.extra_vars)
    env: dict[str, str] = {}
    if not args.sample:
        _needs_sample(args.inventory)
    else:
        import shutil
        import tempfile

        from passthrough import fakehost

        tmp = tempfile.mkdtemp(prefix="passthrough-sample-")
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        root = fakehost.build(fakehost.load("hgx-h100"), os.path.join(tmp, "hgx-h100"))
        env[SAMPLE_ENV] = str(root)  # inventory/sample reads it (env lookup)
    if args.playbook in ("host.yml", "site.yml"):  # the rolling play: its settings checked
        from passthrough.provision.fleetvars import extra_values, inventory_hosts, resolve

        settings = resolve(inventory_hosts(args.inventory, env), extra_values(args.extra_vars))
        extra += ["-e", json.dumps(settings)]  # Ansible reads a play's serial from -e only
    log = (args.log and output_file(args.log, "--log")) or _default_log()
    result = run(
        args.inventory,
        args.playbook,
        args.limit,
        args.check,
        args.diff,
        args.tags,
        args.forks,
        progress=progress(args, prefix=""),
        log_path=log,
        env=env,
        extra=extra,
        verbosity=args.verbose,
        show=_show(args),
    )
    if args.json:
        dump(result.to_json(), "provision")
        return EXIT_OK if result.ok else ProvisionFailed.exit_code
    print(summary_table(result))
    print(f"\n{'ok' if result.ok else 'FAILED'} in {result.seconds:.1f}s · full log: {result.log}")
    if not result.ok:
        raise result.failure()
    return EXIT_OK


def _show(args: argparse.Namespace) -> Callable[[str], None]:
    """Diffs on stdout, as ansible-playbook prints them; on stderr under --json."""

    def show(text: str) -> None:
        print(text, file=sys.stderr if args.json else sys.stdout, flush=True)

    return show


def _default_log() -> str:
    """~/.local/state/passthrough/provision-TIME.log; the folder is ours: 0700, even where an
    older version made it 0755 (the logs may carry what a task printed)."""
    folder = os.path.expanduser("~/.local/state/passthrough")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    return os.path.join(folder, time.strftime("provision-%Y%m%dT%H%M%S.log"))
