# SPDX-License-Identifier: Apache-2.0
"""The passthrough.gpu collection as a collection: it builds with ansible-galaxy (the guest
checks inside, one implementation with passthrough/guest), ansible-test sanity is
clean, and its domain comparison sees what matters and nothing libvirt adds by itself."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from passthrough import fakehost
from passthrough.host.discover import discover
from passthrough.vm.render import render
from passthrough.vm.spec import VmOptions, build_spec

REPO = Path(__file__).parents[1]
COLLECTIONS = REPO / "playbooks"
COLLECTION = COLLECTIONS / "ansible_collections/passthrough/gpu"
GUEST_UTILS = COLLECTION / "plugins/module_utils/passthrough_guest"
BIN = Path(sys.executable).parent
# ansible-test keeps its sanity virtual environments under $HOME/.ansible/test: a cache of
# its own, so that repeated runs install their pinned requirements once
SANITY_HOME = Path(
    os.environ.get("PASSTHROUGH_ANSIBLE_TEST_HOME", "/var/cache/passthrough-ansible-test")
)
# ansible-test bootstraps pip in each of those environments with a get-pip script it downloads
# from its own CI file host, which cannot be reached from here (the package index can). This
# stand-in, put where ansible-test caches that script, does the same from what is at hand:
# the interpreter's ensurepip, then the pinned pip from the index.
GET_PIP = '''"""Stand-in for pip's get-pip.py (see tests/test_collection.py)."""
import subprocess
import sys

ONLY_GET_PIP = {"--no-setuptools", "--no-wheel"}
args = [a for a in sys.argv[1:] if a not in ONLY_GET_PIP]
subprocess.run([sys.executable, "-m", "ensurepip", "--upgrade"], check=True, stdout=subprocess.DEVNULL)
subprocess.run([sys.executable, "-m", "pip", "install", *args], check=True)
'''


def test_guest_checks_are_one_implementation() -> None:
    """The guest checks live in the collection's module_utils (which Ansible packs into the
    module it sends to a guest without the package); passthrough/guest is links to them, one
    per module, so the CLI imports the same files. A new module without its link fails here."""
    package = REPO / "passthrough/guest"
    assert {p.name for p in package.glob("*.py")} == {p.name for p in GUEST_UTILS.glob("*.py")}
    for path in GUEST_UTILS.glob("*.py"):
        assert not path.is_symlink()  # ansible-test allows no links out of the collection
        link = package / path.name
        assert link.is_symlink() and link.resolve() == path.resolve()


def _galaxy_build(out: Path) -> Path:
    r = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(out)],
        cwd=COLLECTION,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (built,) = out.glob("passthrough-gpu-*.tar.gz")
    return built


def test_galaxy_build_carries_the_guest_checks_as_files(tmp_path: Path) -> None:
    built = _galaxy_build(tmp_path)
    with tarfile.open(built) as tar:
        names = set(tar.getnames())
        for module in ("passthrough_check", "passthrough_host", "passthrough_vm"):
            assert f"plugins/modules/{module}.py" in names
        assert "roles/passthrough_guest/tasks/main.yml" in names
        assert "meta/runtime.yml" in names
        for link in GUEST_UTILS.glob("*.py"):
            member = tar.getmember(f"plugins/module_utils/passthrough_guest/{link.name}")
            assert member.isfile(), link.name
            data = tar.extractfile(member)
            assert data is not None and data.read() == link.read_bytes()
        assert not any(n.startswith("tests/output") for n in names)


@pytest.mark.slow
def test_ansible_test_sanity_is_clean() -> None:
    """Every sanity test of ansible-test, none skipped; the one thing ignored (the GPLv3 header
    validate-modules wants: the modules are Apache-2.0) is in tests/sanity/ignore-2.19.txt."""
    cache = SANITY_HOME / ".ansible/test/cache"
    cache.mkdir(parents=True, exist_ok=True)
    import ansible_test

    pins = Path(ansible_test.__file__).parent / "_internal/python_requirements.py"
    for version in set(re.findall(r"pip='([\d.]+)'", pins.read_text())):
        (cache / f"get_pip_{version.replace('.', '_')}.py").write_text(GET_PIP)
    env = {
        **os.environ,
        "HOME": str(SANITY_HOME),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "NO_COLOR": "1",
    }
    try:
        r = subprocess.run(
            [str(BIN / "ansible-test"), "sanity", "--python", "3.11", "--local", "--color", "no"],
            cwd=COLLECTION,
            capture_output=True,
            text=True,
            check=False,
            env=env,
            timeout=900,
        )
    finally:
        shutil.rmtree(COLLECTION / "tests/output", ignore_errors=True)
    tail = "\n".join(line for line in r.stdout.splitlines() if "ERROR" in line) + r.stderr[-4000:]
    assert r.returncode == 0, tail
    ran = [line for line in r.stdout.splitlines() if line.startswith("Running sanity test")]
    assert len(ran) >= 24, ran  # all of them, the ones in virtual environments included


@pytest.fixture(scope="module")
def domain_utils() -> object:
    if str(COLLECTIONS) not in sys.path:
        sys.path.append(str(COLLECTIONS))  # as Ansible packs them: the collection's module_utils
    from ansible_collections.passthrough.gpu.plugins.module_utils import domain

    return domain


def _rendered(tmp_path: Path, **options: object) -> str:
    root = tmp_path / "root"
    if not root.exists():
        fakehost.build(fakehost.load("hgx-h100"), root)
    host = discover(str(root))
    opts = VmOptions(name="passthrough-collection-compare", **options)  # type: ignore[arg-type]
    return render(build_spec(host, opts))


@pytest.mark.usefixtures("libvirtd")
def test_domain_as_libvirt_keeps_it_equals_the_rendering(
    domain_utils: object, tmp_path: Path
) -> None:
    """The real libvirtd rewrites the XML: UUID, KiB, the machine type, addresses, controllers,
    devices grouped by kind. None of that is a difference; a changed vCPU count, a card more or
    less is."""
    import libvirt

    d: object = domain_utils
    two = _rendered(tmp_path, gpus=("0000:18:00.0", "0000:19:00.0"), vcpus=4)
    conn = libvirt.open("qemu:///system")
    try:
        assert d.lookup(conn, "passthrough-collection-compare") is None  # type: ignore[attr-defined]
        dom = conn.defineXML(two)
        kept = d.inactive_xml(dom)  # type: ignore[attr-defined]
        assert kept != two and "<uuid>" in kept
        before, after = d.compare(kept, two)  # type: ignore[attr-defined]
        assert before == after
        more = two.replace("<vcpu placement='static'>4</vcpu>", "<vcpu placement='static'>6</vcpu>")
        before, after = d.compare(kept, more)  # type: ignore[attr-defined]
        assert before != after and '<vcpu placement="static">4' in before
        one = _rendered(tmp_path, gpus=("0000:18:00.0",), vcpus=4)
        before, after = d.compare(kept, one)  # type: ignore[attr-defined]
        assert 'bus="0x19"' in before and 'bus="0x19"' not in after  # the card that goes
        redefined = conn.defineXML(d.with_uuid(one, dom.UUIDString()))  # type: ignore[attr-defined]
        assert redefined.UUIDString() == dom.UUIDString()
        before, after = d.compare(d.inactive_xml(redefined), one)  # type: ignore[attr-defined]
        assert before == after
    finally:
        dom = d.lookup(conn, "passthrough-collection-compare")  # type: ignore[attr-defined]
        if dom is not None:
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        conn.close()


def _bare_inventory(tmp_path: Path, venv: Path, root: Path, **more: object) -> Path:
    """A local host as a bare one looks to the collection: the system's python3, which has no
    passthrough (nor jinja2, lxml, libvirt), and a venv path of its own; become through the
    real sudo."""
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        "passthrough_root": str(root),
        "passthrough_runtime_venv": str(venv),
        "passthrough_vm_uri": "test:///default",
        "passthrough_vm_wait_ssh": False,
        "passthrough_vm_guests": [{"name": "g1", "gpus": ["0000:01:00.0"], "vcpus": 2}],
        **more,
    }
    inv = tmp_path / "bare.yml"
    inv.write_text(json.dumps({"gpu_hosts": {"hosts": {"bare": host}}}))
    return inv


def test_a_bare_host_gets_the_controllers_library_once(tmp_path: Path) -> None:
    """The first run (check mode even) builds the controller's wheel, copies it over and
    installs it into a venv seeing the system's site packages; the module runs with that
    venv. A second run changes nothing and is faster; a venv holding another version is
    replaced; what the VM module needs from the distro is named by package, one line."""
    from passthrough.provision.runner import run, summary_table

    probe = "import passthrough"
    bare = subprocess.run(["/usr/bin/python3", "-c", probe], cwd=tmp_path, capture_output=True)
    assert bare.returncode == 1 and b"No module named 'passthrough'" in bare.stderr
    root = fakehost.build(fakehost.load("consumer-intel"), tmp_path / "root")
    venv = tmp_path / "venv"
    inv = _bare_inventory(tmp_path, venv, root)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # the wheel is built for this test
    check = run(str(inv), "host.yml", check=True, env=env)
    assert check.ok and check.hosts["bare"].changed == 1, summary_table(check)
    assert not (root / "etc/default/grub.d/99-passthrough.cfg").exists()
    marker = (venv / "passthrough-runtime").read_text().strip()
    assert marker.startswith("0.1.0+") and len(list((tmp_path / "cache").rglob("*.whl"))) == 1
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    r = subprocess.run(
        [str(venv / "bin/python"), "-c", "import passthrough; print(passthrough.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.startswith(str(venv))  # the venv's own copy, not the checkout
    first = run(str(inv), "host.yml", env=env)
    assert first.ok and first.hosts["bare"].changed == 1 and first.hosts["bare"].reboot
    assert (root / "etc/default/grub.d/99-passthrough.cfg").exists()
    log = tmp_path / "again.log"  # -vvv: every command the connection runs is named
    again = run(
        str(inv), "host.yml", env=env, log_path=str(log), verbosity=3, progress=lambda _l: None
    )
    assert again.ok and again.hosts["bare"].changed == 0, summary_table(again)
    assert again.seconds < check.seconds
    # the no-op is one command on the host: the library's task under the venv's interpreter,
    # which reads the identity itself; no probe command (a `cat` of the identity file) before
    # it, no module wrapper sent over (no temporary directory made, filled, removed)
    execs = [line for line in log.read_text().splitlines() if "EXEC " in line]
    ran = [line for line in execs if "-I -m passthrough.hosttask" in line]
    assert len(ran) == 1 and str(venv / "bin/python") in ran[0], execs
    assert len(execs) == 1, execs
    assert not [line for line in execs if "AnsiballZ" in line or "passthrough-runtime" in line]
    (venv / "passthrough-runtime").write_text("0.0.1+older\n")
    newer = run(str(inv), "host.yml", env=env)
    assert newer.ok and newer.hosts["bare"].changed == 1, summary_table(newer)
    assert (venv / "passthrough-runtime").read_text().strip() == marker
    # what this host's python3 lacks of the VM module's bindings (python3-libvirt comes with
    # virtinst, which the guest tests install): the message names exactly those
    lacks = sorted(
        package
        for module, package in (
            ("jinja2", "python3-jinja2"),
            ("libvirt", "python3-libvirt"),
            ("lxml", "python3-lxml"),
        )
        if subprocess.run(
            ["/usr/bin/python3", "-c", f"import {module}"], capture_output=True
        ).returncode
    )
    assert lacks, "this test needs a python3 without one of jinja2, libvirt, lxml"
    wanted = f"install {' '.join(lacks)} on this host"
    vm = run(str(inv), "vm.yml", env=env)
    assert not vm.ok
    reason = vm.hosts["bare"].reason or ""
    assert wanted in reason, reason
    fresh = _bare_inventory(tmp_path, tmp_path / "venv2", root)
    vm = run(str(fresh), "vm.yml", env=env)
    reason = vm.hosts["bare"].reason or ""
    assert wanted in reason, reason
    assert "passthrough_runtime_install_packages: true" in reason
    assert not (tmp_path / "venv2/passthrough-runtime").exists()


def test_galaxy_install_brings_the_declared_dependencies(tmp_path: Path) -> None:
    """The built collection installs with its dependencies resolved (kubernetes.core, with
    a version range) and ansible-doc then finds its modules from any directory."""
    built = _galaxy_build(tmp_path)
    target = tmp_path / "collections"
    install = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", str(built), "-p", str(target)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    out = install.stdout + install.stderr
    assert install.returncode == 0 and "kubernetes.core" in out, out
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(HOME=str(tmp_path), ANSIBLE_COLLECTIONS_PATH=str(target))
    doc = subprocess.run(
        [str(BIN / "ansible-doc"), "passthrough.gpu.passthrough_runtime"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert doc.returncode == 0 and str(target) in doc.stdout, doc.stdout + doc.stderr


def test_domain_comparison_reads_pci_addresses_as_libvirt_does(
    domain_utils: object, tmp_path: Path
) -> None:
    """A hostdev address written in decimal (bus='24', as libvirt reads it: base 0) is the
    rendering's bus='0x18'; a real other bus (bus='0x24') is a difference."""
    d: object = domain_utils
    two = _rendered(tmp_path, gpus=("0000:18:00.0", "0000:19:00.0"), vcpus=4)
    assert "bus='0x18'" in two
    decimal = two.replace("bus='0x18'", "bus='24'")
    before, after = d.compare(decimal, two)  # type: ignore[attr-defined]
    assert before == after
    other = two.replace("bus='0x18'", "bus='0x24'")
    before, after = d.compare(other, two)  # type: ignore[attr-defined]
    assert before != after and 'bus="0x24"' in before


def test_the_runtime_probe_reads_its_own_lines_whatever_a_host_prints_first() -> None:
    """A login or sudo may print first (sudo's 'unable to resolve host' warning reaches stdout
    through Ansible's terminal, as the lab found): the probe's tagged lines are still read,
    so a host that has the runtime is not reinstalled on every run."""
    if str(COLLECTIONS) not in sys.path:
        sys.path.append(str(COLLECTIONS))
    from ansible_collections.passthrough.gpu.plugins.plugin_utils.runtime import (
        HAVE,
        LACKING,
        parse_probe,
    )

    warning = "sudo: unable to resolve host lab-host: Temporary failure in name resolution"
    assert parse_probe(f"{warning}\n{HAVE}0.1.0+abc\n") == ("0.1.0+abc", [])
    assert parse_probe(f"{HAVE}0.1.0+abc\n{LACKING} jinja2 lxml\n") == (
        "0.1.0+abc",
        ["jinja2", "lxml"],
    )
    assert parse_probe(f"{warning}\n{HAVE}\n{LACKING} venv\n") == ("", ["venv"])
    assert parse_probe(warning) == ("", [])  # nothing of ours: install


MODULE = "passthrough.gpu.passthrough_runtime"


def _runtime(tmp_path: Path, venv: str, wheel: Path) -> dict[str, object]:
    """The real passthrough_runtime module, run by the real ``ansible`` on localhost."""
    args = json.dumps({"venv": venv, "identity": "0.1.0+test", "wheel": str(wheel)})
    r = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-c", "local", "-o", "-m", MODULE, "-a", args],
        cwd=REPO,  # ansible.cfg: this checkout's collection
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "ANSIBLE_LOCALHOST_WARNING": "False"},
    )
    status, _arrow, out = r.stdout.partition("=>")
    result: dict[str, object] = json.loads(out.strip() or r.stdout)
    result.setdefault("failed", "FAILED!" in status)  # the one-line form keeps it there
    return result


def _tiny_wheel(tmp_path: Path) -> Path:
    import zipfile

    wheel = tmp_path / "passthrough-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("passthrough/__init__.py", "")
    return wheel


@pytest.mark.parametrize("how", ["data-directory", "dotdot", "link"])
def test_the_runtime_module_clears_only_a_venv_it_made(how: str, tmp_path: Path) -> None:
    """Issue 30: ``python -m venv --clear`` emptied any existing directory given as the venv,
    ``venv/..`` included. A directory this module did not make is refused (failed, one
    line, nothing changed); one it made is cleared and made again."""
    wheel = _tiny_wheel(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    (data / "keep.txt").write_text("an admin's data\n")
    ours = data / "venv"
    made = _runtime(tmp_path, str(ours), wheel)
    assert made.get("changed") is True, made
    assert (ours / "passthrough-runtime-made").is_file()
    given = {"data-directory": str(data), "dotdot": f"{ours}/..", "link": str(tmp_path / "ln")}
    if how == "link":
        (tmp_path / "ln").symlink_to(data)
    r = _runtime(tmp_path, given[how], wheel)
    assert r.get("failed") is True and r.get("changed") is False, r
    msg = str(r["msg"])
    assert "\n" not in msg, msg
    assert msg.startswith(f"venv {data}:") or f"(that is {data}):" in msg, msg
    assert "not a venv this module made" in msg, msg
    assert (data / "keep.txt").read_text() == "an admin's data\n"
    assert (ours / "passthrough-runtime").is_file()
    # the module's own venv, an older identity in it: cleared and made again
    (ours / "passthrough-runtime").write_text("0.0.1+older\n")
    (ours / "stale.txt").write_text("left by the older install\n")
    again = _runtime(tmp_path, str(ours), wheel)
    assert again.get("changed") is True, again
    assert not (ours / "stale.txt").exists()
    assert (ours / "passthrough-runtime").read_text() == "0.1.0+test\n"
