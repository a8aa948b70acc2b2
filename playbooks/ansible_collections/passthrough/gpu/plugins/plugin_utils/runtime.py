# SPDX-License-Identifier: Apache-2.0
# Apache-2.0 (see the passthrough project's LICENSE)
"""Controller side of the runtime on the hosts: which passthrough the controller runs (its
identity: version and a hash of its content), its wheel (built from the checkout the
collection sits in, or packed from the installed distribution), and the action that makes
sure a host has exactly that before one of this collection's modules runs there.

The no-op path costs one module call: the module itself under the venv's interpreter, which
reads the venv's identity file before it imports the library (and stops there where it is not
the controller's)."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shlex
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

HERE = Path(__file__).resolve()
# plugins/plugin_utils/runtime.py → the collection → ansible_collections → its parent
PARENT = HERE.parents[5]
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "passthrough/wheels"
DEFAULT_VENV = "/opt/passthrough/venv"
MARKER = "passthrough-runtime"
# what the VM module imports from the system (the distro's bindings)
REQUIRES = {"passthrough_vm": ["jinja2", "lxml", "libvirt", "yaml"]}


# The probe's answers are tagged: a login or sudo may print its own lines first (sudo's
# "unable to resolve host" warning reaches stdout through Ansible's terminal).
HAVE = "passthrough-runtime-have:"
LACKING = "passthrough-runtime-lacking:"


def parse_probe(stdout: str) -> tuple[str, list[str]]:
    """(identity, modules lacking) from the probe's output, whatever else a host printed."""
    have, lacking = "", []
    for line in stdout.splitlines():
        if HAVE in line:
            have = line.split(HAVE, 1)[1].strip()
        elif LACKING in line:
            lacking = line.split(LACKING, 1)[1].split()
    return have, lacking


def _checkout() -> Path | None:
    """The passthrough checkout this collection sits in (playbooks/ansible_collections/…)."""
    repo = PARENT.parent
    if (repo / "pyproject.toml").is_file() and (repo / "passthrough/__init__.py").is_file():
        return repo
    return None


def _installed() -> importlib.metadata.Distribution | None:
    """The installed passthrough distribution the collection came in (passthrough/data/…), or
    the one the controller's Python imports."""
    try:
        return importlib.metadata.distribution("passthrough")
    except importlib.metadata.PackageNotFoundError:
        return None


def _version(repo: Path) -> str:
    for line in (repo / "passthrough/__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise AnsibleError(f"no __version__ in {repo}/passthrough/__init__.py")


def _sources(repo: Path) -> list[tuple[Path, os.stat_result]]:
    """The checkout's files that go onto the hosts, in a fixed order, with their stat."""
    found = []
    for tree in ("passthrough", "templates"):
        for top, dirs, names in os.walk(repo / tree):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in names:
                path = Path(top, name)
                st = path.stat()
                if stat.S_ISREG(st.st_mode):
                    found.append((path, st))
    return sorted(found, key=lambda f: f[0])


def identity() -> str:
    """``VERSION+sha256`` of what goes onto the hosts: a checkout's package and templates, or
    an installed distribution's RECORD (which lists every file with its hash).

    A checkout's content hash is kept in the cache under a key made of every file's name,
    size, inode and modification and change times: each host's task asks (a worker process
    each), and stating the files costs a fraction of reading and hashing them all again."""
    repo = _checkout()
    digest = hashlib.sha256()
    if repo is not None:
        sources = _sources(repo)
        key = hashlib.sha256(str(repo).encode())
        for path, st in sources:
            stamp = (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
            key.update(f"{path.relative_to(repo)}\0{stamp}\0".encode())
        cached = CACHE.parent / "identity" / key.hexdigest()
        try:
            return cached.read_text()
        except OSError:
            pass
        for path, _st in sources:
            digest.update(str(path.relative_to(repo)).encode() + b"\0")
            digest.update(path.read_bytes())
        found = f"{_version(repo)}+{digest.hexdigest()[:16]}"
        try:  # written whole or not at all: a fork reading it sees no half
            cached.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=cached.parent, delete=False) as tmp:
                tmp.write(found)
            os.replace(tmp.name, cached)
        except OSError:
            pass  # no cache: the next host hashes again
        return found
    dist = _installed()
    if dist is None:
        raise AnsibleError(
            "no passthrough on the controller: set passthrough_runtime_wheel or "
            "passthrough_runtime_index_url"
        )
    digest.update((dist.read_text("RECORD") or "").encode())
    return f"{dist.version}+{digest.hexdigest()[:16]}"


def per_run(name: str, compute: Callable[[], str]) -> str:
    """``compute()``, once per ``ansible-playbook`` run: each host's task is a worker process
    of its own, so what every worker would work out alike (the identity: a stat of each of
    the library's files; the role's argument specs: Ansible's YAML loader) is kept in the
    run's own local temporary directory (Ansible makes it per process, the workers share it,
    and it is removed when the run ends). Without that directory it is worked out here."""
    folder = getattr(C, "DEFAULT_LOCAL_TMP", None)
    if not folder or not os.path.isdir(folder):
        return compute()
    path = os.path.join(folder, f"passthrough-{name}")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        pass
    found = compute()
    try:  # written whole or not at all: a worker reading it sees no half
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False) as tmp:
            tmp.write(found)
        os.replace(tmp.name, path)
    except OSError:
        pass
    return found


def _templated(templar: Any, value: Any) -> bool:
    """Whether ``value`` holds a template anywhere (only those are worth the templar's time:
    it costs about a millisecond a value even on a plain one)."""
    if isinstance(value, str):
        return bool(templar.is_possibly_template(value))
    if isinstance(value, dict):
        return any(_templated(templar, v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_templated(templar, v) for v in value)
    return False


def _pack(dist: importlib.metadata.Distribution, out: Path) -> Path:
    """A wheel of an installed pure-Python distribution, from its RECORD."""
    base = Path(str(dist.locate_file("")))
    name = f"passthrough-{dist.version}-py3-none-any.whl"
    records: list[str] = []
    with zipfile.ZipFile(out / name, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in dist.files or []:
            rel = str(f)
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith("/RECORD"):
                continue
            data = (base / rel).read_bytes()
            zf.writestr(rel, data)
            sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{rel},sha256={sha},{len(data)}")
        info = next(
            str(f).split("/", maxsplit=1)[0] for f in dist.files or [] if ".dist-info/" in str(f)
        )
        records.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return out / name


def wheel(ident: str) -> Path:
    """The controller's wheel for ``ident``, built once and cached (a lock keeps the forks from
    building it side by side)."""
    folder = CACHE / ident
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(folder.glob("passthrough-*.whl"))
        if found:
            return found[0]
        repo = _checkout()
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            if repo is None:
                dist = _installed()
                if dist is None:  # identity() raised otherwise
                    raise RuntimeError("passthrough is neither a checkout nor installed here")
                built = _pack(dist, Path(tmp))
            else:
                built = _build(repo, Path(tmp))
            return built.rename(folder / built.name)


def _build(repo: Path, out: Path) -> Path:
    base = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out)]
    errors = []
    # without build isolation when setuptools is at hand (no index needed), else with it
    for extra in (["--no-build-isolation"], []):
        r = subprocess.run([*base, *extra, str(repo)], capture_output=True, text=True, check=False)
        found = list(out.glob("passthrough-*.whl"))
        if r.returncode == 0 and found:
            return found[0]
        errors.append((r.stderr or r.stdout).strip().splitlines()[-1:])
    raise AnsibleError(
        f"could not build the passthrough wheel from {repo} ({errors}); "
        "set passthrough_runtime_wheel to a wheel"
    )


class RuntimeAction(ActionBase):  # type: ignore[misc] # Ansible is untyped
    """Runs the task's module under the host's passthrough venv, installing it first when the
    host does not hold the controller's identity. ``passthrough_runtime: none`` runs the module
    with the host's interpreter as it is (the library put there by you)."""

    def _var(self, task_vars: dict[str, Any], name: str, default: Any) -> Any:
        value = task_vars.get(name, default)
        return self._templar.template(value) if isinstance(value, str) else value

    def run(
        self, tmp: str | None = None, task_vars: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        task_vars = task_vars or {}
        result: dict[str, Any] = super().run(tmp, task_vars)
        wrong = self._role_arguments(task_vars)
        if wrong:
            return {**result, **wrong}
        mode = self._var(task_vars, "passthrough_runtime", "venv")
        if mode == "none":
            result.update(self._execute_module(task_vars=task_vars))
            return result
        if mode != "venv":
            return {**result, "failed": True, "msg": f"passthrough_runtime: {mode!r}: venv or none"}
        venv = str(self._var(task_vars, "passthrough_runtime_venv", DEFAULT_VENV))
        ident = str(
            self._var(task_vars, "passthrough_runtime_identity", "")
            or per_run("identity", identity)
        )
        requires = REQUIRES.get(self._task.action.rsplit(".", 1)[-1], [])
        module_vars = {**task_vars, "ansible_python_interpreter": f"{venv}/bin/python"}
        args = {
            **self._task.args,
            "runtime": {"identity": ident, "venv": venv, "requires": requires},
        }
        # The module first, under the venv's interpreter: it reads the venv's identity itself
        # before importing anything of ours (module_utils/package.py) and, where that is not
        # the controller's, returns passthrough_runtime and does nothing. Where it gave no
        # result Ansible could read (no interpreter in the venv: "The module interpreter … was
        # not found", or a crash before its result) the probe says what the venv holds. A
        # prepared host costs this one module call.
        done = self._execute_module(module_args=args, task_vars=module_vars)
        stale = done.get("passthrough_runtime")
        if stale is None and done.get("_ansible_parsed") is False:
            have, lacking = self._probe(venv, requires)
            if have != ident or lacking:
                stale = {"have": have, "lacking": lacking}
        if stale is None:
            result.update(done)
            return result
        installed = self._install(task_vars, venv, ident)
        if installed.get("failed"):
            return {**result, **installed, "msg": f"runtime: {installed.get('msg')}"}
        result.update(self._execute_module(module_args=args, task_vars=module_vars))
        result["changed"] = True
        result["runtime_installed"] = ident
        return result

    def _role_arguments(self, task_vars: dict[str, Any]) -> dict[str, Any] | None:
        """A role's argument specs checked here, in this task's own worker, where the role was
        brought in without Ansible's check (``import_role`` with ``rolespec_validate: false``,
        as host.yml does: Ansible's check is a task, a worker process per host, of its own).
        The same validator and the same message as Ansible's ``validate_argument_spec``."""
        role = getattr(self._task, "_role", None)
        if role is None or getattr(role, "_should_validate", True):
            return None  # not in a role, or Ansible's own task has checked it already
        # meta/argument_specs.yml, as Ansible reads it, once per run (a role's path names it)
        key = hashlib.sha256(str(role._role_path).encode()).hexdigest()[:16]
        specs = json.loads(
            per_run(f"argspecs-{key}", lambda: json.dumps(role._get_role_argspecs()))
        )
        entry = specs.get(role._from_files.get("tasks", "main")) or {}
        spec = entry.get("options") or {}
        if not spec:
            return None
        given = {
            k: self._templar.template(v) if _templated(self._templar, v) else v
            for k, v in ((k, task_vars[k]) for k in spec if k in task_vars)
        }
        checked = ArgumentSpecValidator(spec).validate(given, validate_role_argument_spec=True)
        if not checked.error_messages:
            return None
        return {
            "failed": True,
            "msg": "Validation of arguments failed:\n" + "\n".join(checked.error_messages),
            "argument_errors": checked.error_messages,
        }

    def _probe(self, venv: str, requires: list[str]) -> tuple[str, list[str]]:
        """(the identity the host's venv holds, the modules of ``requires`` it cannot import):
        one shell command, and Python started only where a module needs the distro's."""
        marker = shlex.quote(venv + "/" + MARKER)
        command = f"printf '%s' {HAVE}; cat {marker} 2>/dev/null; echo"
        if requires:
            check = "import importlib.util as u; print(%r, *[m for m in %r if not u.find_spec(m)])"
            python = shlex.quote(venv + "/bin/python")
            command += (
                f"; {python} -c {shlex.quote(check % (LACKING, requires))} 2>/dev/null"
                f" || echo {LACKING} venv"
            )
        return parse_probe(
            self._low_level_execute_command(command, sudoable=True).get("stdout", "")
        )

    def _install(self, task_vars: dict[str, Any], venv: str, ident: str) -> dict[str, Any]:
        """passthrough_runtime on the host, with the wheel copied over (or the index named)."""
        index = self._var(task_vars, "passthrough_runtime_index_url", "")
        args: dict[str, Any] = {
            "venv": venv,
            "identity": ident,
            "requires": REQUIRES.get(self._task.action.rsplit(".", 1)[-1], []),
            "install_packages": bool(
                self._var(task_vars, "passthrough_runtime_install_packages", False)
            ),
        }
        tmp = None
        if index:
            args.update(index_url=index, version=ident.split("+", 1)[0])
        else:
            given = self._var(task_vars, "passthrough_runtime_wheel", "")
            local = Path(given) if given else wheel(ident)
            if not local.is_file():
                return {"failed": True, "msg": f"passthrough_runtime_wheel {local}: no such file"}
            tmp = self._make_tmp_path()
            remote = self._connection._shell.join_path(tmp, local.name)
            self._transfer_file(str(local), remote)
            self._fixup_perms2((tmp, remote))
            args["wheel"] = remote
        try:
            done: dict[str, Any] = self._execute_module(
                module_name="passthrough.gpu.passthrough_runtime",
                module_args=args,
                task_vars=task_vars,
            )
        finally:
            if tmp is not None:
                self._remove_tmp_path(tmp)
        return done
