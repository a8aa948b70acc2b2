# SPDX-License-Identifier: Apache-2.0
"""Run under `umockdev-wrapper`: a UMockdev test bed holds the recorded PCI devices, and a
thread stands in for the kernel (a stand-in, named as such: no real driver core exists
here) — it honours writes to unbind / driver_override / drivers_probe and emits the
uevents the real kernel would. `passthrough.execute.bind` itself is the real code under test.

usage: umockdev_bind_probe.py RECORD MODE
  MODE: ok | in-use | no-bind | variant (the card to a vfio variant driver, its audio to
  vfio-pci) | variant-unloaded (that variant driver not registered)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import gi

gi.require_version("UMockdev", "1.0")
from gi.repository import UMockdev  # noqa: E402

from passthrough.analysis.policy import judge_all  # noqa: E402
from passthrough.execute.bind import BindFailed, BindRefused, bind_now  # noqa: E402
from passthrough.host.discover import discover  # noqa: E402
from passthrough.host.root import HostRoot  # noqa: E402
from passthrough.plan.select import select  # noqa: E402

VARIANT = "my_variant_vfio_pci"


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read().strip()


def _clear(path: str) -> None:
    with open(path, "w"):
        pass


def main() -> None:
    record, mode = sys.argv[1], sys.argv[2]
    tb = UMockdev.Testbed.new()
    tb.add_from_string(_read(record) + "\n")
    sysdir = tb.get_sys_dir()
    vfio = ["vfio-pci"] + ([VARIANT] if mode == "variant" else [])
    for drv in ("nvidia", "snd_hda_intel", *vfio):
        os.makedirs(f"{sysdir}/bus/pci/drivers/{drv}", exist_ok=True)
        _clear(f"{sysdir}/bus/pci/drivers/{drv}/unbind")
    _clear(f"{sysdir}/bus/pci/drivers_probe")
    if mode == "in-use":
        os.makedirs(f"{sysdir}/module/nvidia", exist_ok=True)
        with open(f"{sysdir}/module/nvidia/refcnt", "w") as fh:
            fh.write("3\n")
    by_name = {}
    for dirpath, _dirs, files in os.walk(f"{sysdir}/devices"):
        if "uevent" in files or "vendor" in files:
            by_name[os.path.basename(dirpath)] = "/sys" + dirpath[len(sysdir) :]
    stop = threading.Event()
    seen: list[str] = []

    def kernel_stand_in() -> None:
        while not stop.is_set():
            for drv in ("nvidia", "snd_hda_intel"):
                path = f"{sysdir}/bus/pci/drivers/{drv}/unbind"
                text = _read(path)
                if text:
                    _clear(path)
                    dev = by_name[text]
                    os.unlink(
                        f"{sysdir}{dev[4:]}/driver"
                    )  # umockdev 0.17: remove before re-linking
                    tb.uevent(dev, "unbind")
                    seen.append(f"unbind {text}")
            probe = f"{sysdir}/bus/pci/drivers_probe"
            text = _read(probe)
            if text:
                _clear(probe)
                dev = by_name[text]
                override = _read(f"{sysdir}{dev[4:]}/driver_override")
                seen.append(f"probe {text} override={override}")
                if override in vfio and mode != "no-bind":
                    depth = dev.count("/") - 1
                    tb.set_attribute_link(
                        dev, "driver", "../" * (depth - 1) + f"bus/pci/drivers/{override}"
                    )
                    tb.set_property(dev, "DRIVER", override)
                    tb.uevent(dev, "bind")
            time.sleep(0.01)

    thread = threading.Thread(target=kernel_stand_in, daemon=True)
    thread.start()
    host = discover("/")
    sel = select(host, judge_all(host), ["0000:01:00.0"])
    result: dict[str, object] = {"functions": [str(f.address) for f in sel.functions]}
    try:
        result["bound"] = bind_now(
            HostRoot("/"),
            host,
            sel.functions,
            timeout=2.0 if mode == "no-bind" else 10.0,
            # the real host's modules.alias is no fixture: the variant is given here (the
            # choice from modules.alias is tested on sample trees, tests/test_preflight.py)
            drivers={"0000:01:00.0": VARIANT} if mode.startswith("variant") else {},
        )
        result["drivers"] = {
            a: os.path.basename(os.readlink(f"/sys/bus/pci/devices/{a}/driver"))
            for a in result["functions"]  # type: ignore[union-attr]
        }
    except (BindRefused, BindFailed) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    stop.set()
    thread.join()
    result["kernel_saw"] = seen
    print(json.dumps(result))


if __name__ == "__main__":
    main()
