# SPDX-License-Identifier: Apache-2.0
"""Run under `umockdev-wrapper`: a UMockdev test bed holds the recorded PCI devices, and a
thread stands in for the kernel (a stand-in, named as such: no real driver core exists
here) — it honours writes to unbind / driver_override / drivers_probe and emits the
uevents the real kernel would. `passthrough.live.bind` itself is the real code under test.

usage: umockdev_bind_probe.py RECORD MODE [STATE_DIR]
  MODE: ok | in-use | no-bind | variant (the card to a vfio variant driver, its audio to
  vfio-pci) | variant-unloaded (that variant driver not registered)
  release modes, on a card on vfio-pci at 0000:24:00.0 (the live-driver journal under
  STATE_DIR): release (each function to the kernel's default driver, then bind takes the
  card back) | release-journal (the journal says the card had nouveau: bound to it by
  name) | release-no-bind (no host driver takes it)
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
from passthrough.host.discover import discover  # noqa: E402
from passthrough.host.root import HostRoot  # noqa: E402
from passthrough.live.bind import BindFailed, BindRefused, bind_now  # noqa: E402
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
    hosts = ("nvidia", "snd_hda_intel", "nouveau")
    for drv in (*hosts, *vfio):
        os.makedirs(f"{sysdir}/bus/pci/drivers/{drv}", exist_ok=True)
        _clear(f"{sysdir}/bus/pci/drivers/{drv}/unbind")
        _clear(f"{sysdir}/bus/pci/drivers/{drv}/bind")
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

    def attach(dev: str, driver: str) -> None:
        # from /sys/<k components>/driver up to /sys: k times ".." (a link that resolves,
        # so a later unbind through it reaches the driver's file)
        depth = dev.count("/") - 1
        tb.set_attribute_link(dev, "driver", "../" * depth + f"bus/pci/drivers/{driver}")
        tb.set_property(dev, "DRIVER", driver)
        tb.uevent(dev, "bind")

    def default_driver(dev: str) -> str:
        # what the ID tables of the host drivers would match: display → nvidia, audio → HDA
        return "nvidia" if _read(f"{sysdir}{dev[4:]}/class").startswith("0x03") else "snd_hda_intel"

    def kernel_stand_in() -> None:
        while not stop.is_set():
            for drv in (*hosts, *vfio):
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
                path = f"{sysdir}/bus/pci/drivers/{drv}/bind"
                text = _read(path)
                # the real write returns once bound; here an unbind still pending waits a turn
                if text and not os.path.lexists(f"{sysdir}{by_name[text][4:]}/driver"):
                    _clear(path)
                    seen.append(f"bind {text} to {drv}")
                    if mode != "release-no-bind":
                        attach(by_name[text], drv)
            probe = f"{sysdir}/bus/pci/drivers_probe"
            text = _read(probe)
            if text:
                _clear(probe)
                dev = by_name[text]
                override = _read(f"{sysdir}{dev[4:]}/driver_override")
                seen.append(f"probe {text} override={override}")
                if override in vfio and mode != "no-bind":
                    attach(dev, override)
                elif not override and mode != "release-no-bind":
                    attach(dev, default_driver(dev))
            time.sleep(0.01)

    thread = threading.Thread(target=kernel_stand_in, daemon=True)
    thread.start()
    if mode.startswith("release"):
        result = _release(mode, sys.argv[3])
        stop.set()
        thread.join()
        result["kernel_saw"] = seen
        print(json.dumps(result))
        return
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


def _drivers(addresses: list[str]) -> dict[str, str]:
    return {a: os.path.basename(os.readlink(f"/sys/bus/pci/devices/{a}/driver")) for a in addresses}


def _release(mode: str, state_dir: str) -> dict[str, object]:
    """release, then (mode release) bind taking the card back: both journaled under
    ``state_dir``, a directory of this machine (umockdev redirects /sys and /dev only)."""
    from passthrough.live.livedrivers import LiveDrivers
    from passthrough.live.release import release_functions, release_now

    journal = LiveDrivers.load(HostRoot(state_dir))
    if mode == "release-journal":
        journal.begin("0000:24:00.0", "to-vfio", "nouveau")
        journal.done("0000:24:00.0", "vfio")
    host = discover("/")
    functions = release_functions(host, ["0000:24:00.0"])
    addresses = [str(f.address) for f in functions]
    result: dict[str, object] = {"functions": addresses}
    try:
        timeout = 2.0 if mode == "release-no-bind" else 10.0
        result["released"] = release_now(HostRoot("/"), host, functions, journal, timeout)
        result["drivers"] = _drivers(addresses)
        if mode == "release":
            again = discover("/")
            fns = [f for f in again.functions if str(f.address) in addresses]
            result["bound"] = bind_now(HostRoot("/"), again, fns, journal=journal, drivers={})
            result["drivers_after_bind"] = _drivers(addresses)
    except (BindRefused, BindFailed) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["journal"] = {
        a: e.as_json() for a, e in LiveDrivers.load(HostRoot(state_dir)).entries.items()
    }
    return result


if __name__ == "__main__":
    main()
