# SPDX-License-Identifier: Apache-2.0
"""Output for people: trees and tables, coloured when the terminal wants colour."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from passthrough.analysis.checks import guest_without_iommu
from passthrough.analysis.scan import Scan
from passthrough.errors import count
from passthrough.inert import RESET, STYLES
from passthrough.model import CheckResult, GpuVerdict, Level, PciAddress, PciFunction, Severity
from passthrough.pciclass import CLASS_WORDS
from passthrough.units import format_size


def wants_color(stream: TextIO, setting: str = "auto") -> bool:
    if setting == "always":
        return True
    if setting == "never" or os.environ.get("NO_COLOR"):
        return False
    return stream.isatty() and os.environ.get("TERM") != "dumb"


class Painter:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        return "".join(STYLES[s] for s in styles) + text + RESET


LEVEL_STYLE = {
    Level.PASS: "green",
    Level.WARN: "yellow",
    Level.FAIL: "red",
    Level.SKIP: "dim",
    Level.INFO: "cyan",
}


def _fn_line(f: PciFunction) -> str:
    kind = CLASS_WORDS.get(f.subclass, f"class {f.class_hex}")
    driver = f"  [{f.driver}]" if f.driver else ""
    return f"{f.address} {f.id} {kind}: {f.name}{driver}"


def render_checks(checks: list[CheckResult], paint: Painter) -> str:
    width = max(len(c.id) for c in checks)
    lines = []
    for c in checks:
        level = paint(f"{c.level.value:4}", LEVEL_STYLE[c.level], "bold")
        lines.append(f"{level}  {c.id:<{width}}  {c.summary}")
        if c.fix and c.level is not Level.PASS:
            lines.append(f"      {'':<{width}}  {paint('fix:', 'cyan')} {c.fix}")
    fails = sum(c.level is Level.FAIL for c in checks)
    warns = sum(c.level is Level.WARN for c in checks)
    skips = sum(c.level is Level.SKIP for c in checks)
    infos = sum(c.level is Level.INFO for c in checks)
    passes = len(checks) - fails - warns - skips - infos
    lines.append("")
    lines.append(
        f"{passes} passed, {count(warns, 'warning')}, {fails} failed"
        + (f", {infos} for information" if infos else "")
        + (f", {skips} not applicable" if skips else "")
    )
    return "\n".join(lines)


def render_host(scan: Scan, paint: Painter) -> str:
    h = scan.host
    iommu = (
        f"IOMMU on, {h.iommu.groups} groups"
        if h.iommu.groups
        else paint("IOMMU off (no groups)", "red")
    )
    ir = {
        True: "interrupt remapping on",
        False: "interrupt remapping off",
        None: "interrupt remapping ?",
    }[h.iommu.interrupt_remapping]
    virt = {"vmx": "VT-x", "svm": "AMD-V", None: "no VT-x/AMD-V"}[h.cpu.virt_flag]
    product = " ".join(x for x in (h.dmi.sys_vendor, h.dmi.product_name) if x) or "unknown machine"
    lines = [
        f"{paint('Host', 'bold')}     {product} · {h.distro.pretty_name or h.distro.id or 'unknown distro'}"
        f" · kernel {h.kernel.release or '?'}",
        f"{paint('CPU', 'bold')}      {h.cpu.model or '?'} ({virt}) · {iommu} · {ir}",
        f"{paint('Boot', 'bold')}     {'UEFI' if h.boot.uefi else 'BIOS'} · bootloader {h.boot.bootloader.value}"
        f" · initramfs {h.boot.initramfs.value}",
        f"{paint('Keeps', 'bold')}    root {h.critical.root_device or '?'} on "
        f"{', '.join(map(str, h.critical.root_pci)) or '?'} · default route {h.critical.default_nic or '-'}"
        f" on {', '.join(map(str, h.critical.nic_pci)) or '-'}",
    ]
    if h.machine.guest:
        lines.append(machine_line(scan, paint))
    return "\n".join(lines)


def machine_line(scan: Scan, paint: Painter) -> str:
    """Says the root is a virtual machine, on what evidence, and what that means here."""
    m = scan.host.machine
    name = f" ({m.hypervisor})" if m.hypervisor else ""
    what = (
        "a guest: host checks do not apply; `passthrough guest check` checks its GPU"
        if guest_without_iommu(scan.host)
        else "with an IOMMU: a nested passthrough host"
    )
    return f"{paint('Guest', 'bold', 'yellow')}    virtual machine{name} · {what} · {'; '.join(m.evidence)}"


def render_groups(scan: Scan, paint: Painter, gpus_only: bool = False) -> str:
    h = scan.host
    by_addr = {f.address: f for f in h.functions}
    gpu_of: dict[PciAddress, GpuVerdict] = {}
    for v in scan.verdicts:
        for f in v.gpu.functions:
            gpu_of[f.address] = v
    lines = [paint("IOMMU groups", "bold")]
    if not h.groups:
        lines.append("  (none: the IOMMU is off; every function below is ungrouped)")
    groups: list[tuple[int | None, list[PciAddress]]] = (
        [(g.number, list(g.members)) for g in h.groups]
        if h.groups
        else [(None, [f.address for f in h.functions])]
    )
    shown = [
        (n, members) for n, members in groups if not gpus_only or any(a in gpu_of for a in members)
    ]
    for i, (number, members) in enumerate(shown):
        last_group = i == len(shown) - 1
        verdicts = {gpu_of[a].gpu.address: gpu_of[a] for a in members if a in gpu_of}
        tags = []
        for v in verdicts.values():
            mark = paint("✔ viable", "green") if v.viable else paint("✘ not viable", "red")
            tags.append(f"GPU {v.gpu.address} {mark}")
        title = f"group {number}" if number is not None else "ungrouped"
        lines.append(
            f"{'└─' if last_group else '├─'} {paint(title, 'bold')}"
            + (f"  {'; '.join(tags)}" if tags else "")
        )
        prefix = "   " if last_group else "│  "
        for j, addr in enumerate(members):
            f = by_addr[addr]
            text = _fn_line(f)
            if addr in gpu_of:
                text = paint(text, "cyan")
            branch = "└─" if j == len(members) - 1 else "├─"
            lines.append(f"{prefix}{branch} {text}")
    return "\n".join(lines)


def render_gpus(scan: Scan, paint: Painter) -> str:
    lines = [paint("GPUs", "bold")]
    if not scan.verdicts:
        lines.append("  no display controllers found")
    for v in scan.verdicts:
        p = v.gpu.primary
        mark = paint("✔", "green", "bold") if v.viable else paint("✘", "red", "bold")
        groups = ",".join(map(str, v.gpu.groups)) or "-"
        numa = p.numa_node if p.numa_node is not None else "-"
        bars = " ".join(
            f"BAR{b.index}={format_size(b.size, compact=True)}" for b in p.bars if not b.is_io
        )
        lines.append(f"  {mark} {paint(str(p.address), 'bold')}  {p.name}")
        lines.append(
            f"      group {groups} · numa {numa} · driver {p.driver or '-'} · ids {','.join(v.gpu.vfio_ids)}"
            + (f" · {bars}" if bars else "")
        )
        # refusals first, then warnings; the code is what docs/discovery.md "Safety policy" lists
        for f in v.findings:
            mark = paint("✘", "red") if f.severity is Severity.ERROR else paint("!", "yellow")
            lines.append(f"      {mark} {f.message} {paint(f'[{f.code}]', 'dim')}")
    return "\n".join(lines)


def render_topology(scan: Scan, paint: Painter) -> str:
    """GPUs by NUMA node, each with its chain of upstream bridges."""
    h = scan.host
    by_addr = {f.address: f for f in h.functions}
    lines = [paint("Topology (NUMA node → PCIe path → GPU)", "bold")]
    nodes: dict[str, list[GpuVerdict]] = {}
    for v in scan.verdicts:
        key = str(v.gpu.primary.numa_node) if v.gpu.primary.numa_node is not None else "-"
        nodes.setdefault(key, []).append(v)
    for key, verdicts in sorted(nodes.items()):
        lines.append(f"node {key}")
        for v in verdicts:
            chain = [by_addr[a] for a in v.gpu.primary.parents if a in by_addr]
            hops = " → ".join(
                f"{f.address} {CLASS_WORDS.get(f.subclass, 'bridge') if not f.is_bridge_like else 'bridge'}"
                for f in chain
            )
            mark = paint("✔", "green") if v.viable else paint("✘", "red")
            lines.append(
                f"  {mark} {hops + ' → ' if hops else ''}{paint(str(v.gpu.address), 'bold')} {v.gpu.primary.name}"
            )
    return "\n".join(lines)


def render_scan(scan: Scan, paint: Painter, gpus_only: bool = False, topology: bool = False) -> str:
    parts = [
        render_host(scan, paint),
        render_groups(scan, paint, gpus_only),
        render_gpus(scan, paint),
    ]
    if topology:
        parts.append(render_topology(scan, paint))
    if scan.host.problems:
        parts.append(
            paint("Tolerated while reading", "bold")
            + "\n"
            + "\n".join(f"  - {p}" for p in scan.host.problems)
        )
    return "\n\n".join(parts)


def write(text: str, stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(text + "\n")
