# SPDX-License-Identifier: Apache-2.0
"""The host role's task run as the library's own command under the host's runtime venv
(passthrough/hosttask.py, the action's ``_direct``) against the same task through Ansible's
module wrapper (``passthrough_runtime: none``): real ``ansible``, real sudo, sample roots."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest

from passthrough import fakehost

REPO = Path(__file__).parents[1]
BIN = Path(sys.executable).parent
MODULE = "passthrough.gpu.passthrough_host"
# what the two ways may differ in: Ansible's own bookkeeping, the transaction's time stamp
TRANSPORT = {"invocation", "transaction", "_ansible_no_log", "warnings", "deprecations"}


def _ad_hoc(
    tmp_path: Path,
    root: Path,
    runtime: str,
    args: dict[str, Any],
    *opts: str,
    how: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One task on a local host through the real ``ansible`` (become through the real sudo),
    the host's library in a venv of its own (``venv``) or this interpreter's (``none``);
    ``how``: the host reached another way (SSH)."""
    host = {
        "ansible_connection": "local",
        "passthrough_runtime": runtime,
        "ansible_python_interpreter": sys.executable if runtime == "none" else "/usr/bin/python3",
        "passthrough_runtime_venv": str(tmp_path / "host-venv"),
        **(how or {}),
    }
    inv = tmp_path / f"{runtime}.json"
    inv.write_text(json.dumps({"all": {"hosts": {"h": host}}}))
    r = subprocess.run(
        [
            str(BIN / "ansible"),
            "h",
            "-i",
            str(inv),
            "-b",
            "-m",
            MODULE,
            "-a",
            json.dumps(args),
            *opts,
        ],
        cwd=REPO,  # ansible.cfg: this checkout's collection
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={
            **os.environ,
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
            "ANSIBLE_STDOUT_CALLBACK": "json",
            "XDG_CACHE_HOME": str(tmp_path / "cache"),  # the wheel is built for this test
        },
    )
    doc = json.loads(r.stdout[r.stdout.index("{") :])
    result: dict[str, Any] = doc["plays"][0]["tasks"][0]["hosts"]["h"]
    return result


def _same(result: dict[str, Any], root: Path) -> dict[str, Any]:
    """The result as it reads whichever way it came: the root's path and Ansible's
    bookkeeping out."""
    kept = {k: v for k, v in result.items() if k not in TRANSPORT and not k.startswith("_")}
    out: dict[str, Any] = json.loads(json.dumps(kept).replace(str(root), "ROOT"))
    return out


@pytest.mark.fleet
def test_the_direct_command_gives_what_the_module_gives(tmp_path: Path) -> None:
    """Check mode with its diff, apply, the no-op, a refusal with its code, a required
    readiness check that fails, undo: the same result from the command under the venv as
    from Ansible's module, and the same files on the host."""
    cases: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
        ("consumer-intel", {}, ("--check", "--diff")),
        ("consumer-intel", {}, ()),
        ("consumer-intel", {}, ()),  # nothing left to do
        ("amd-b550-chipset", {"gpus": ["0000:2b:00.0"], "include_group": True}, ()),
        ("iommu-off", {"iommu_only": True, "preflight": ["iommu-enabled"]}, ()),
        ("consumer-intel", {"state": "absent"}, ()),
    ]
    seen: dict[str, list[dict[str, Any]]] = {}
    trees: dict[str, dict[str, bytes]] = {}
    for runtime in ("none", "venv"):
        roots: dict[str, Path] = {}
        for sample, args, opts in cases:
            if sample not in roots:
                roots[sample] = fakehost.build(fakehost.load(sample), tmp_path / runtime / sample)
            root = roots[sample]
            got = _ad_hoc(tmp_path, root, runtime, {"root": str(root), **args}, *opts)
            seen.setdefault(runtime, []).append(_same(got, root))
        trees[runtime] = {
            str(p.relative_to(tmp_path / runtime)): p.read_bytes()
            for p in sorted((tmp_path / runtime).rglob("*"))
            if p.is_file() and "/var/lib/passthrough/" not in str(p)
        }
    none, venv = seen["none"], seen["venv"]
    # the venv's first task installed the library (said so), then ran the task itself
    assert venv[0].pop("runtime_installed").startswith("0.1.0+")
    assert none == venv
    check, applied, again, refused, preflight, undone = venv
    assert check["changed"] and check["diff"] and check["reboot_required"]
    assert applied["changed"] and not again["changed"]
    assert refused["failed"] and refused["exit_code"] == 2, refused
    assert "route-nic-in-group" in refused["codes"], refused
    assert preflight["failed"] and preflight["msg"].startswith("preflight: iommu-enabled failed")
    assert undone["changed"] and undone["restored"]
    assert trees["none"] == trees["venv"]


@pytest.mark.fleet
def test_a_venv_without_the_command_is_installed_again(tmp_path: Path) -> None:
    """A venv whose library lacks the command (an older one, or a broken copy) under the right
    identity file: the task installs the controller's library and then runs; a wrong option
    is refused with Ansible's own message, nothing run."""
    root = fakehost.build(fakehost.load("consumer-intel"), tmp_path / "root")
    first = _ad_hoc(tmp_path, root, "venv", {"root": str(root)}, "--check")
    assert first["changed"] and "runtime_installed" in first, first
    lib = next((tmp_path / "host-venv/lib").glob("python3*/site-packages/passthrough"))
    (lib / "hosttask.py").unlink()
    shutil.rmtree(lib / "__pycache__", ignore_errors=True)
    again = _ad_hoc(tmp_path, root, "venv", {"root": str(root)}, "--check")
    assert again.get("runtime_installed") == first["runtime_installed"], again
    assert (lib / "hosttask.py").is_file()
    shutil.rmtree(lib)  # no library at all: Python names the package quoted
    third = _ad_hoc(tmp_path, root, "venv", {"root": str(root)}, "--check")
    assert third.get("runtime_installed") == first["runtime_installed"], third
    assert (lib / "hosttask.py").is_file()
    wrong = _ad_hoc(tmp_path, root, "venv", {"root": str(root), "bogus": 1}, "--check")
    assert wrong["failed"] and "Unsupported parameters" in wrong["msg"], wrong
    assert "bogus" in wrong["msg"]


@pytest.mark.fleet
@pytest.mark.root
def test_over_ssh_a_venv_from_before_the_command_is_installed_again(tmp_path: Path) -> None:
    """Over a real SSH connection (a network namespace with its own sshd,
    benchmarks/sshfleet.py), where the command runs on a terminal and the host's stderr
    comes back in stdout: a venv whose library lacks the command is installed again, and the
    next run is the command alone."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import sshfleet

    assert sshfleet.missing() is None, sshfleet.missing()  # setup.sh test installs sshd
    root = fakehost.build(fakehost.load("consumer-intel"), tmp_path / "root")
    with sshfleet.hosts(1, tmp_path / "ssh") as ssh:
        how = {**ssh, "ansible_connection": "ssh", "ansible_host": sshfleet.address(0)}
        first = _ad_hoc(tmp_path, root, "venv", {"root": str(root)}, "--check", how=how)
        assert first["changed"] and "runtime_installed" in first, first
        lib = next((tmp_path / "host-venv/lib").glob("python3*/site-packages/passthrough"))
        (lib / "hosttask.py").unlink()
        shutil.rmtree(lib / "__pycache__", ignore_errors=True)
        again = _ad_hoc(tmp_path, root, "venv", {"root": str(root)}, "--check", how=how)
        assert again.get("runtime_installed") == first["runtime_installed"], again
        third = _ad_hoc(tmp_path, root, "venv", {"root": str(root)}, "--check", how=how)
        assert "runtime_installed" not in third and third["changed"], third
        assert _same(third, root)["plan"] == _same(first, root)["plan"]


@pytest.mark.fleet
def test_the_action_refuses_a_venv_path_a_shebang_cannot_hold(tmp_path: Path) -> None:
    """Issue 46: a venv path with a space went into Ansible's interpreter line and the
    console scripts' #! line, where the kernel cuts it at the space. The action refuses it
    before anything runs on the host (real ansible, local connection)."""
    root = fakehost.build(fakehost.load("consumer-intel"), tmp_path / "root")
    venv = tmp_path / "pass through" / "venv"
    result = _ad_hoc(
        tmp_path,
        root,
        "venv",
        {"root": str(root)},
        "--check",
        how={"passthrough_runtime_venv": str(venv)},
    )
    assert result.get("failed") is True, result
    assert "#! line cannot hold" in result["msg"] and "nothing changed" in result["msg"]
    assert not venv.parent.exists()


def test_a_stale_venv_is_told_before_the_library_is_imported(tmp_path: Path) -> None:
    """The command reads the venv's identity file first: where it is not the one expected it
    says so and imports nothing of the library's beyond itself (an older library must not act
    for the controller's)."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "passthrough-runtime").write_text("0.0.1+older\n")
    payload = {
        "params": {"root": str(tmp_path), "state": "present"},
        "check_mode": True,
        "runtime": {"identity": "0.1.0+new", "venv": str(venv), "requires": []},
    }
    code = (
        "import sys\n"
        "from passthrough import hosttask\n"
        "hosttask.main(sys.argv[1:])\n"
        "print(sorted(m for m in sys.modules if m.startswith('passthrough')))\n"
    )
    encoded = base64.b64encode(json.dumps(payload).encode()).decode()
    r = subprocess.run(
        [sys.executable, "-c", code, encoded], capture_output=True, text=True, check=True, cwd=REPO
    )
    line, modules = r.stdout.splitlines()
    result = json.loads(line.removeprefix("passthrough-task-result:"))
    assert result["passthrough_runtime"] == {"have": "0.0.1+older", "lacking": []}
    assert not result["changed"] and "plan" not in result
    assert json.loads(modules.replace("'", '"')) == ["passthrough", "passthrough.hosttask"]


def _action_utils() -> Any:
    if str(REPO / "playbooks") not in sys.path:
        sys.path.append(str(REPO / "playbooks"))
    from ansible_collections.passthrough.gpu.plugins.plugin_utils import runtime

    return runtime


def test_a_command_that_cannot_start_is_told_from_either_stream(tmp_path: Path) -> None:
    """What the real interpreter says where a venv has no library (the package's name quoted)
    or one without the command, read from stderr (local) or from stdout (over SSH the command
    runs on a terminal, ``ssh -tt``, which merges the host's stderr into it); a failure of
    another kind, or none, is not taken for a missing runtime."""
    runtime = _action_utils()
    empty = subprocess.run(
        ["/usr/bin/python3", "-I", "-m", "passthrough.hosttask"], capture_output=True, text=True
    )
    # a venv of its own holding an old library (this environment's editable install, whose
    # finder would hand out the checkout's passthrough.hosttask, is not on its path)
    old = tmp_path / "old"
    venv.create(old, with_pip=False)
    purelib = subprocess.run(
        [old / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "passthrough").mkdir()
    (Path(purelib) / "passthrough/__init__.py").write_text('__version__ = "0.0.1"\n')
    older = subprocess.run(
        [old / "bin/python", "-m", "passthrough.hosttask"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "No module named 'passthrough'" in empty.stderr, empty.stderr
    assert "No module named passthrough.hosttask" in older.stderr, older.stderr
    for said, python in ((empty, "/usr/bin/python3"), (older, str(old / "bin/python"))):
        assert runtime.cannot_run(said.returncode, "", said.stderr, python)
        assert runtime.cannot_run(said.returncode, said.stderr.replace("\n", "\r\n"), "", python)
    assert runtime.cannot_run(127, "", "sh: 1: /opt/x/bin/python: not found", "/opt/x/bin/python")
    crash = "Traceback (most recent call last):\nZeroDivisionError: division by zero\n"
    assert not runtime.cannot_run(1, crash, "", sys.executable)
    assert not runtime.cannot_run(0, "", "", sys.executable)


def test_a_failure_that_merely_quotes_the_words_forces_no_reinstall() -> None:
    """Issue 46: any output holding "No module named passthrough" forced a reinstall. Only the
    interpreter's own line for the venv's python counts: not a traceback's last line, not a
    log line quoting it, not another interpreter's words."""
    runtime = _action_utils()
    python = "/opt/passthrough/venv/bin/python"
    quoted = (
        "Traceback (most recent call last):\n"
        "ModuleNotFoundError: No module named 'passthrough_plugins'\n",
        "apply: the guest said: No module named 'passthrough'\n",
        "/usr/bin/python3: No module named passthrough.hosttask\n",
        f"note: {python}: No module named passthrough.hosttask\n",
    )
    for text in quoted:
        assert not runtime.cannot_run(1, text, "", python), text
        assert not runtime.cannot_run(1, "", text, python), text
    assert runtime.cannot_run(1, f"{python}: No module named passthrough.hosttask\r\n", "", python)


def test_the_result_line_is_read_whatever_comes_before_it() -> None:
    """A sudo warning before the tagged line is passed over; a line cut short, or no line, is
    no result (the action then reports the failure with the output)."""
    from passthrough.hosttask import RESULT

    runtime = _action_utils()
    assert runtime.DIRECT_RESULT == RESULT
    warning = "sudo: unable to resolve host lab-host: Temporary failure in name resolution"
    line = runtime.DIRECT_RESULT + json.dumps({"changed": False, "plan": {"actions": []}})
    assert runtime.direct_result(f"{warning}\r\n{line}\r\n") == {
        "changed": False,
        "plan": {"actions": []},
    }
    assert runtime.direct_result(f"{warning}\n{line[:-5]}\n") is None
    assert runtime.direct_result(warning) is None
    assert runtime.direct_result(runtime.DIRECT_RESULT + "[1, 2]") is None


def _no_meminfo(tmp_path: Path) -> Path:
    root = fakehost.build(fakehost.load("consumer-intel"), tmp_path / "root")
    (root / "proc/meminfo").unlink()
    return root


def test_the_host_task_refuses_unsized_hugepages_as_apply_does(tmp_path: Path) -> None:
    """Issue 46: `apply --hugepages-1g` on a root that reports no RAM is refused (exit 2,
    nothing written); the host task wrote the same request without a word. Now refused
    alike, in check mode as in a real run, naming the figure and the way to write it
    anyway; pages left out (kept from an earlier apply) are not asked about."""
    from passthrough.hosttask import MARKER, RESULT

    from .conftest import tree_hash

    root = _no_meminfo(tmp_path)
    before = tree_hash(root)
    # the command as the action runs it, in a "venv" whose identity file is the expected one
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / MARKER).write_text("0.1.0+this\n")
    runtime = {"identity": "0.1.0+this", "venv": str(tmp_path / "venv"), "requires": []}

    def outcome(check: bool, **params: Any) -> dict[str, Any]:
        payload = {"params": {"root": str(root), "state": "present", **params}}
        payload.update(check_mode=check, runtime=runtime)
        encoded = base64.b64encode(json.dumps(payload).encode())
        r = subprocess.run(
            [sys.executable, "-I", "-m", "passthrough.hosttask", encoded.decode()],
            capture_output=True,
            text=True,
            check=True,
            cwd=tmp_path,
        )
        result: dict[str, Any] = json.loads(r.stdout.removeprefix(RESULT))
        return result

    for check in (True, False):
        refused = outcome(check, hugepages=100000, preflight=[])
        assert refused["failed"] and refused["exit_code"] == 2, refused
        msg = refused["msg"]
        assert "\n" not in msg and "100000 x 1 GiB" in msg and "/proc/meminfo" in msg, msg
        assert "passthrough_host_hugepages" in msg and "--force" in msg
        assert tree_hash(root) == before
    done = outcome(False, preflight=[])
    assert done["changed"] and "failed" not in done, done


@pytest.mark.fleet
def test_the_fleet_refuses_unsized_hugepages_before_anything_changes(tmp_path: Path) -> None:
    """The same through the host role (real ansible-playbook): the host fails with the
    one-line reason and apply's exit code, its root untouched."""
    from passthrough.provision.runner import run, summary_table

    from .conftest import tree_hash
    from .test_ansible import _inventory

    root = _no_meminfo(tmp_path)
    before = tree_hash(root)
    host = {"passthrough_root": str(root), "passthrough_host_hugepages": 64}
    result = run(str(_inventory(tmp_path, {"h": host})), "host.yml")
    reason = result.hosts["h"].reason or ""
    assert not result.ok and result.hosts["h"].status == "failed", summary_table(result)
    assert "64 x 1 GiB huge pages (65536 MiB reserved at boot) cannot be checked" in reason
    assert reason.endswith("(exit 2)"), reason
    assert tree_hash(root) == before
