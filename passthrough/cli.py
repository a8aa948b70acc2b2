"""Command line: parse, call the library, print. No logic of its own.

Exit codes: the table in EPILOG (and README "Exit codes"), constants in errors.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from passthrough import __version__
from passthrough.errors import (
    EXIT_CHECK_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Interrupted,
    NotAHostRoot,
    PassthroughError,
    ReadOnlyRoot,
    UnknownPciDevice,
    echo,
    output_file,
)

EPILOG = """\
exit codes:
  0    ok
  1    a check, verify or validate found problems
  2    usage, input or a refusal: nothing was changed
  3    a host step failed part-way: `passthrough undo` puts back what was changed
  4    libvirt or Ansible failed underneath
  130  interrupted (Ctrl-C)
docs: README.md (JSON schema: passthrough/schemas/scan-v1.schema.json)
"""


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line, as every other input error does, and shows
    the exit-code table under every command's --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EPILOG)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:
        # argparse quotes the offending value back: keep the line short
        self.exit(EXIT_USAGE, f"passthrough: error: {echo(message, 200)} (see --help)\n")


def _positive_int(text: str) -> int:
    """A count given on purpose: 1 or more (leaving the flag out means none)."""
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number of 1 or more")
    return int(text)


def _common(p: argparse.ArgumentParser, root: bool = True) -> None:
    if root:
        p.add_argument(
            "--root",
            default="/",
            metavar="DIR",
            help="host root to read: / (live), an unpacked snapshot, a fixture, "
            "or a snapshot .tar.gz (default: /)",
        )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout, for machines")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour output (default: auto; NO_COLOR honoured)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="passthrough",
        description="GPU passthrough for KVM hosts: discover a host honestly, then prepare it.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"passthrough {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    scan = sub.add_parser(
        "scan",
        help="IOMMU groups, GPUs and a verdict with reasons for each",
        description="Read the host (never writes) and show its IOMMU groups as a tree, every GPU "
        "with the other functions of its card, and whether each can be passed through safely.",
        epilog="examples:\n  passthrough scan\n  passthrough scan --gpus-only --topology\n"
        "  passthrough scan --root host.tar.gz --json | jq '.gpus[] | {address, viable, reasons}'\n"
        "  passthrough scan 0000:01:00.0\n\n" + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(scan)
    scan.add_argument(
        "addresses", nargs="*", metavar="ADDRESS", help="only these GPUs (e.g. 01:00.0)"
    )
    scan.add_argument(
        "--gpus-only", action="store_true", help="list only the IOMMU groups that hold a GPU"
    )
    scan.add_argument(
        "--topology", action="store_true", help="also show GPUs by NUMA node with their PCIe path"
    )
    scan.add_argument(
        "--udev",
        choices=("auto", "yes", "no"),
        default="auto",
        help="enumerate PCI through pyudev (names from the hwdb); auto: on the live root only",
    )

    check = sub.add_parser(
        "check",
        help="readiness checks (PASS/WARN/FAIL, each with a fix)",
        description="Checks in the spirit of virt-host-validate plus what it misses: IOMMU "
        "enabled and grouped, interrupt remapping, kernel default vs arguments, ACS override, "
        "vfio modules, /dev/kvm, bootloader, viable GPUs. Exits 1 when any check FAILs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(check)

    snap = sub.add_parser(
        "snapshot",
        help="capture what discovery reads into a .tar.gz",
        description="Capture the attributes, links and the few proc/etc/boot files that discovery "
        "reads (no binary config space) so that `scan --root FILE` elsewhere gives the same report. "
        "Attach it to bug reports.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(snap)
    snap.add_argument("-o", "--output", required=True, metavar="FILE.tar.gz", help="where to write")

    sample = sub.add_parser(
        "sample",
        help="bundled sample hosts (build one to try the toolkit)",
        description="Sample hosts modelled on published layouts, built as real directory trees.",
        epilog="examples:\n  passthrough sample list\n  passthrough sample build hgx-h100 /tmp/hgx\n"
        "  passthrough scan --root /tmp/hgx\n\n" + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sample_sub = sample.add_subparsers(
        dest="sample_command", metavar="ACTION", parser_class=_Parser
    )
    s_list = sample_sub.add_parser("list", help="list the sample hosts")
    _common(s_list, root=False)
    s_build = sample_sub.add_parser("build", help="build a sample (or a description file) into DIR")
    s_build.add_argument("name", metavar="NAME|FILE.yaml")
    s_build.add_argument("dest", metavar="DIR")
    _common(s_build, root=False)
    s_udev = sample_sub.add_parser(
        "umockdev", help="print a built sample's PCI devices as a umockdev record"
    )
    s_udev.add_argument("name", metavar="NAME|FILE.yaml")
    s_udev.add_argument("root", metavar="BUILT_DIR")
    _common(s_udev, root=False)

    def _plan_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--gpu",
            action="append",
            default=[],
            metavar="ADDRESS|VENDOR:DEVICE",
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
        p.add_argument("--no-iommu-pt", action="store_true", help="do not add iommu=pt")
        p.add_argument(
            "--hugepages",
            type=_positive_int,
            default=0,
            metavar="N",
            help="reserve N x 1 GiB huge pages at boot (at most what the host's RAM can spare)",
        )

    plan_p = sub.add_parser(
        "plan",
        help="show the host changes (diffs, commands, reboot) without making them",
        description="Compute what preparing this host for GPU passthrough changes: kernel "
        "arguments through the bootloader in use, vfio-pci binding (modprobe.d softdeps, "
        "initramfs, per-device overrides). Writes nothing.",
        epilog="examples:\n  passthrough plan\n  passthrough plan --gpu 0000:01:00.0 --json\n"
        "  passthrough plan --root /mnt/image --gpu 10de:2684\n\n" + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(plan_p)
    _plan_opts(plan_p)
    apply_p = sub.add_parser(
        "apply",
        help="make the planned changes (atomic, backed up, journaled)",
        description="Execute the plan: lock, back up each file, journal each step before it, write "
        "atomically, run the regeneration commands. Stops at the first failure; `undo` restores. "
        "Re-running on an applied host changes nothing. Under --root, commands run through chroot "
        "when DIR is a full OS tree (and you are root), and are listed otherwise.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(apply_p)
    _plan_opts(apply_p)
    undo_p = sub.add_parser(
        "undo",
        help="return every file apply changed to its original, then regenerate",
        description="Put back the original of every file apply changed (all transactions) when it "
        "still holds what apply wrote; a file changed since loses only our own lines where they "
        "can be told apart, otherwise undo refuses (exit 2, nothing changed) and names it. "
        "Generated files (grub.cfg, initramfs images, BLS entries) are never restored from a "
        "backup: the plan's own tools run again for every kernel installed now (listed and left "
        "pending where commands cannot run). A missing backup: the rest is restored, exit 3.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(undo_p)
    undo_p.add_argument(
        "--force",
        action="store_true",
        help="put our backups back even over files changed since apply (those changes are lost)",
    )
    status_p = sub.add_parser(
        "status",
        help="what apply/undo did to this host, drift since, pending commands",
        description="The transactions in the journal (id, time, state), the files and kernel "
        "arguments each changed, whether each file still holds what apply wrote, and every "
        "command pending because it failed or could only be listed.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(status_p)
    verify_p = sub.add_parser(
        "verify",
        help="after the reboot: arguments live, IOMMU on, cards on vfio-pci",
        description="Check the running host against the last apply: kernel arguments in /proc/cmdline, "
        "IOMMU on, every function of the handed-over cards bound to vfio-pci, nothing the host "
        "needs taken. Exits 1 when a check fails.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(verify_p)

    bind_p = sub.add_parser(
        "bind",
        help="bind idle cards to vfio-pci now, without a reboot (live host)",
        description="Unbind each function of the selected cards, set driver_override=vfio-pci and "
        "re-probe, waiting for the kernel's bind event (pyudev). Refuses cards whose GPU driver is in "
        "use or that carry the host console. Not persistent: `apply` makes it stick across reboots.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(bind_p)
    _plan_opts(bind_p)
    bind_p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="wait this long for bind events",
    )

    render_p = sub.add_parser(
        "render",
        help="domain XML for a guest with the whole card(s) and the hypervisor hidden",
        description="Render libvirt domain XML (q35 + OVMF) from the host's facts: every function "
        "of each card on one guest slot behind its own pcie-root-port, KVM hidden and a Hyper-V "
        "vendor_id (on by default), a 64-bit MMIO window sized from the real BARs, vCPUs and memory "
        "on the GPUs' NUMA node. Options may come from --spec FILE.yaml (same names as the flags).",
        epilog="examples:\n  passthrough render --name gpu1 --gpu 01:00.0 -o gpu1.xml\n"
        "  passthrough render --spec vm.yaml --root snapshot.tar.gz\n"
        "  passthrough render --name win --profile windows --no-hide\n\n" + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(render_p)
    render_p.add_argument(
        "--spec", metavar="FILE.yaml", help="VM options as YAML (flags given too win)"
    )
    from passthrough.vm.options import add_flags

    add_flags(render_p)  # one flag per row of the VM options table
    render_p.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")

    from passthrough.vm.validate.main import DESCRIPTION, EXAMPLES, add_arguments

    validate_p = sub.add_parser(
        "validate",
        help="check domain XML: libvirt schema, passthrough policy, optionally libvirt",
        description=DESCRIPTION,
        epilog=EXAMPLES + "\n" + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(validate_p)
    _common(validate_p, root=False)

    vm_p = sub.add_parser("vm", help="define, start, stop, undefine and inspect guests (libvirt)")
    vm_sub = vm_p.add_subparsers(dest="vm_command", metavar="ACTION", parser_class=_Parser)
    seed = vm_sub.add_parser("seed", help="write a cloud-init seed ISO (user + SSH key) for --seed")
    seed.add_argument("--hostname", required=True)
    seed.add_argument("--user", default="passthrough", help="the guest user Ansible logs in as")
    seed.add_argument("--ssh-key", required=True, metavar="FILE.pub", help="OpenSSH public key(s)")
    seed.add_argument("-o", "--output", required=True, metavar="FILE.iso")
    _common(seed, root=False)
    for action, text in (
        ("define", "define a domain from an XML file"),
        ("start", "start a defined domain"),
        ("stop", "shut a domain down (--force: destroy)"),
        ("undefine", "undefine a stopped domain, with its NVRAM"),
        ("status", "state and live hostdevs"),
    ):
        a = vm_sub.add_parser(action, help=text)
        a.add_argument("target", metavar="FILE.xml" if action == "define" else "NAME")
        a.add_argument(
            "--connect",
            default="qemu:///system",
            metavar="URI",
            help="libvirt URI (default qemu:///system)",
        )
        if action == "define":
            a.add_argument("--start", action="store_true", help="start it too")
            a.add_argument(
                "--base-image",
                metavar="PATH",
                help="make the qcow2 overlay the XML points at on this image",
            )
        if action == "stop":
            a.add_argument(
                "--force", action="store_true", help="destroy instead of a clean shutdown"
            )
        _common(a, root=False)

    prov = sub.add_parser(
        "provision",
        help="run the playbooks (host → vm → guest) through ansible-runner",
        description="Run playbooks/site.yml (or --playbook host.yml|vm.yml|guest.yml) against an "
        "inventory through ansible-runner, with live progress, a per-host summary and the full log. "
        "Exits 1 when any host failed or was unreachable; other hosts go on (--forks).",
        epilog="examples:\n  passthrough provision -i inventory/example/hosts.yml --check --diff\n"
        "  passthrough provision -i hosts.yml --playbook host.yml --limit gpu-node-01\n"
        "  passthrough provision -i inventory/sample/hosts.yml --sample\n\n" + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prov.add_argument("-i", "--inventory", required=True, metavar="INVENTORY")
    prov.add_argument(
        "--playbook", default="site.yml", help="site.yml (default), host.yml, vm.yml or guest.yml"
    )
    prov.add_argument("--limit", metavar="PATTERN")
    prov.add_argument("--check", action="store_true", help="check mode: show, change nothing")
    prov.add_argument("--diff", action="store_true", help="show file diffs")
    prov.add_argument("--tags", metavar="TAGS")
    prov.add_argument("--forks", type=int, default=5)
    prov.add_argument("-e", "--extra-var", action="append", default=[], metavar="KEY=VALUE")
    prov.add_argument(
        "--log",
        metavar="FILE",
        help="full Ansible output (default: under ~/.local/state/passthrough/)",
    )
    prov.add_argument(
        "--sample",
        action="store_true",
        help="build the bundled sample host for inventory/sample first",
    )
    _common(prov, root=False)

    guest_p = sub.add_parser(
        "guest",
        help="inside a guest: does it see its GPU, and is the stack above it wired?",
        description="Run inside the VM (standard library only: works from a checkout with "
        "python3 and no pip). Checks the GPU's functions, BARs, driver, device nodes, kernel "
        "log, nvidia-smi, a real CUDA vector add, container runtime, CDI and Kubernetes.",
    )
    guest_sub = guest_p.add_subparsers(dest="guest_command", metavar="ACTION", parser_class=_Parser)
    g_check = guest_sub.add_parser(
        "check",
        help="PASS/WARN/FAIL/SKIP, each with a fix; exits 1 when an applicable check fails",
        epilog="examples:\n  python3 -m passthrough guest check\n"
        "  passthrough guest check --root guest.tar.gz --commands recorded/ --json\n\n" + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(g_check)
    g_check.add_argument("--no-compute", action="store_true", help="do not run the CUDA vector add")
    g_check.add_argument(
        "--commands",
        metavar="DIR",
        help="replay recorded outputs of nvidia-smi -q -x, dmesg, ... from DIR instead of "
        "running the tools (default: run them on the live root, none on a captured one)",
    )

    comp = sub.add_parser("completion", help="print a shell completion script (bash or zsh)")
    comp.add_argument("shell", choices=("bash", "zsh"))
    _common(comp, root=False)
    return parser


# -- commands ---------------------------------------------------------------------------


def _open_root(path: str, stack: list[str], changing: str | None = None) -> str:
    """A .tar.gz snapshot is unpacked to a temporary directory (removed on exit); a
    command that changes the host (``changing`` names it) refuses one."""
    if os.path.isfile(path) and path.endswith((".tar.gz", ".tgz", ".tar")):
        if changing:
            raise ReadOnlyRoot(changing, path)
        from passthrough.host.snapshot import unpack

        tmp = tempfile.mkdtemp(prefix="passthrough-root-")
        stack.append(tmp)
        return unpack(path, tmp)
    return path


def _discover(args: argparse.Namespace, stack: list[str]) -> Any:
    from passthrough.host.discover import discover

    root = _open_root(args.root, stack)
    return discover(root, pci_source=_udev_source(root, getattr(args, "udev", "auto")))


def _udev_source(root: str, use_udev: str = "auto") -> Any:
    """pyudev's enumeration on the live root (names from the hwdb), or None for the root's
    sysfs files: a fixture, a snapshot, or a live machine without pyudev (a GPU guest
    with no pip) — unless ``--udev yes`` insists on it."""
    if use_udev == "no" or (use_udev == "auto" and os.path.abspath(root) != "/"):
        return None
    try:
        import pyudev  # noqa: F401
    except ImportError:
        if use_udev == "yes":
            raise
        return None
    from passthrough.host.udev import udev_pci_source

    return udev_pci_source


def _dump(obj: object) -> None:
    # Pretty for a person at a terminal; compact (and much faster) into a pipe or file.
    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(json.dumps(obj, indent=indent) + "\n")


def cmd_scan(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.analysis.scan import Scan, analyse
    from passthrough.model import PciAddress
    from passthrough.output.json import scan_json
    from passthrough.output.text import Painter, render_scan, wants_color, write

    wanted = [PciAddress.parse(a) for a in args.addresses]
    scan = analyse(_discover(args, stack))
    if wanted:
        known = {f.address for f in scan.host.functions}
        for a in wanted:
            if a not in known:
                raise UnknownPciDevice(str(a))
        verdicts = [v for v in scan.verdicts if any(f.address in wanted for f in v.gpu.functions)]
        for a in wanted:
            if not any(a in {f.address for f in v.gpu.functions} for v in verdicts):
                raise PassthroughError(f"{a} is not a function of a GPU (see `passthrough scan`)")
        scan = Scan(host=scan.host, verdicts=verdicts, checks=scan.checks)
    if args.json:
        _dump(scan_json(scan))
    else:
        paint = Painter(wants_color(sys.stdout, args.color))
        write(
            render_scan(
                scan, paint, gpus_only=args.gpus_only or bool(wanted), topology=args.topology
            )
        )
    return EXIT_OK


def cmd_check(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.analysis.scan import analyse
    from passthrough.output.json import scan_json
    from passthrough.output.text import Painter, machine_line, render_checks, wants_color, write

    scan = analyse(_discover(args, stack))
    if args.json:
        data = scan_json(scan)
        _dump(
            {
                "schema": "passthrough.check/v1",
                "root": data["root"],
                "ok": not scan.failed,
                "virtual_machine": data["host"]["virtual_machine"],
                "checks": data["checks"],
            }
        )
    else:
        paint = Painter(wants_color(sys.stdout, args.color))
        if scan.host.machine.guest:
            write(machine_line(scan, paint) + "\n")
        write(render_checks(scan.checks, paint))
    return EXIT_CHECK_FAILED if scan.failed else EXIT_OK


def cmd_snapshot(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.host.discover import discover
    from passthrough.host.snapshot import RecordingRoot, write_snapshot

    root_path = _open_root(args.root, stack)
    recorder: list[RecordingRoot] = []

    def factory(path: str) -> RecordingRoot:
        r = RecordingRoot(path)
        recorder.append(r)
        return r

    source = _udev_source(root_path)
    host = discover(root_path, pci_source=source, root_factory=factory)
    if source is not None:
        # pyudev read the PCI tree behind the recorder's back: read it again through it.
        from passthrough.host.discover import root_pci_source

        root_pci_source(recorder[0])
    stats = write_snapshot(recorder[0], host, output_file(args.output))
    if args.json:
        _dump({"output": args.output, **stats})
    else:
        print(
            f"wrote {args.output}: {stats['files']} files, {stats['links']} links "
            f"({len(host.functions)} PCI functions)"
        )
    return EXIT_OK


def cmd_guest(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.guest.check import FAIL, WARN, render, run_guest_checks
    from passthrough.guest.root import GuestRoot, find_root
    from passthrough.guest.runner import runner_for
    from passthrough.output.text import Painter, wants_color

    if args.guest_command is None:
        raise PassthroughError("guest: say which action (check); see --help")
    if not os.path.exists(args.root):
        raise NotAHostRoot(args.root, "no such file or directory")
    path = _open_root(args.root, stack)
    if not os.path.isdir(path):
        raise NotAHostRoot(args.root, "neither a directory nor a .tar.gz")
    root = GuestRoot(find_root(path))
    if not root.isdir("sys") and not root.isdir("proc"):
        raise NotAHostRoot(args.root, "does not look like a guest root (no sys, no proc)")
    if args.commands is not None and not os.path.isdir(args.commands):
        raise PassthroughError(f"--commands {args.commands}: not a directory")
    runner = runner_for(root.is_live, args.commands)
    report = run_guest_checks(root, runner, compute=not args.no_compute)
    if args.json:
        _dump(report.to_json())
    else:
        painter = Painter(wants_color(sys.stdout, args.color))
        styles = {FAIL: "red", WARN: "yellow", "PASS": "green", "SKIP": "dim"}
        print(render(report, lambda text, level: painter(text, styles[level], "bold")))
    return EXIT_CHECK_FAILED if report.failed else EXIT_OK


def cmd_sample(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough import fakehost

    action = args.sample_command
    if action in (None, "list"):
        rows = []
        for name in fakehost.sample_names():
            desc = fakehost.load(name)
            rows.append({"name": name, "description": str(desc.data.get("description", ""))})
        if getattr(args, "json", False):
            _dump(rows)
        else:
            width = max(len(r["name"]) for r in rows)
            for r in rows:
                print(f"{r['name']:<{width}}  {r['description']}")
        return EXIT_OK
    desc = fakehost.load(args.name)
    if action == "build":
        out = fakehost.build(desc, args.dest)
        if args.json:
            _dump({"name": desc.name, "root": str(out), "pci_functions": len(desc.nodes)})
        else:
            print(
                f"built {desc.name} in {out} ({len(desc.nodes)} PCI functions); try: passthrough scan --root {out}"
            )
        return EXIT_OK
    sys.stdout.write(fakehost.umockdev_record(desc, __import__("pathlib").Path(args.root)))
    return EXIT_OK


def cmd_completion(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.completion import script

    sys.stdout.write(script(build_parser(), args.shell))
    return EXIT_OK


def _plan(
    args: argparse.Namespace, stack: list[str], changing: str | None = None
) -> tuple[Any, Any, Any]:
    from passthrough.host.discover import discover
    from passthrough.host.root import HostRoot
    from passthrough.plan.build import PlanOptions, make_plan

    root_path = _open_root(args.root, stack, changing)
    host = discover(root_path)
    root = HostRoot(root_path)
    opts = PlanOptions(
        gpus=tuple(args.gpu),
        include_group=args.include_group,
        allow_boot_gpu=args.allow_boot_gpu,
        iommu_pt=not args.no_iommu_pt,
        hugepages_1g=args.hugepages,
    )
    plan, _sel = make_plan(root, host, opts)
    return root, host, plan


def cmd_plan(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.plan.actions import plan_json, plan_text

    root, _host, plan = _plan(args, stack)
    if args.json:
        _dump(plan_json(plan, root))
    else:
        print(plan_text(plan, root))
    return EXIT_OK


def _progress(args: argparse.Namespace) -> Callable[[str], None]:
    def say(message: str) -> None:
        if not args.json:
            sys.stderr.write(f"  · {message}\n")

    return say


def cmd_apply(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.execute.apply import apply, command_mode
    from passthrough.execute.status import status

    root, _host, plan = _plan(args, stack, changing="apply")
    tx = apply(root, plan, plan.record(), progress=_progress(args))
    steps = tx.steps if tx else []
    listed = [s for s in steps if s.state.value == "listed"]
    # nothing to do here, but commands an earlier apply could only list are still owed
    owed = [p.argv for p in status(root).pending] if tx is None else []
    if args.json:
        _dump(
            {
                "changed": tx is not None,
                "reboot_required": plan.reboot,
                "transaction": tx.id if tx else None,
                "steps": [s.to_json() for s in steps],
                "commands_not_run": [s.argv for s in listed],
                "pending": owed,
            }
        )
        return EXIT_OK
    if tx is None:
        print("Nothing to do: the host already matches the plan.")
        for argv in owed:
            print("  still pending (run it inside the root): " + " ".join(argv))
        return EXIT_OK
    print(f"Applied {len(steps)} steps (transaction {tx.id}).")
    if listed:
        print(
            f"Not run ({command_mode(root)} mode: --root is not a full OS tree, or not root): run them inside it:"
        )
        for s in listed:
            print("  " + " ".join(s.argv))
    print("Reboot, then run `passthrough verify`." if plan.reboot else "No reboot required.")
    return EXIT_OK


def cmd_undo(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.execute.undo import undo
    from passthrough.host.root import HostRoot

    root = HostRoot(_open_root(args.root, stack, changing="undo"))
    result = undo(root, progress=_progress(args), force=args.force)
    listed = [s.argv for s in result.commands if s.state.value == "listed"]
    if args.json:
        _dump(
            {
                "restored": ["/" + p for p in result.restored],
                "unpicked": ["/" + p for p in result.unpicked],
                "forced": ["/" + p for p in result.forced],
                "commands": [s.to_json() for s in result.commands],
                "commands_not_run": listed,
            }
        )
    elif result.changed or result.commands:
        parts = [f"Restored {len(result.restored)} files"]
        if result.unpicked:
            parts.append(f"took our lines out of {len(result.unpicked)} changed since apply")
        if result.forced:
            parts.append(f"put {len(result.forced)} back over later changes (--force)")
        print("; ".join(parts) + ". Reboot to return to the original kernel arguments and drivers.")
        for argv in listed:
            print("  pending, run it inside the root: " + " ".join(argv))
    else:
        print("Nothing to undo.")
    return EXIT_OK


def cmd_status(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.execute.status import status, status_json, status_text
    from passthrough.host.root import HostRoot

    report = status(HostRoot(_open_root(args.root, stack)))
    if args.json:
        _dump(status_json(report))
    else:
        print(status_text(report))
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.execute.verify import verify
    from passthrough.host.discover import discover
    from passthrough.host.root import HostRoot
    from passthrough.model import Level
    from passthrough.output.text import Painter, render_checks, wants_color

    root_path = _open_root(args.root, stack)
    results = verify(HostRoot(root_path), discover(root_path))
    failed = any(r.level is Level.FAIL for r in results)
    if args.json:
        _dump(
            {
                "schema": "passthrough.execute.verify/v1",
                "ok": not failed,
                "checks": [
                    {"id": r.id, "level": r.level.value, "summary": r.summary, "fix": r.fix}
                    for r in results
                ],
            }
        )
    else:
        print(render_checks(results, Painter(wants_color(sys.stdout, args.color))))
    return EXIT_CHECK_FAILED if failed else EXIT_OK


def cmd_bind(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.analysis.viability import judge_all
    from passthrough.execute.bind import bind_now
    from passthrough.host.discover import discover
    from passthrough.host.root import HostRoot
    from passthrough.plan.select import select

    root_path = _open_root(args.root, stack, changing="bind")
    host = discover(root_path)
    sel = select(host, judge_all(host), list(args.gpu), args.include_group, args.allow_boot_gpu)
    bound = bind_now(
        HostRoot(root_path), host, sel.functions, args.timeout, progress=_progress(args)
    )
    if args.json:
        _dump({"bound": bound, "functions": [str(f.address) for f in sel.functions]})
    elif bound:
        print(
            f"Bound to vfio-pci: {', '.join(bound)} (until reboot; `passthrough apply` makes it persistent)"
        )
    else:
        print("Already on vfio-pci: nothing to do.")
    return EXIT_OK


def _vm_options(args: argparse.Namespace) -> Any:
    from passthrough.vm.options import from_flags
    from passthrough.vm.spec import VmOptions
    from passthrough.vm.specfile import load_spec_file

    values: dict[str, Any] = load_spec_file(args.spec) if args.spec else {}
    values.update(from_flags(args))  # flags given too win
    if "name" not in values:
        raise PassthroughError("render: a domain name is needed (--name, or name: in --spec)")
    return VmOptions(**values)


def cmd_render(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.host.discover import discover
    from passthrough.vm.render import render
    from passthrough.vm.spec import build_spec

    if args.output:
        output_file(args.output)
    opts = _vm_options(args)
    spec = build_spec(discover(_open_root(args.root, stack)), opts)
    xml = render(spec)
    for w in spec.warnings:
        sys.stderr.write(f"passthrough: warning: {w}\n")
    layout = spec.layout.as_json() if spec.layout else None
    if layout and not args.json:
        for line in layout["decisions"]:  # the address planner's reasons, beside the XML
            sys.stderr.write(f"passthrough: layout: {line}\n")
    if args.output:
        from passthrough.execute.files import atomic_write

        atomic_write(os.path.abspath(args.output), xml.encode())
        if not args.json:
            print(
                f"wrote {args.output} ({spec.name}: {sum(len(c.functions) for c in spec.cards)} hostdevs)"
            )
    if args.json:
        _dump(
            {
                "name": spec.name,
                "xml": xml,
                "warnings": list(spec.warnings),
                "output": args.output,
                "layout": layout,
            }
        )
    elif not args.output:
        sys.stdout.write(xml)
    return EXIT_OK


def cmd_validate(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.vm.validate.main import run

    return run(args, lambda path: _open_root(path, stack))


def cmd_vm(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.vm import libvirt_ops as lv

    action = args.vm_command
    if action is None:
        raise PassthroughError("vm: an action is needed (define, start, stop, undefine, status)")
    if action == "seed":
        from passthrough.vm.seed import write_seed

        write_seed(output_file(args.output), args.hostname, args.user, args.ssh_key)
        if args.json:
            _dump({"seed": args.output, "user": args.user})
        else:
            print(
                f"wrote {args.output} (cloud-init NoCloud: user {args.user}, host {args.hostname})"
            )
        return EXIT_OK
    uri = args.connect
    if action == "define":
        from lxml import etree

        try:
            with open(args.target, "rb") as fh:
                data = fh.read()
            doc = etree.fromstring(data)
        except OSError as exc:
            raise PassthroughError(f"{echo(args.target)}: {exc.strerror}") from None
        except etree.XMLSyntaxError as exc:
            raise PassthroughError(f"{echo(args.target)}: not well-formed XML ({exc})") from None
        name = doc.findtext("name") or ""
        overlay = None
        if args.base_image:
            disk = doc.find("devices/disk[@device='disk']/source")
            if disk is None or not disk.get("file"):
                raise PassthroughError(f"{args.target}: no disk source for the overlay")
            if not os.path.exists(args.base_image):
                raise PassthroughError(f"--base-image {args.base_image}: does not exist")
            overlay = (args.base_image, str(disk.get("file")))
        result = lv.define(uri, data.decode(), name, overlay, start_it=args.start)
    elif action == "start":
        lv.start(uri, args.target)
        result = lv.status(uri, args.target)
    elif action == "stop":
        lv.stop(uri, args.target, force=args.force)
        result = lv.status(uri, args.target)
    elif action == "undefine":
        lv.undefine(uri, args.target)
        result = {"name": args.target, "uri": uri, "state": "undefined"}
    else:
        result = lv.status(uri, args.target)
    if args.json:
        _dump(result)
    else:
        print(f"{result['name']} on {uri}: {result['state']}")
        for h in result.get("hostdevs", []):
            print(f"  hostdev {h['host']} → guest {h['guest'] or '?'}")
    return EXIT_OK


def cmd_provision(args: argparse.Namespace, stack: list[str]) -> int:
    import time

    from passthrough.provision.runner import ProvisionFailed, run, summary_table

    extravars: dict[str, Any] = {}
    for item in args.extra_var:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PassthroughError(f"-e '{echo(item)}': expected KEY=VALUE")
        extravars[key] = value
    if args.sample:
        from passthrough import fakehost

        tmp = tempfile.mkdtemp(prefix="passthrough-sample-")
        stack.append(tmp)
        root = fakehost.build(fakehost.load("hgx-h100"), os.path.join(tmp, "hgx-h100"))
        os.environ["PASSTHROUGH_SAMPLE_ROOT"] = str(root)
    log = (args.log and output_file(args.log, "--log")) or os.path.join(
        os.path.expanduser("~/.local/state/passthrough"),
        time.strftime("provision-%Y%m%dT%H%M%S.log"),
    )

    def say(message: str) -> None:
        if not args.json:
            sys.stderr.write(message + "\n")

    result = run(
        args.inventory,
        args.playbook,
        args.limit,
        args.check,
        args.diff,
        args.tags,
        args.forks,
        extravars,
        progress=say,
        log_path=log,
    )
    if args.json:
        _dump(
            {
                "ok": result.ok,
                "status": result.status,
                "rc": result.rc,
                "log": result.log,
                "seconds": round(result.seconds, 1),
                "hosts": {
                    h.name: {
                        "status": h.status,
                        "ok": h.ok,
                        "changed": h.changed,
                        "failed": h.failed,
                        "unreachable": h.unreachable,
                        "reason": h.reason,
                    }
                    for h in result.hosts.values()
                },
            }
        )
    else:
        print(summary_table(result))
        print(
            f"\n{'ok' if result.ok else 'FAILED'} in {result.seconds:.1f}s · full log: {result.log}"
        )
    if not result.ok:
        if args.json:
            return ProvisionFailed.exit_code
        failed = [h.name for h in result.hosts.values() if h.failed or h.unreachable] or [
            "(playbook)"
        ]
        raise ProvisionFailed(
            f"{', '.join(sorted(failed))} failed (status {result.status}, rc {result.rc}); see the log"
        )
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
    "scan": cmd_scan,
    "check": cmd_check,
    "snapshot": cmd_snapshot,
    "plan": cmd_plan,
    "apply": cmd_apply,
    "undo": cmd_undo,
    "status": cmd_status,
    "verify": cmd_verify,
    "bind": cmd_bind,
    "render": cmd_render,
    "validate": cmd_validate,
    "vm": cmd_vm,
    "provision": cmd_provision,
    "sample": cmd_sample,
    "guest": cmd_guest,
    "completion": cmd_completion,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    stack: list[str] = []
    try:
        code = COMMANDS[args.command](args, stack)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except PassthroughError as exc:
        if getattr(args, "debug", False):
            raise
        sys.stderr.write(f"passthrough: error: {exc}\n")
        return exc.exit_code
    except BrokenPipeError:
        # The reader stopped reading (`| head`): not an error. Point stdout at devnull so
        # the interpreter's final flush cannot fail again (the Python docs' advice).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        if getattr(args, "debug", False):
            raise
        where = f"{echo(exc.filename)}: " if exc.filename else ""
        sys.stderr.write(f"passthrough: error: {where}{exc.strerror or exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write(f"passthrough: error: {Interrupted()}\n")
        return EXIT_INTERRUPTED
    finally:
        for tmp in stack:
            shutil.rmtree(tmp, ignore_errors=True)
