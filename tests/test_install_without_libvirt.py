# SPDX-License-Identifier: Apache-2.0
"""The host commands install and run without libvirt-python (issue 45, item 5).

libvirt-python is an extra (`passthrough[libvirt]`): PyPI ships it as source only, a C build
against libvirt's headers. Here the project is really installed by pip, from a copy of its
sources and without the extra, into a fresh venv (its other dependencies from pip's cache or
the index, as a user's `pip install` gets them); that venv cannot import libvirt. With it:
every module of the package imports, `scan`, `check`, `plan`, `apply --root` and `undo
--root` run on a sample host (undo puts every byte back), and `vm`, `validate --connect` and
the collection's VM module each say in one line how to get the binding, exit 4 (the libvirt
row of the exit codes) with nothing changed. CI's one install without the extra is this."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .test_apply import snapshot_tree
from .test_wheel import clean_env, copy_sources

REPO = Path(__file__).parents[1]
INSTALL_LINE = "libvirt-python is not installed: pip install 'passthrough[libvirt]'"
VM_MODULE = REPO / "playbooks/ansible_collections/passthrough/gpu/plugins/modules/passthrough_vm.py"

pytestmark = pytest.mark.slow  # a real pip install into a fresh venv: a minute or more


def _run(
    argv: list[str], env: dict[str, str], cwd: Path, rc: int = 0
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == rc, f"{argv}: rc {r.returncode}, not {rc}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    return r


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(a fresh venv holding `pip install <the sources>`, no extra; the environment to run it)."""
    tmp = tmp_path_factory.mktemp("nolibvirt")
    src = copy_sources(tmp / "src")
    env = clean_env()
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], env, tmp)
    _run([str(venv / "bin/python"), "-m", "pip", "install", "-q", str(src)], env, tmp)
    return venv, env


def test_the_venv_has_no_libvirt_and_every_module_imports(
    venv: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    path, env = venv
    py = str(path / "bin/python")
    probe = "try:\n    import libvirt\nexcept ImportError as exc:\n    print(exc)"
    assert _run([py, "-c", probe], env, tmp_path).stdout == "No module named 'libvirt'\n"
    shown = _run([py, "-m", "pip", "show", "libvirt-python"], env, tmp_path, rc=1)
    assert "not found" in shown.stderr.lower()
    # every module of the package, imported in that venv: none asks for libvirt when loaded
    every = (
        "import importlib, pkgutil, sys, passthrough\n"
        "names = [m.name for m in pkgutil.walk_packages(passthrough.__path__, 'passthrough.')\n"
        "         if not m.name.endswith('__main__')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "assert 'libvirt' not in sys.modules\n"
        "print(len(names), passthrough.__file__)\n"
    )
    count, where = _run([py, "-c", every], env, tmp_path).stdout.split()
    assert int(count) > 100
    assert Path(where).resolve().is_relative_to(path.resolve())  # the installed copy


def test_host_commands_run_and_vm_says_how_to_get_the_binding(
    venv: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    path, env = venv
    pt = str(path / "bin/passthrough")
    root = tmp_path / "hgx"
    _run([pt, "sample", "build", "hgx-h100", str(root)], env, tmp_path)
    scan = json.loads(_run([pt, "scan", "--root", str(root), "--json"], env, tmp_path).stdout)
    assert len([g for g in scan["gpus"] if g["viable"]]) == 8
    _run([pt, "check", "--root", str(root)], env, tmp_path)
    plan = json.loads(_run([pt, "plan", "--root", str(root), "--json"], env, tmp_path).stdout)
    assert plan["actions"]
    before = snapshot_tree(root)
    _run([pt, "apply", "--root", str(root)], env, tmp_path)
    assert "etc/default/grub.d/99-passthrough.cfg" in snapshot_tree(root)
    _run([pt, "undo", "--root", str(root)], env, tmp_path)
    assert snapshot_tree(root) == before  # every byte back
    xml = tmp_path / "g.xml"
    _run(
        [pt, "render", "--root", str(root), "--name", "g", "--gpu", "18:00.0", "-o", str(xml)],
        env,
        tmp_path,
    )
    _run([pt, "validate", str(xml)], env, tmp_path)
    # what needs libvirt says how to get it: one line, exit 4, nothing done
    for argv in (
        [pt, "vm", "status", "g"],
        [pt, "vm", "define", str(xml), "--connect", "test:///default"],
        [pt, "validate", "--connect", "test:///default", str(xml)],
        [str(path / "bin/passthrough-validate"), "--connect", "test:///default", str(xml)],
    ):
        r = _run(argv, env, tmp_path, rc=4)
        assert r.stdout == "", r.stdout
        (line,) = r.stderr.splitlines()
        assert line.split(": error: ", 1)[1].startswith(INSTALL_LINE), line


def test_the_vm_module_names_the_distro_package(
    venv: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """The collection's VM module, run by that venv's Python as Ansible runs a module (its
    arguments in a file, the collection's module_utils on the path): it fails in one line
    naming the package that provides the binding on this host's family."""
    path, env = venv
    args = tmp_path / "args.json"
    module_args = {"name": "g", "uri": "test:///default", "gpus": ["0000:18:00.0"]}
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": module_args}))
    r = subprocess.run(
        [str(path / "bin/python"), str(VM_MODULE), str(args)],
        env={**env, "PYTHONPATH": str(REPO / "playbooks")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["failed"], out
    assert out["msg"].startswith("install "), out["msg"]
    assert "passthrough imports libvirt (No module named 'libvirt')" in out["msg"], out["msg"]
