# SPDX-License-Identifier: Apache-2.0
"""The Ansible side of the VM options table (passthrough/vm/options.py): the passthrough_vm
module's argument_spec is generated from it, and what Ansible reads as static text (the
module's DOCUMENTATION, the role's argument_specs, defaults and task) is checked against
it here, so a new or changed option cannot reach one side only. The module is also run for
real (as Ansible runs it: a JSON args file) to show a table default and a table refusal."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from passthrough import fakehost
from passthrough.plan import options as host_table
from passthrough.vm.options import OPTIONS, ansible_argument_spec, ansible_option

from .conftest import assert_golden

REPO = Path(__file__).parents[1]
COLLECTIONS = REPO / "playbooks"
LIBRARY = COLLECTIONS / "ansible_collections/passthrough/gpu/plugins/modules"
ROLE = COLLECTIONS / "ansible_collections/passthrough/gpu/roles/passthrough_vm"
# options of the role's guest entries that are not guest options of the table
ROLE_ONLY = {"ssh_host", "state", "existing_disk"}
# module options the role fills from role variables rather than from each guest entry
FROM_ROLE_VARS = {"root": "passthrough_vm_root", "uri": "passthrough_vm_uri"}
FROM_ROLE_VARS["require_handed_over"] = "passthrough_vm_require_handed_over"


def _module(name: str) -> ModuleType:
    # the guest module imports its checks as Ansible packs them: from the collection's
    # module_utils (ansible_collections is a namespace package, so the checkout's joins the
    # venv's)
    if str(COLLECTIONS) not in sys.path:
        sys.path.append(str(COLLECTIONS))
    spec = importlib.util.spec_from_file_location(name, LIBRARY / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _documented(module: ModuleType) -> dict[str, Any]:
    """The module's options as ansible-doc shows them: its own and its fragments' (the
    collection's; doc_fragments/runtime.py gives the action's ``runtime``)."""
    doc = yaml.safe_load(module.DOCUMENTATION)
    options = dict(doc["options"])
    fragments = doc.get("extends_documentation_fragment") or []
    for fragment in [fragments] if isinstance(fragments, str) else fragments:
        name = fragment.removeprefix("passthrough.gpu.")
        path = LIBRARY.parent / "doc_fragments" / f"{name}.py"
        frag = importlib.util.spec_from_file_location(f"fragment_{name}", path)
        assert frag and frag.loader, fragment
        loaded = importlib.util.module_from_spec(frag)
        frag.loader.exec_module(loaded)
        options.update(yaml.safe_load(loaded.ModuleDocFragment.DOCUMENTATION)["options"])
    return options


def _runtime_option() -> set[str]:
    """The option every module under the runtime takes from its action, not from a role."""
    return set(_module("passthrough_host").RUNTIME_OPTION)


def _compared(entry: dict[str, Any]) -> dict[str, Any]:
    """What Ansible enforces of an option (descriptions are prose)."""
    keys = ("type", "elements", "default", "choices", "required")
    return {k: entry[k] for k in keys if k in entry and entry[k] not in (None, False)}


MODULE_UTILS = COLLECTIONS / "ansible_collections/passthrough/gpu/plugins/module_utils"
GENERATED_SOURCE = '''\
# SPDX-License-Identifier: Apache-2.0
# Generated from passthrough/{table}, the one table of {kind} options, by
# tests/test_options_ansible.py (pytest --regenerate-golden rewrites it): do not edit.
"""The {module} module's {kind} options as Ansible argument_spec entries, here so that
the module parses its arguments (and ansible-test reads them) without the package."""

from __future__ import annotations

import json
from typing import Any

{name}: dict[str, dict[str, Any]] = json.loads(
    r"""
{spec}
"""
)
'''
# (generated file, the table, what its options are, the module, the name it exports)
GENERATED = [
    ("vm_options.py", "vm/options.py", "guest", "passthrough_vm", "GUEST_OPTIONS"),
    ("host_options.py", "plan/options.py", "host", "passthrough_host", "HOST_OPTIONS"),
]
SPECS = {"guest": ansible_argument_spec, "host": host_table.ansible_argument_spec}


@pytest.mark.parametrize(("file", "table", "kind", "module", "name"), GENERATED)
def test_module_utils_options_are_generated_from_the_table(
    regenerate: bool, file: str, table: str, kind: str, module: str, name: str
) -> None:
    spec = json.dumps(SPECS[kind](), indent=2)
    source = GENERATED_SOURCE.format(table=table, kind=kind, module=module, name=name, spec=spec)
    assert_golden(MODULE_UTILS / file, source, regenerate, f"the {kind} table's argument_spec")


def test_host_module_argument_spec_is_the_table_plus_its_own_options() -> None:
    host = _module("passthrough_host")
    spec = host.argument_spec()
    table = host_table.ansible_argument_spec()
    assert {k: spec[k] for k in table} == table
    assert (
        set(spec)
        == {o.module_name for o in host_table.OPTIONS}
        | set(host.MODULE_OPTIONS)
        | _runtime_option()
    )
    # left out (null): what an earlier apply reserved is kept; 0 gives it back
    assert spec["hugepages"] == {"type": "int", "default": None}
    assert spec["iommu_pt"] == {"type": "bool", "default": True}
    assert spec["release"] == {"type": "list", "elements": "str", "default": []}


def test_module_argument_spec_is_the_table_plus_its_own_options() -> None:
    vm = _module("passthrough_vm")
    spec = vm.argument_spec()
    assert {k: spec[k] for k in ansible_argument_spec()} == ansible_argument_spec()
    assert set(spec) == {o.name for o in OPTIONS} | set(vm.MODULE_OPTIONS) | _runtime_option()
    assert spec["memory_mib"] == {"type": "int", "default": 8192}
    assert spec["gpus"] == {"type": "list", "elements": "str", "default": []}
    assert spec["name"] == {"type": "str", "required": True}


@pytest.mark.parametrize("name", ["passthrough_vm", "passthrough_host"])
def test_module_documentation_agrees_with_its_argument_spec(name: str) -> None:
    module = _module(name)
    documented = _documented(module)
    spec = module.argument_spec()
    assert set(documented) == set(spec), "DOCUMENTATION and argument_spec name other options"
    for name, entry in spec.items():
        assert _compared(documented[name]) == _compared(entry), name
        assert documented[name].get("description"), f"{name} has no description"


@pytest.mark.parametrize("path", sorted(LIBRARY.glob("*.py")), ids=lambda p: p.stem)
def test_every_module_has_documentation_examples_and_return(path: Path) -> None:
    mod = _module(path.stem)
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert doc["module"] == path.stem and doc.get("description"), "no module description"
    returned = yaml.safe_load(mod.RETURN)
    assert isinstance(returned, dict) and returned
    assert all(v.get("description") and v.get("type") for v in returned.values())
    examples = yaml.safe_load(mod.EXAMPLES)
    assert isinstance(examples, list) and examples
    # examples use the FQCN; other tasks may stand beside them (what to do with the result)
    calls = [t for t in examples if f"passthrough.gpu.{path.stem}" in t]
    assert calls, "no example calls the module by its FQCN"
    for task in calls:
        args = task[f"passthrough.gpu.{path.stem}"] or {}
        unknown = set(args) - set(doc["options"])
        assert not unknown, f"{task['name']}: {sorted(unknown)} not in DOCUMENTATION"
    # and as Ansible itself reads it, by its FQCN from the checkout's collection
    r = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-doc"), f"passthrough.gpu.{path.stem}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS)},
    )
    assert r.returncode == 0 and "ERROR" not in r.stderr, r.stderr
    assert "EXAMPLES" in r.stdout and "RETURN VALUES" in r.stdout


def _argument_specs() -> dict[str, Any]:
    data = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())
    return dict(data["argument_specs"]["main"]["options"])


def test_role_guest_options_agree_with_the_table() -> None:
    guest = _argument_specs()["passthrough_vm_guests"]["options"]
    assert set(guest) == {o.name for o in OPTIONS} | ROLE_ONLY
    for opt in OPTIONS:
        assert _compared(guest[opt.name]) == _compared(ansible_option(opt)), opt.name
    module = _module("passthrough_vm").MODULE_OPTIONS
    for name in ("state", "existing_disk"):  # per guest in the role, the module's own
        assert _compared(guest[name]) == _compared(module[name]), name


_TEMPLATED_DEFAULT = re.compile(r"^\{\{ *\w+ *\| *default\((?P<value>.*)\) *\}\}$")


def test_role_defaults_agree_with_its_argument_specs() -> None:
    specs = _argument_specs()
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    assert set(defaults) == set(specs)
    for name, value in defaults.items():
        templated = _TEMPLATED_DEFAULT.match(value) if isinstance(value, str) else None
        # "{{ passthrough_root | default('/') }}": the value when nothing else is set
        plain = yaml.safe_load(templated["value"]) if templated else value
        assert plain == specs[name].get("default"), name
    module = _module("passthrough_vm").MODULE_OPTIONS
    for option, var in FROM_ROLE_VARS.items():
        assert specs[var].get("default") == module[option].get("default"), var


def test_role_task_leaves_every_guest_default_to_the_table() -> None:
    tasks = yaml.safe_load((ROLE / "tasks/main.yml").read_text())
    (task,) = [t for t in tasks if "passthrough.gpu.passthrough_vm" in t]
    args = task["passthrough.gpu.passthrough_vm"]
    assert set(args) == set(_module("passthrough_vm").argument_spec()) - _runtime_option()
    for name, value in args.items():
        if name in FROM_ROLE_VARS:
            assert value == "{{ " + FROM_ROLE_VARS[name] + " }}", name
        elif name == "name":
            assert value == "{{ item.name }}"
        elif name == "planned_functions":  # the host role's result, when it ran
            assert value == "{{ passthrough_host_result.plan.functions | default([]) }}"
        else:  # left out: the module's default, which is the table's
            assert value == "{{ item." + name + " | default(omit) }}", name


def _run_module(tmp_path: Path, module: str = "passthrough_vm", **args: Any) -> dict[str, Any]:
    """The module as Ansible runs it: a file holding ANSIBLE_MODULE_ARGS, JSON out."""
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    # the collection's module_utils on the path, as Ansible packs them
    path = os.pathsep.join(filter(None, [str(COLLECTIONS), os.environ.get("PYTHONPATH")]))
    r = subprocess.run(
        [sys.executable, str(LIBRARY / f"{module}.py"), str(args_file)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )
    return dict(json.loads(r.stdout))


@pytest.fixture(scope="module")
def hgx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fakehost.build(fakehost.load("hgx-h100"), tmp_path_factory.mktemp("hgx") / "root")


def test_module_takes_table_options_and_defaults_for_real(hgx: Path, tmp_path: Path) -> None:
    common = {
        "root": str(hgx),
        "uri": "test:///default",
        "name": "passthrough-structure-ansible",
        "gpus": ["0000:18:00.0"],
        "require_handed_over": False,
        "_ansible_check_mode": True,
    }
    pinned = _run_module(tmp_path, **common)
    assert not pinned.get("failed"), pinned
    assert "<vcpupin vcpu='0'" in pinned["xml"]  # numa_pin's table default: on
    assert "<vcpu placement='static'>4</vcpu>" in pinned["xml"]  # vcpus' default
    # numa_pin and hide_hypervisor_cpuid were flags of render only before the table
    unpinned = _run_module(tmp_path, **common, numa_pin=False, hide_hypervisor_cpuid=True)
    assert not unpinned.get("failed"), unpinned
    assert "<vcpupin" not in unpinned["xml"]
    assert "<feature policy='disable' name='hypervisor'/>" in unpinned["xml"]


def test_module_refuses_what_the_table_refuses(hgx: Path, tmp_path: Path) -> None:
    common = {"root": str(hgx), "uri": "test:///default", "_ansible_check_mode": True}
    low = _run_module(tmp_path, **common, name="g", vcpus=0, require_handed_over=False)
    assert low["failed"] and low["msg"] == "vcpus: 0 is below the minimum of 1"
    bad = _run_module(tmp_path, **common, name="g", profile="macos")
    assert bad["failed"] and "profile" in bad["msg"] and "linux, windows" in bad["msg"]


def test_module_without_the_package_fails_with_the_reason(tmp_path: Path) -> None:
    """A target without passthrough: the import is blocked here (sys.modules entry None,
    as Python does for a failed import) and the module run as Ansible runs it."""
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"name": "g", "vcpus": 2}}))
    blocked = (
        "import runpy, sys; sys.modules['passthrough'] = None; "
        f"sys.argv = ['passthrough_vm', {str(args)!r}]; "
        f"sys.path.append({str(COLLECTIONS)!r}); "  # the module_utils, as Ansible packs them
        f"runpy.run_path({str(LIBRARY / 'passthrough_vm.py')!r}, run_name='__main__')"
    )
    r = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60)
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["failed"], out
    assert out["msg"].startswith("the passthrough Python package is not installed on the target")


def test_host_module_keeps_an_earlier_card_as_plan_does(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    """The host module reads its options through the same table and selection rule as
    `plan`: a second run naming another card keeps the first, and says so."""
    import shutil

    root = tmp_path / "root"
    shutil.copytree(hosts["hgx-h100"], root, symlinks=True)
    first = _run_module(tmp_path, "passthrough_host", root=str(root), gpus=["0000:18:00.0"])
    assert not first.get("failed") and first["changed"], first
    second = _run_module(
        tmp_path,
        "passthrough_host",
        root=str(root),
        gpus=["0000:19:00.0"],
        _ansible_check_mode=True,
    )
    assert not second.get("failed"), second
    planned = {c["address"] for c in second["plan"]["cards"]}
    assert planned == {"0000:18:00.0", "0000:19:00.0"}, second["plan"]["cards"]
    assert any(
        "kept from the earlier apply (release 0000:18:00.0" in n for n in second["plan"]["notes"]
    )
    wrong = _run_module(tmp_path, "passthrough_host", root=str(root), release=["0000:3b:00.0"])
    assert wrong["failed"] and wrong["msg"].startswith("release '0000:3b:00.0': not a card"), wrong


def test_the_modules_give_one_verdict_on_an_acs_override(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 31: the host module's plan tells the card's acs-override warning as plan does, and
    the KubeVirt preflight module gives it the same level (WARN, from the one policy table) and
    still proposes no node label."""
    root = str(hosts["acs-override-proxmox"])
    host = _run_module(tmp_path, "passthrough_host", root=root, _ansible_check_mode=True)
    assert not host.get("failed"), host
    assert any(n.endswith("[acs-override]") for n in host["plan"]["notes"]), host["plan"]
    kube = _run_module(tmp_path, "passthrough_kubevirt_preflight", root=root)
    assert kube["labels"] == {}, kube
    assert any(c["id"] == "acs-override" and c["level"] == "WARN" for c in kube["checks"])


def test_the_vm_module_refuses_a_guest_with_no_card_unless_no_gpu(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    common = {
        "root": str(hosts["iommu-off"]),
        "uri": "test:///default",
        "name": "nogpu",
        "require_handed_over": False,
        "_ansible_check_mode": True,
    }
    refused = _run_module(tmp_path, **common)
    assert refused["failed"] and "--no-gpu" in refused["msg"], refused
    rendered = _run_module(tmp_path, **common, no_gpu=True)
    assert not rendered.get("failed"), rendered
    assert "<hostdev" not in rendered["xml"]
