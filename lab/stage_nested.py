# SPDX-License-Identifier: Apache-2.0
"""The nested guest that boots (TCG inside TCG): the card and the 64 GiB-BAR stand-in rendered
with the address planner's layout, booted through OVMF inside the lab host; every BAR where
the plan put it, and without the plan the kernel must report the large BAR unassigned."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import nested
from labcore import (
    BIG,
    BREAK_BITS,
    CARD,
    IMAGES,
    NESTED,
    NESTED_MIB,
    NESTED_TIMEOUT,
    REPO,
    SRC,
    LabCore,
    LabFailed,
    alone,
)


class NestedStages(LabCore):
    """nested_prepare, then nested_planned and nested_break, each alone on the machine."""

    def nested_prepare(self) -> dict[str, Any]:
        """Inside the lab host: the nested guest's kernel (the lab host's own) and a busybox
        initramfs; the domain for the card and the large-BAR stand-in, rendered by the
        library with the address planner's layout; the host's view of both."""
        assert self.machine is not None
        self.machine.copy_to(REPO / "lab", SRC)
        build = f"python3 {SRC}/lab/nested.py /bin/busybox {IMAGES}/nested-initrd.gz"
        r = self.sh(f"{build} && cp $(ls /boot/vmlinuz-* | tail -1) {IMAGES}/nested-vmlinuz")
        if r.returncode != 0:
            raise LabFailed(f"building the nested guest's initramfs: {r.stderr.strip()[-800:]}")
        r = self.sh(f"{self.python} {SRC}/lab/nested_render.py {NESTED} {CARD} {BIG} {NESTED_MIB}")
        if r.returncode != 0:
            raise LabFailed(f"rendering the nested guest: {r.stderr.strip()[-800:]}")
        rendered: dict[str, Any] = json.loads(r.stdout)
        devices = " ".join(f"/sys/bus/pci/devices/{a}" for a in rendered["addresses"])
        host_view = self.sh(f"echo {nested.BEGIN}; {nested.dump(devices)}echo {nested.END}").stdout
        rendered["host"] = nested.parse_capture(host_view)
        return rendered

    def nested_boot(self, xml: str, tag: str) -> tuple[nested.Capture, list[str], float]:
        """Define and start the guest from ``xml`` with direct kernel boot and its serial
        port in a file; wait until its init has powered it off; parse what it printed.
        Returns the capture, the planner's finding codes on the domain, and the seconds."""
        log = f"{IMAGES}/{NESTED}-{tag}-serial.log"
        booted = nested.boot_xml(xml, f"{IMAGES}/nested-vmlinuz", f"{IMAGES}/nested-initrd.gz", log)
        path = f"/tmp/{NESTED}-{tag}.xml"
        self.sh(f"cat > {path} <<'LAB_XML_EOF'\n{booted}\nLAB_XML_EOF")
        (self.work / f"{NESTED}-{tag}.xml").write_text(booted)
        r = self.sh(f"{self.python} {SRC}/lab/nested_render.py --check {path}")
        if r.returncode != 0:
            raise LabFailed(f"layout check of the {tag} domain: {r.stderr.strip()[-800:]}")
        codes = [f["code"] for f in json.loads(r.stdout)]
        virsh = "virsh -c qemu:///system"
        r = self.sh(f"rm -f {log}; {virsh} define {path} && {virsh} start {NESTED}")
        if r.returncode != 0:
            raise LabFailed(f"starting the {tag} nested guest: {r.stderr.strip()[-800:]}")
        started = time.monotonic()
        try:
            while time.monotonic() - started < NESTED_TIMEOUT:
                state = self.sh(f"{virsh} domstate {NESTED}").stdout.strip()
                if state != "running":
                    break
                time.sleep(5)
            seconds = time.monotonic() - started
            text = self.sh(f"cat {log}").stdout
            (self.work / f"{NESTED}-{tag}-serial.log").write_text(text)
            self.artifact_files.append(self.work / f"{NESTED}-{tag}-serial.log")
            self.artifact_files.append(self.work / f"{NESTED}-{tag}.xml")
            if state == "running":
                raise LabFailed(
                    f"the {tag} nested guest still runs after {NESTED_TIMEOUT}s; its serial "
                    f"log ends: {text[-600:]}"
                )
            try:
                capture = nested.parse_capture(text)
            except ValueError as exc:
                qemu_log = self.sh(f"tail -20 /var/log/libvirt/qemu/{NESTED}.log").stdout
                raise LabFailed(
                    f"the {tag} nested guest: {exc}; serial: {text[-600:]} qemu: {qemu_log}"
                ) from None
        finally:
            self.sh(f"{virsh} destroy {NESTED}; {virsh} undefine --nvram {NESTED}")
        return capture, codes, seconds

    def nested_alone(
        self, boot: Callable[[dict[str, Any]], dict[str, Any]], rendered: dict[str, Any]
    ) -> dict[str, Any]:
        with alone():
            return boot(rendered)

    def nested_planned(self, rendered: dict[str, Any]) -> dict[str, Any]:
        """The guest as rendered: every function at the guest address the XML promised,
        with the host's IDs, every BAR assigned at its full size, the large BAR inside the
        window the planner chose."""
        capture, codes, seconds = self.nested_boot(rendered["xml"], "planned")
        host: nested.Capture = rendered["host"]
        problems = [f"the planner's own check flags the rendered domain: {codes}"] if codes else []
        bars: dict[str, dict[str, int]] = {}
        for host_addr, guest_addr in rendered["addresses"].items():
            h, g = host.functions[host_addr], capture.functions.get(guest_addr)
            if g is None:
                problems.append(f"{host_addr} is not at guest {guest_addr}")
                continue
            if (g.vendor, g.device, g.class_code) != (h.vendor, h.device, h.class_code):
                problems.append(f"guest {guest_addr} is {g.vendor:04x}:{g.device:04x}")
            for i in range(6):
                hb, gb = h.bar(i), g.bar(i)
                if hb is None or hb[1] == 0 or h.resources[i][2] & 0x100:  # IO BARs: no size check
                    continue
                if gb is None or gb[1] != hb[1]:
                    problems.append(f"guest {guest_addr} BAR {i} is {gb}, host size {hb[1]:#x}")
                else:
                    bars[f"{guest_addr} BAR {i}"] = {"start": gb[0], "size": gb[1]}
        window = rendered["layout"]["window"]
        big = bars.get(f"{rendered['addresses'][BIG]} BAR 2")
        if big is None:
            problems.append("the large BAR is not assigned")
        elif not (
            window["base"] <= big["start"]
            and big["start"] + big["size"] <= window["base"] + window["size"]
        ):
            problems.append(f"the large BAR {big} lies outside the planned window {window}")
        if problems:
            raise LabFailed("; ".join(problems))
        return {
            "seconds": seconds,
            "bars": bars,
            "big_bar": big,
            "window": window,
            "decisions": rendered["layout"]["decisions"],
            "addresses": rendered["addresses"],
        }

    def nested_break(self, rendered: dict[str, Any]) -> dict[str, Any]:
        """The same guest without the planner's window and bits: its kernel must report the
        large BAR unassigned, and the planner's check must flag the domain."""
        broken = nested.without_planner(rendered["xml"], BREAK_BITS)
        capture, codes, seconds = self.nested_boot(broken, "broken")
        guest_big = rendered["addresses"][BIG]
        g = capture.functions.get(guest_big)
        if g is None:
            raise LabFailed(f"the broken guest has no function at {guest_big}")
        bar = g.bar(2)
        said = nested.no_space(capture, guest_big)
        if bar is not None or not said:
            raise LabFailed(
                f"the break was not caught: the guest shows BAR 2 of {guest_big} as {bar}, "
                f"its kernel said {said}"
            )
        if "mmio-window-too-small" not in codes:
            raise LabFailed(f"the planner's check did not flag the broken domain: {codes}")
        return {"seconds": seconds, "big_bar": bar, "kernel": said, "codes": codes}
