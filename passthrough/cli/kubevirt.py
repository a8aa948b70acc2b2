# SPDX-License-Identifier: Apache-2.0
"""``passthrough kubevirt``: the same cards, options and policy as ``render``, for a cluster —
manifests (KubeVirt device-plugin route or NVIDIA's DRA driver), their validation, and the
node preflight that decides the passthrough label."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import ExitStack

from passthrough.cli.common import (
    Parser,
    Subparsers,
    command,
    common,
    dump,
    examples,
    note,
    once,
    open_root,
    warn,
)
from passthrough.errors import EXIT_CHECK_FAILED, EXIT_OK, count, output_file


def add_parser(sub: Subparsers) -> None:
    from passthrough.pciaddr import CARD_METAVAR

    p = command(
        sub,
        "kubevirt",
        run,
        description="The cluster path for the same host facts as `render`: a KubeVirt CR patch "
        "(permittedHostDevices for every function of each card) and a VirtualMachine, or with "
        "--route dra a ResourceClaimTemplate on vfio.gpu.nvidia.com; `validate` checks such "
        "manifests against each other and the host; `preflight` says whether a node may be "
        "labelled for passthrough VMs.",
        epilog=examples(
            "passthrough kubevirt render --name gpu-vm --gpu 01:00.0 -o gpu-vm.yaml",
            "passthrough kubevirt render --name h100 --route dra --per-card --memory 64G",
            "passthrough kubevirt validate gpu-vm.yaml --root /",
            "passthrough kubevirt preflight --json",
        ),
    )
    actions = p.add_subparsers(dest="kubevirt_command", metavar="ACTION", parser_class=Parser)
    render = actions.add_parser(
        "render",
        help="KubeVirt CR patch, VirtualMachine(s), claims",
        epilog=examples(
            "passthrough kubevirt render --root /tmp/hgx --name gpu-vm --gpu 18:00.0 -o gpu-vm.yaml",
            "passthrough kubevirt render --root /tmp/hgx --name h100 --route dra --per-card",
        ),
    )
    _render_flags(render)
    validate = actions.add_parser(
        "validate",
        help="check manifests against each other (and a host with --root)",
        epilog=examples(
            "passthrough kubevirt validate gpu-vm.yaml",
            "passthrough kubevirt validate gpu-vm.yaml --root /tmp/hgx --json",
        ),
    )
    validate.add_argument("files", nargs="+", metavar="FILE.yaml")
    common(
        validate,
        root="host root whose cards the VMs take (companion functions checked); default: none",
    )
    validate.set_defaults(root=None)
    pre = actions.add_parser(
        "preflight",
        help="may this node be labelled for passthrough VMs?",
        epilog=examples(
            "passthrough kubevirt preflight",
            "passthrough kubevirt preflight --root /tmp/hgx --gpu 18:00.0 --memory 64G --json",
        ),
    )
    common(pre)
    pre.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar=CARD_METAVAR,
        help="a card (repeatable); default: every NVIDIA GPU",
    )
    pre.add_argument(
        "--nvswitch",
        action="append",
        default=[],
        metavar="all|ADDRESS",
        help="an NVSwitch the VM takes with every GPU, or 'all' (repeatable): the NVSwitches "
        "are checked as cards too (on vfio-pci, their IOMMU groups); a partial selection is "
        "refused (default: the NVSwitches stay with the host's Fabric Manager)",
    )
    pre.add_argument(
        "--memory", default="8G", help="guest memory the large-BAR fit assumes (default: 8G)"
    )
    pre.add_argument(
        "--route",
        choices=("device-plugin", "plugin", "dra"),
        default="device-plugin",
        help="the cluster's route, checked by its own rules: device-plugin (plugin; default: "
        "every card on vfio-pci, then the GPU Operator's mode label) or dra (NVIDIA's DRA "
        "driver: the cards stay on nvidia, which it moves to vfio-pci itself; no label)",
    )


def _render_flags(render: Parser) -> None:
    from passthrough.kube import KUBE_LEAVES_OUT, PROVIDERS, ROUTES
    from passthrough.vm.options import add_flags

    common(render)
    render.add_argument("--spec", metavar="FILE.yaml", help="VM options as YAML (flags win)")
    add_flags(
        render, KUBE_LEAVES_OUT
    )  # only the flags it takes: KubeVirt has no field for the rest
    render.add_argument(
        "--route",
        choices=ROUTES,
        default="device-plugin",
        help="how the GPUs reach the VM (default: device-plugin)",
    )
    render.add_argument(
        "--provider",
        choices=PROVIDERS,
        default="nvidia",
        help="device-plugin route: who publishes the PCI resources (nvidia: GPU Operator / kubevirt-gpu-device-plugin; kubevirt: KubeVirt's own)",
    )
    render.add_argument(
        "--per-card", action="store_true", help="one VM per card instead of one VM with all of them"
    )
    render.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    render.add_argument(
        "--vgpu",
        action="append",
        default=[],
        metavar="VF|UUID",
        help="a vGPU for the VM: its permittedHostDevices entry (mediatedDevices for an mdev, "
        "pciHostDevices for a vendor-VFIO VF) and a gpus entry (repeat for more)",
    )


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    action = args.kubevirt_command
    if action == "render":
        return _render(args, stack)
    if action == "validate":
        return _validate(args, stack)
    if action == "preflight":
        return _preflight(args, stack)
    from passthrough.errors import EXIT_USAGE

    sys.stderr.write(
        "passthrough: error: kubevirt needs an action: render, validate or preflight\n"
    )
    return EXIT_USAGE


def _render(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.cli.render import vm_options
    from passthrough.host.discover import discover
    from passthrough.kube.build import build_manifests
    from passthrough.kube.io import dump_stream

    if args.output:
        output_file(args.output)
    host = discover(open_root(args.root, stack))
    options = vm_options(args)
    if options.no_gpu and args.vgpu:  # vGPUs only: the KubeVirt patch for them, no card
        from passthrough.kube.build import Manifests

        out = Manifests()
    else:
        out = build_manifests(host, options, args.route, args.provider, args.per_card)
    if args.vgpu:
        from passthrough.cli.vgpu import kube_vgpus

        kube_vgpus(out, host, args.vgpu)
    text = dump_stream(out.documents, out.header(args.route))
    for w in once(out.warnings):
        warn(w)
    for line in out.decisions:
        note(args, f"layout: {line}")
    if args.output:
        from passthrough.journal.files import atomic_write

        atomic_write(os.path.abspath(args.output), text.encode())
    if args.json:
        dump({**out.as_json(), "output": args.output}, "kubevirt-render")
    elif args.output:
        print(f"wrote {args.output} ({count(len(out.documents), 'object')})")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _validate(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.kube.check import check_manifests
    from passthrough.kube.io import load_stream
    from passthrough.model import Severity

    docs = [d for path in args.files for d in load_stream(path)]
    host = None
    if args.root is not None:
        from passthrough.host.discover import discover

        host = discover(open_root(args.root, stack))
    findings = check_manifests(docs, host)
    failed = any(f.severity is Severity.ERROR for f in findings)
    if args.json:
        dump(
            {
                "ok": not failed,
                "documents": len(docs),
                "findings": [
                    {"code": f.code, "severity": f.severity.value, "message": f.message}
                    for f in findings
                ],
            },
            "kubevirt-validate",
        )
    else:
        for f in findings:
            print(f"{f.severity.value.upper()}: {f.message} [{f.code}]")
        print(
            f"{count(len(docs), 'object')}, {count(len(findings), 'finding')}"
            + (": FAILED" if failed else ": ok")
        )
    return EXIT_CHECK_FAILED if failed else EXIT_OK


def _preflight(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.host.discover import discover
    from passthrough.kube.preflight import preflight
    from passthrough.output.text import Painter, render_checks, wants_color, write
    from passthrough.vm.options import BY_NAME, check, size_mib

    # the range render holds --memory to (a guest of 0 MiB fits every card and means nothing)
    memory = check(BY_NAME["memory_mib"], size_mib(args.memory, "--memory"), "--memory")
    route = "device-plugin" if args.route == "plugin" else args.route
    host = discover(open_root(args.root, stack))
    report = preflight(host, tuple(args.gpu), memory, route, tuple(args.nvswitch))
    if args.json:
        dump(report.as_json(), "kubevirt-preflight")
    else:
        write(render_checks(report.checks, Painter(wants_color(sys.stdout, args.color))) + "\n")
    return EXIT_OK if report.ok else EXIT_CHECK_FAILED
