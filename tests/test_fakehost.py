# SPDX-License-Identifier: Apache-2.0
"""fakehost: the schema of a host description and the trees built from the samples.

Every mistyped key, at every level, is an error naming the file, the key's path and the
nearest known key; every value of the wrong type too. The trees the samples build are
pinned by a golden fingerprint, first written from the code before fakehost became a
package, so the split changed no byte, mode or link of them.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from passthrough import fakehost
from passthrough.errors import BadDescription
from passthrough.host.discover import discover
from passthrough.model import PciAddress

from .conftest import GOLDEN, assert_golden

Change = Callable[[dict[str, Any]], None]


def _sample() -> dict[str, Any]:
    """consumer-intel: every section the schema has, a root port with a card below it."""
    data = copy.deepcopy(fakehost.load("consumer-intel").data)
    data.setdefault("kernel", {})["vfio"] = "module"
    data.setdefault("boot", {})["uefi"] = True
    data.setdefault("iommu", {})["enabled"] = True
    data.setdefault("dmi", {})["chassis_type"] = 3
    return data


def _port(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The first root port with a card below it (00:01.0 and the RTX 4090)."""
    return next(item for item in items if item.get("children"))


def _setter(path: list[Any], key: Any, value: Any) -> Change:
    def change(data: dict[str, Any]) -> None:
        node: Any = data
        for step in path:
            node = _port(node) if step == "port" else node[step]
        node[key] = value

    return change


# (where to put it, the mistyped key, what the message must name)
TYPOS = [
    ([], "distor", "unknown key 'distor' (did you mean 'distro'?)"),
    ([], "memory_gb", "unknown key 'memory_gb' (did you mean 'memory_gib'?)"),
    (["cpu"], "vendr", "cpu: unknown key 'vendr' (did you mean 'vendor'?)"),
    (["cpu"], "physbits", "cpu: unknown key 'physbits' (did you mean 'phys_bits'?)"),
    (["kernel"], "cmdlne", "kernel: unknown key 'cmdlne' (did you mean 'cmdline'?)"),
    (["boot"], "bootloder", "boot: unknown key 'bootloder' (did you mean 'bootloader'?)"),
    (["iommu"], "enabeld", "iommu: unknown key 'enabeld' (did you mean 'enabled'?)"),
    (["dmi"], "prodcut", "dmi: unknown key 'prodcut' (did you mean 'product'?)"),
    (["root_disk"], "lvn", "root_disk: unknown key 'lvn' (did you mean 'lvm'?)"),
    (["nic"], "ifcae", "nic: unknown key 'ifcae' (did you mean 'iface'?)"),
    (["pci", 0], "clas", "pci[0] (00:00.0): unknown key 'clas' (did you mean 'class'?)"),
    (
        ["pci", "port"],
        "group_childern",
        "pci[1] (00:01.0): unknown key 'group_childern' (did you mean 'group_children'?)",
    ),
    (
        ["pci", "port", "children", 0],
        "drvier",
        "pci[1] (00:01.0).children[0] (01:00.0): unknown key 'drvier' (did you mean 'driver'?)",
    ),
]


@pytest.mark.parametrize(("path", "key", "named"), TYPOS, ids=[t[1] for t in TYPOS])
def test_a_mistyped_key_is_an_error_naming_it(path: list[Any], key: str, named: str) -> None:
    data = _sample()
    _setter(path, key, 1)(data)
    with pytest.raises(BadDescription) as err:
        fakehost.Description(data, "hosts/typo.yaml")
    assert str(err.value).startswith("hosts/typo.yaml: ")
    assert named in str(err.value)


def test_the_error_names_the_file_it_was_read_from(tmp_path: Path) -> None:
    text = (fakehost.HOSTS_DIR / "consumer-intel.yaml").read_text()
    path = tmp_path / "mine.yaml"
    path.write_text(text.replace("\ndistro:", "\ndistor:", 1))
    assert text != path.read_text()
    with pytest.raises(BadDescription) as err:
        fakehost.load(str(path))
    assert str(err.value) == f"{path}: unknown key 'distor' (did you mean 'distro'?)"


# (where, key, a value of the wrong type, what the message must say)
WRONG_TYPES = [
    ([], "memory_gib", "64G", "memory_gib: expected an integer, got '64G' (str)"),
    ([], "kvm", "yes", "kvm: expected true or false, got 'yes' (str)"),
    ([], "numa", True, "numa: expected an integer, got True (bool)"),
    ([], "pci", {"addr": "00:00.0"}, "pci: expected a list"),
    ([], "cpu", "intel", "cpu: expected a mapping, got 'intel' (str)"),
    ([], "vendors", {0x8086: "Intel"}, "vendors: key 32902 (int): expected a string"),
    (["cpu"], "cpus", "four", "cpu.cpus: expected an integer, got 'four' (str)"),
    (["kernel"], "config", {"CONFIG_VFIO": 1}, "kernel.config.CONFIG_VFIO: expected a string"),
    (["kernel"], "release", 6.1, "kernel.release: expected a string, got 6.1 (float); quote it"),
    (["kernel"], "vfio", "modul", "kernel.vfio: expected one of module, builtin, none"),
    (["boot"], "uefi", "true", "boot.uefi: expected true or false, got 'true' (str)"),
    (["boot"], "bootloader", "grub2", "boot.bootloader: expected one of grub, grubby"),
    (["iommu"], "address_bits", "48", "iommu.address_bits: expected an integer"),
    (["root_disk"], "kind", "ssd", "root_disk.kind: expected one of nvme, sata"),
    (["pci", 0], "group", "3", "pci[0] (00:00.0).group: expected an integer"),
    (["pci", 0], "reset", "flr", "pci[0] (00:00.0).reset: expected a list"),
    (["pci", 0], "id", 8086, "pci[0] (00:00.0).id: expected a string"),
    (["pci", "port"], "children", {}, ".children: expected a list, got {} (dict)"),
    (["pci", "port", "children", 0], "bars", {0: 16}, "bars.0: expected a string, got 16"),
    (["pci", "port", "children", 0], "boot_vga", 1, ".boot_vga: expected true or false or null"),
]


@pytest.mark.parametrize(
    ("path", "key", "value", "named"), WRONG_TYPES, ids=[f"{t[0]}-{t[1]}" for t in WRONG_TYPES]
)
def test_a_value_of_the_wrong_type_is_an_error(
    path: list[Any], key: str, value: object, named: str
) -> None:
    data = _sample()
    _setter(path, key, value)(data)
    with pytest.raises(BadDescription) as err:
        fakehost.Description(data, "wrong.yaml")
    assert named in str(err.value)


def test_required_keys_and_bad_values_inside_strings() -> None:
    for change, named in (
        (lambda d: _port(d["pci"])["children"][0].pop("addr"), "missing key 'addr'"),
        (lambda d: d.update(root_disk={"kind": "nvme"}), "root_disk: missing key 'pci'"),
        (lambda d: d.update(distro="debian-13"), "unknown distro 'debian-13'"),
        (
            lambda d: _port(d["pci"])["children"][0].update(bars={9: "16M"}),
            "a BAR number is 0 to 5",
        ),
        (lambda d: _port(d["pci"])["children"][0].update(bars={0: "16Q"}), "expected a size"),
        (lambda d: _port(d["pci"])["children"][0].update({"class": "gpu"}), "unknown class 'gpu'"),
    ):
        data = _sample()
        change(data)
        with pytest.raises(BadDescription, match=named):
            fakehost.Description(data, "x.yaml")
    with pytest.raises(BadDescription, match="expected a mapping, got None"):
        fakehost.Description(None, "empty.yaml")  # type: ignore[arg-type]


def test_bar_numbers_may_be_strings_as_json_writes_them(tmp_path: Path) -> None:
    """A description that went through JSON (tests copy them that way) has "0", not 0."""
    data = _sample()
    card = _port(data["pci"])["children"][0]
    card["bars"] = {str(k): v for k, v in card["bars"].items()}
    desc = fakehost.Description(data, "json.yaml")
    node = next(n for n in desc.nodes if n.address == PciAddress.parse(card["addr"]))
    assert node.bars[1] == (32 << 30, False, True, True)  # "32G p64"


@pytest.mark.parametrize("name", fakehost.sample_names())
def test_every_sample_loads_builds_and_is_discovered(name: str, tmp_path: Path) -> None:
    desc = fakehost.load(name)
    root = fakehost.build(desc, tmp_path / name)
    host = discover(str(root))
    assert sorted(str(f.address) for f in host.functions) == sorted(
        str(n.address) for n in desc.nodes
    )
    assert host.kernel.release == desc.release


def fingerprint(root: Path) -> str:
    """Every path of a tree with its content's hash and mode, or its link's target (a
    directory's mode is left out: it follows the umask)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath, name)
            if p.is_symlink():
                what = f"-> {os.readlink(p)}"
            elif p.is_dir():
                what = "dir"
            else:
                what = f"{p.stat().st_mode:o} {hashlib.sha256(p.read_bytes()).hexdigest()}"
            h.update(f"{p.relative_to(root)} {what}\n".encode())
    return h.hexdigest()


def test_the_sample_trees_are_unchanged(hosts: dict[str, Path], regenerate: bool) -> None:
    got = "".join(f"{name} {fingerprint(root)}\n" for name, root in sorted(hosts.items()))
    assert_golden(GOLDEN / "fakehost-trees.txt", got, regenerate, "the sample trees")
