# SPDX-License-Identifier: Apache-2.0
"""The wheel is complete: built from the sources, installed into a fresh venv outside the
checkout, and used from a directory that is not the checkout — `sample build`, `render`
(the template from the wheel) and `provision --check` on the sample inventory (the playbooks,
roles and modules from the wheel, the modules run by that venv's Python).

The fresh venv reuses this environment's installed dependencies (libvirt-python, ansible-core,
...: compiling or downloading them is not what is tested) through a .pth line appended after
its own site-packages, so `passthrough` itself can only come from the wheel; the test asserts
that. pip writes console scripts only for what it installs, so the venv's `ansible-playbook`
launcher is written here from ansible-core's own entry point, as pip would write it."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from passthrough import fakehost
from passthrough.host.discover import discover
from passthrough.vm.render import render
from passthrough.vm.spec import VmOptions, build_spec

REPO = Path(__file__).parents[1]
# what the build reads (pyproject.toml, setup.py and MANIFEST.in say what goes in)
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "passthrough", "templates")
SOURCES += ("playbooks", "docs")

COLLECTION = "ansible_collections/passthrough/gpu"

pytestmark = pytest.mark.slow


def copy_sources(src: Path) -> Path:
    """What the build reads, copied to ``src`` (outside the checkout: a build writes beside
    its sources)."""
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=skip)
        else:
            shutil.copy2(REPO / name, src / name)
    return src


def clean_env() -> dict[str, str]:
    """This environment without what would point a fresh venv back at the checkout."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "PASSTHROUGH_"))}


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{argv}: rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(the fresh venv, an environment that uses it and not the checkout)."""
    major = int(importlib.metadata.version("setuptools").split(".")[0])
    assert major >= 77, "building needs setuptools>=77 (pip install -e '.[test]' brings it)"
    tmp = tmp_path_factory.mktemp("wheel")
    src = copy_sources(tmp / "src")
    env = clean_env()
    dist = tmp / "dist"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    _run([*pip_wheel, "-w", str(dist), "."], src, env)
    (wheel,) = dist.glob("passthrough-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp, env)
    py = venv / "bin/python"
    purelib = Path(
        _run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env
        ).stdout.strip()
    )
    # this environment's site directories, the ones a .pth of its own added included
    reused = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    (purelib / "zz-reuse-dependencies.pth").write_text("".join(f"{p}\n" for p in reused))
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], tmp, env)
    for ep in importlib.metadata.distribution("ansible-core").entry_points:
        if ep.group == "console_scripts":
            launcher = venv / "bin" / ep.name
            launcher.write_text(
                f"#!{py}\nimport sys\nfrom {ep.module} import {ep.attr}\nsys.exit({ep.attr}())\n"
            )
            launcher.chmod(0o755)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp / "home")
    return venv, env


def test_wheel_carries_templates_playbooks_and_schemas(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    venv, env = installed
    where = _run(
        [
            str(venv / "bin/python"),
            "-c",
            "import passthrough, passthrough.provision.runner as a, passthrough.vm.render as r;"
            "print(passthrough.__file__); print(a.playbooks_dir()); print(r.templates_dir())",
        ],
        tmp_path,
        env,
    ).stdout.split()
    for path in where:
        assert Path(path).resolve().is_relative_to(venv.resolve()), where
    package = Path(where[0]).parent
    for part in (
        "data/templates/domain.xml.j2",
        "data/playbooks/site.yml",
        "data/playbooks/ansible.cfg",
        f"data/playbooks/{COLLECTION}/galaxy.yml",
        f"data/playbooks/{COLLECTION}/plugins/modules/passthrough_vm.py",
        # the guest checks travel as a copy, not as the checkout's link out of the tree
        f"data/playbooks/{COLLECTION}/plugins/module_utils/passthrough_guest/check.py",
        f"data/playbooks/{COLLECTION}/roles/passthrough_vm/meta/argument_specs.yml",
        "schemas/scan-v1.schema.json",
        "py.typed",
    ):
        assert (package / part).is_file(), part
    # the checkout's links out of the collection are files in the wheel
    assert not (
        package / f"data/playbooks/{COLLECTION}/plugins/module_utils/passthrough_guest/check.py"
    ).is_symlink()
    (wheel,) = (venv.parent / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = z.read(name).decode()
    assert "License-Expression: Apache-2.0" in metadata


def test_wheel_installs_the_man_pages_where_man_finds_them(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """The pages land in <venv>/share/man/man1, equal to docs/man, and the real man finds
    `passthrough-scan` there by the venv's bin/ on PATH alone (no MANPATH)."""
    venv, env = installed
    pages = venv / "share/man/man1"
    committed = sorted(p.name for p in (REPO / "docs/man").glob("*.1"))
    assert sorted(p.name for p in pages.glob("*.1")) == committed
    for name in committed:
        assert (pages / name).read_text() == (REPO / "docs/man" / name).read_text(), name
    env = {k: v for k, v in env.items() if k != "MANPATH"}
    r = subprocess.run(
        ["man", "-w", "passthrough-scan"], env=env, capture_output=True, text=True, check=False
    )
    assert (
        r.returncode == 0
        and Path(r.stdout.strip()).resolve() == (pages / "passthrough-scan.1").resolve()
    ), r.stderr


def test_render_from_the_wheel_is_the_checkouts_render(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    venv, env = installed
    pt = str(venv / "bin/passthrough")
    _run([pt, "sample", "build", "hgx-h100", "host"], tmp_path, env)
    args = ["--root", "host", "--name", "wheel-guest", "--gpu", "0000:18:00.0", "--vcpus", "8"]
    _run([pt, "render", *args, "-o", "guest.xml"], tmp_path, env)
    xml = (tmp_path / "guest.xml").read_text()
    here = fakehost.build(fakehost.load("hgx-h100"), tmp_path / "here")
    spec = build_spec(
        discover(str(here)), VmOptions(name="wheel-guest", gpus=("0000:18:00.0",), vcpus=8)
    )
    assert xml == render(spec)
    assert "<address domain='0x0000' bus='0x18' slot='0x00' function='0x0'/>" in xml


def test_provision_check_from_the_wheel(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    venv, env = installed
    shutil.copy2(REPO / "inventory/sample/hosts.yml", tmp_path / "hosts.yml")
    provision = [str(venv / "bin/passthrough"), "provision", "-i", "hosts.yml", "--sample"]
    r = _run([*provision, "--check", "--json", "--log", str(tmp_path / "log")], tmp_path, env)
    report = json.loads(r.stdout)
    assert report["ok"], report
    # the host plan and the guest both report what they would change; nothing failed
    assert report["hosts"]["sample-hgx"]["changed"] == 2, report
    log = (tmp_path / "log").read_text()
    assert "TASK [passthrough.gpu.passthrough_vm : Define and start the guests]" in log
