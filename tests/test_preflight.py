# SPDX-License-Identifier: Apache-2.0
"""Preflight: processes holding a card's device nodes, in check and bind (sample trees)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from passthrough import fakehost
from passthrough.cli import main
from passthrough.host.discover import discover
from passthrough.host.holders import Holder, find_holders
from passthrough.host.modalias import (
    PLAIN,
    VfioAlias,
    choose,
    is_vfio,
    vfio_aliases,
    vfio_drivers,
)
from passthrough.host.root import HostRoot

CARD = "0000:01:00.0"


def _held(hosts: dict[str, Path], tmp_path: Path) -> Path:
    """consumer-intel with nvidia-persistenced (a service) holding /dev/nvidia0 and a loose
    CUDA job holding the card's render node; another process holds an unrelated file."""
    root = tmp_path / "root"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    info = root / "proc/driver/nvidia/gpus" / CARD
    info.mkdir(parents=True)
    (info / "information").write_text("Model: \t\t NVIDIA GeForce\nDevice Minor: \t 0\n")
    drm = root / "sys/bus/pci/devices" / CARD / "drm"
    drm.mkdir(parents=True, exist_ok=True)
    (drm / "card1").mkdir()
    (drm / "renderD128").mkdir()
    for pid, comm, cgroup, targets in (
        (
            812,
            "nvidia-persist",
            "0::/system.slice/nvidia-persistenced.service\n",
            ["/dev/nvidia0", "/dev/nvidiactl"],
        ),
        (
            4242,
            "python3",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            ["/dev/dri/renderD128"],
        ),
        (99, "bash", "0::/user.slice\n", ["/dev/null", "/dev/nvidia1"]),
    ):
        proc = root / "proc" / str(pid)
        (proc / "fd").mkdir(parents=True)
        (proc / "comm").write_text(comm + "\n")
        (proc / "cgroup").write_text(cgroup)
        for n, target in enumerate(targets):
            os.symlink(target, proc / "fd" / str(n + 3))
    return root


def test_holders_are_named_with_pid_and_unit(hosts: dict[str, Path], tmp_path: Path) -> None:
    root = _held(hosts, tmp_path)
    found = find_holders(HostRoot(str(root)), [CARD, "0000:01:00.1"])
    assert found == {
        CARD: [
            Holder(812, "nvidia-persist", "nvidia-persistenced.service", "/dev/nvidia0"),
            Holder(4242, "python3", None, "/dev/dri/renderD128"),
        ]
    }


def test_no_holders_on_an_untouched_sample(hosts: dict[str, Path]) -> None:
    assert find_holders(HostRoot(str(hosts["consumer-intel"])), [CARD]) == {}


def test_check_reports_a_held_card_with_the_fix(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _held(hosts, tmp_path)
    main(["check", "--root", str(root), "--json"])
    data = json.loads(capsys.readouterr().out)
    checks = data["checks"]
    held = [c for c in checks if c["id"] == "gpu-held"]
    assert len(held) == 1, held
    assert held[0]["level"] == "WARN"
    assert (
        "nvidia-persist (pid 812, unit nvidia-persistenced.service) holds /dev/nvidia0"
        in (held[0]["summary"])
    )
    assert "systemctl stop nvidia-persistenced.service" in held[0]["fix"]
    assert "end python3 (pid 4242)" in held[0]["fix"]


def test_check_has_no_held_finding_without_holders(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    main(["check", "--root", str(hosts["consumer-intel"]), "--json"])
    assert '"gpu-held"' not in capsys.readouterr().out


def test_bind_refuses_a_held_card_naming_the_holders(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _held(hosts, tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    assert main(["bind", "--root", str(root), "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{CARD}: held open, an unbind would hang" in err
    assert "nvidia-persist (pid 812, unit nvidia-persistenced.service)" in err
    assert "python3 (pid 4242)" in err
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    assert after == before


# -- the vfio driver from modules.alias ---------------------------------------------------

GH200 = "pci:v000010DEd00002342sv000010DEsd000016CBbc03sc02i00"


def test_the_most_specific_vfio_alias_wins() -> None:
    aliases = [
        VfioAlias("v000010DEd00002342sv*sd*bc*sc*i*", "nvgrace_gpu_vfio_pci"),
        VfioAlias("v000010DEd00002941sv*sd*bc*sc*i*", "nvgrace_gpu_vfio_pci"),
        VfioAlias("v000010DEd*sv*sd*bc03sc*i*", "some_generic_vfio_pci"),
    ]
    assert choose(GH200, aliases) == "nvgrace_gpu_vfio_pci"  # beats the vendor-wide glob
    assert choose(GH200.replace("2342", "2330"), aliases) == "some_generic_vfio_pci"
    # another device of the same vendor that no alias covers (an audio function)
    assert choose(GH200.replace("2342", "2330").replace("bc03sc02", "bc04sc03"), aliases) == PLAIN
    assert choose(None, aliases) == PLAIN
    assert choose(GH200, []) == PLAIN


def _variant_host(hosts: dict[str, Path], tmp_path: Path, name: str) -> tuple[Path, str]:
    """A sample whose running kernel's modules.alias has a variant driver for its card."""
    root = tmp_path / "root"
    shutil.copytree(hosts[name], root, symlinks=True)
    release = (root / "proc/sys/kernel/osrelease").read_text().strip()
    alias = root / "lib/modules" / release / "modules.alias"
    dev = root / "sys/bus/pci/devices" / CARD / "modalias"
    card = dev.read_text().strip()[len("pci:") :]
    vendev = card[: card.index("sv")]
    alias.write_text(
        alias.read_text() + f"alias vfio_pci:{vendev}sv*sd*bc*sc*i* my_variant_vfio_pci\n"
    )
    return root, release


def test_vfio_aliases_are_read_from_the_running_release(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root, release = _variant_host(hosts, tmp_path, "consumer-intel")
    r = HostRoot(str(root))
    assert [a.module for a in vfio_aliases(r, release)] == ["my_variant_vfio_pci"]
    assert vfio_aliases(r, "0.0.0-not-running") == []
    functions = [f for f in discover(str(root)).functions if str(f.address).startswith("0000:01:")]
    assert vfio_drivers(r, release, functions) == {
        CARD: "my_variant_vfio_pci",
        "0000:01:00.1": PLAIN,
    }


def test_plan_names_the_variant_driver_and_the_holders(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = _variant_host(hosts, tmp_path, "consumer-intel")
    held = _held(hosts, tmp_path / "held")
    shutil.copytree(held / "proc", root / "proc", symlinks=True, dirs_exist_ok=True)
    shutil.copytree(
        held / "sys/bus/pci/devices" / CARD / "drm",
        root / "sys/bus/pci/devices" / CARD / "drm",
        dirs_exist_ok=True,
    )
    assert main(["plan", "--root", str(root), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["vfio_drivers"] == {CARD: "my_variant_vfio_pci", "0000:01:00.1": PLAIN}
    notes = "\n".join(plan["notes"])
    assert (
        f"{CARD}: the running kernel's modules.alias gives it the vfio variant driver my_variant_vfio_pci, bound through driver_override"
        in notes
    )
    assert (
        f"{CARD}: held open now (nvidia-persist (pid 812, unit nvidia-persistenced.service) holds /dev/nvidia0"
        in notes
    )


def test_a_plain_plan_gives_every_function_vfio_pci(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--root", str(hosts["consumer-intel"]), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["vfio_drivers"] == {CARD: PLAIN, "0000:01:00.1": PLAIN}
    assert not any("held open" in n or "variant" in n for n in plan["notes"])


VARIANT = "my_variant_vfio_pci"
RULE = "etc/udev/rules.d/40-passthrough-vfio.rules"


def _as_after_the_reboot(root: Path) -> None:
    """The card on the variant driver, its audio function on vfio-pci, as after a boot."""
    for addr, driver in ((CARD, VARIANT), ("0000:01:00.1", "vfio-pci")):
        (root / "sys/bus/pci/drivers" / driver).mkdir(exist_ok=True)
        link = root / "sys/bus/pci/devices" / addr / "driver"
        link.unlink()
        link.symlink_to(f"../../../../bus/pci/drivers/{driver}")
        uevent = link.parent / "uevent"
        lines = uevent.read_text().splitlines()
        uevent.write_text(
            "".join(f"DRIVER={driver}\n" if ln.startswith("DRIVER=") else ln + "\n" for ln in lines)
        )


def test_verify_by_hand_counts_a_variant_driver_as_vfio(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host prepared by hand (no apply journaled) with the card on its variant driver:
    verify sees the whole card on vfio, not a card split across drivers."""
    root = tmp_path / "root"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    _as_after_the_reboot(root)
    main(["verify", "--root", str(root), "--json"])
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks[f"vfio {CARD}"]["level"] == "PASS"
    assert checks[f"vfio {CARD}"]["summary"] == f"10de:2684 bound to {VARIANT}"
    assert "vfio" not in checks  # not "no function is bound to vfio-pci"
    assert f"card {CARD}" not in checks  # not "only part of the card is on vfio-pci"
    assert is_vfio(VARIANT) and is_vfio("nvgrace-gpu-vfio-pci") and is_vfio(PLAIN)
    assert not is_vfio("nvidia") and not is_vfio(None) and not is_vfio("vfio")


def test_a_variant_driver_is_bound_per_device_and_kept_out_of_the_ids(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The card gets the variant driver through a per-device driver_override that loads its
    module; its ID stays out of vfio-pci.ids (vfio-pci would take it first), the audio
    function's stays in."""
    root, _ = _variant_host(hosts, tmp_path, "consumer-intel")
    assert main(["plan", "--root", str(root), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["binding"] == "ids"
    assert plan["kernel_args"]["set"] == [
        a for a in plan["kernel_args"]["set"] if "10de:2684" not in a
    ]
    assert "vfio-pci.ids=10de:22ba" in plan["kernel_args"]["set"]
    writes = {a["path"]: a for a in plan["actions"] if a["kind"] == "write"}
    assert "/" + RULE in writes, sorted(writes)
    rule = [ln[1:] for ln in writes["/" + RULE]["diff"].splitlines() if ln.startswith("+ACTION")]
    assert len(rule) == 1  # the card alone: its audio function is bound by ID
    assert rule[0].startswith(
        f'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="{CARD}", '
        f'ATTR{{driver_override}}="{VARIANT}", RUN{{builtin}}+="kmod load {VARIANT}", '
        "RUN+=\"/bin/sh -c 'd=/sys/bus/pci/devices/%k; case $$(readlink $$d/driver) in "
        f"*/{VARIANT}) ;; "
    )
    conf = writes["/etc/modprobe.d/passthrough-vfio.conf"]["diff"]
    assert "+options vfio-pci ids=10de:22ba\n" in conf + "\n", conf

    # apply writes those files and journals the driver; after the reboot, verify expects it
    assert main(["apply", "--root", str(root), "--json"]) == 0
    capsys.readouterr()
    text = (root / RULE).read_text()
    assert f'KERNEL=="{CARD}", ATTR{{driver_override}}="{VARIANT}"' in text
    assert 'KERNEL=="0000:01:00.1"' not in text
    assert "ids=10de:22ba\n" in (root / "etc/modprobe.d/passthrough-vfio.conf").read_text()
    grub = (root / "etc/default/grub.d/99-passthrough.cfg").read_text()
    assert "vfio-pci.ids=10de:22ba" in grub and "10de:2684" not in grub
    _as_after_the_reboot(root)
    main(["verify", "--root", str(root), "--json"])
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks[f"vfio {CARD}"]["level"] == "PASS", checks[f"vfio {CARD}"]
    assert checks[f"vfio {CARD}"]["summary"] == f"10de:2684 bound to {VARIANT}"
    assert checks["vfio 0000:01:00.1"]["summary"] == "10de:22ba bound to vfio-pci"


def test_an_id_applied_before_its_variant_was_known_leaves_vfio_pci_ids(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An apply made while the kernel had no variant for the card put its ID in
    vfio-pci.ids; once modules.alias names a variant, the next plan takes it out (it is not
    kept as another device's configured ID)."""
    root = tmp_path / "root"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    assert main(["apply", "--root", str(root), "--json"]) == 0
    capsys.readouterr()
    grub = root / "etc/default/grub.d/99-passthrough.cfg"
    assert "vfio-pci.ids=10de:2684,10de:22ba" in grub.read_text()
    release = (root / "proc/sys/kernel/osrelease").read_text().strip()
    alias = root / "lib/modules" / release / "modules.alias"
    alias.write_text(
        alias.read_text() + f"alias vfio_pci:v000010DEd00002684sv*sd*bc*sc*i* {VARIANT}\n"
    )
    assert main(["apply", "--root", str(root), "--json"]) == 0
    capsys.readouterr()
    assert "for _passthrough_arg in vfio-pci.ids=10de:22ba;" in grub.read_text()
    assert f'ATTR{{driver_override}}="{VARIANT}"' in (root / RULE).read_text()


def test_a_plain_function_sharing_a_variant_id_is_bound_per_device(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Eight H100s of one ID, and a variant alias that matches one of them by its subsystem:
    vfio-pci.ids cannot name that ID (it would take the variant's card too), so every card
    is bound per device, the one with its variant, the others with vfio-pci."""
    root = tmp_path / "root"
    shutil.copytree(hosts["hgx-h100"], root, symlinks=True)
    release = (root / "proc/sys/kernel/osrelease").read_text().strip()
    for name in ("modalias", "uevent"):  # discovery reads the uevent's MODALIAS first
        odd = root / "sys/bus/pci/devices/0000:18:00.0" / name
        odd.write_text(odd.read_text().replace("sd000016C1", "sd0000BEEF"))
    alias = root / "lib/modules" / release / "modules.alias"
    alias.write_text(
        alias.read_text() + f"alias vfio_pci:v000010DEd*sv*sd0000BEEFbc*sc*i* {VARIANT}\n"
    )
    assert main(["plan", "--root", str(root), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["vfio_drivers"]["0000:18:00.0"] == VARIANT
    assert set(plan["vfio_drivers"].values()) == {VARIANT, PLAIN}
    assert plan["binding"] == "driver_override"
    assert not any(a.startswith("vfio-pci.ids") for a in plan["kernel_args"]["set"])
    assert any("shares its ID with a function bound to a vfio variant" in n for n in plan["notes"])
    rule = next(a for a in plan["actions"] if a["path"] == "/" + RULE)["diff"]
    lines = [ln for ln in rule.splitlines() if ln.startswith("+ACTION")]
    assert len(lines) == 8
    assert sum(f'ATTR{{driver_override}}="{VARIANT}"' in ln for ln in lines) == 1
    assert sum('ATTR{driver_override}="vfio-pci", RUN+=' in ln for ln in lines) == 7


# -- reset risk -----------------------------------------------------------------------------

SAMPLE = Path(fakehost.__file__).parent / "hosts" / "consumer-intel.yaml"
AUDIO = '"AD102 High Definition Audio Controller", bars: {0: "16K"}}\n'


def _checks(
    tmp_path: Path, yaml_text: str, capsys: pytest.CaptureFixture[str]
) -> list[dict[str, str]]:
    desc = tmp_path / "host.yaml"
    desc.write_text(yaml_text)
    root = fakehost.build(fakehost.load(str(desc)), tmp_path / "root")
    main(["check", "--root", str(root), "--json"])
    checks: list[dict[str, str]] = json.loads(capsys.readouterr().out)["checks"]
    return [c for c in checks if c["id"] == "reset-risk"]


def test_a_bus_reset_shared_with_another_device_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = SAMPLE.read_text()
    assert AUDIO in text
    shared = text.replace(
        AUDIO,
        AUDIO + '      - {addr: "01:01.0", id: "8086:125c", class: ethernet, driver: igc, '
        'name: "Ethernet Controller I226-V", bars: {0: "1M"}}\n',
    )
    risk = _checks(tmp_path, shared, capsys)
    assert [c["summary"] for c in risk] == [
        "0000:01:00.0: only a bus reset (reset_method is 'bus'), which resets everything on "
        "bus 0000:01 with it: 0000:01:01.0"
    ]
    assert risk[0]["level"] == "WARN"


def test_a_bus_reset_of_the_card_alone_is_no_risk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _checks(tmp_path, SAMPLE.read_text(), capsys) == []


def test_a_known_no_reset_family_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    navi = (
        SAMPLE.read_text()
        .replace('id: "10de:2684"', 'id: "1002:731f"')
        .replace('id: "10de:22ba"', 'id: "1002:ab38"')  # its audio function, AMD's too
        .replace('"10de": NVIDIA Corporation', '"10de": NVIDIA Corporation, "1002": AMD')
    )
    risk = _checks(tmp_path, navi, capsys)
    assert [c["summary"] for c in risk] == [
        "0000:01:00.0: AMD Navi 10 (1002:731f) is known not to come back after a guest stops "
        "(its reset leaves it unusable until the host reboots)"
    ]
    assert "vendor-reset" in risk[0]["fix"]


def test_the_policy_counts_a_variant_driver_as_handed_over(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    """vfio-bound, not vfio-partly, for a card on its variant driver beside vfio-pci; and the
    plan asks no softdep for the variant (it is vfio itself)."""
    from passthrough.analysis.policy import judge_all
    from passthrough.host.root import HostRoot
    from passthrough.plan.vfio import softdeps

    root = tmp_path / "root"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    _as_after_the_reboot(root)
    host = discover(str(root))
    verdict = next(v for v in judge_all(host) if str(v.gpu.address) == CARD)
    codes = {f.code: f.message for f in verdict.findings}
    assert "vfio-partly" not in codes, codes
    assert codes["vfio-bound"] == f"already bound to vfio ({VARIANT}, vfio-pci): ready for a guest"
    card = [f for f in host.functions if str(f.address).startswith("0000:01:00.")]
    assert VARIANT not in softdeps(HostRoot(str(root)), host, card)
