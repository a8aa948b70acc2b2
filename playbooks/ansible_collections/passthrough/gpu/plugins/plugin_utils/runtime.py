# SPDX-License-Identifier: Apache-2.0
# Apache-2.0 (see the passthrough project's LICENSE)
"""Controller side of the runtime on the hosts: the action that makes sure a host holds exactly
the controller's passthrough (its identity and wheel: plugin_utils/wheel.py) before one of this
collection's modules runs there.

The no-op path costs one command on the host: the module itself under the venv's interpreter,
which reads the venv's identity file before it imports the library (and stops there where it
is not the controller's); for an action with a direct command (passthrough_host), that command
instead of the module (``RuntimeAction._direct``)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ansible import constants as C
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible_collections.passthrough.gpu.plugins.module_utils.runtime_packages import (
    shebang_refusal,
)
from ansible_collections.passthrough.gpu.plugins.plugin_utils.wheel import identity, wheel

__all__ = ["RuntimeAction", "identity", "parse_probe", "per_run", "wheel"]

DEFAULT_VENV = "/opt/passthrough/venv"
MARKER = "passthrough-runtime"
# what the VM module imports from the system (the distro's bindings)
REQUIRES = {"passthrough_vm": ["jinja2", "lxml", "libvirt", "yaml"]}


# The probe's answers are tagged: a login or sudo may print its own lines first (sudo's
# "unable to resolve host" warning reaches stdout through Ansible's terminal).
HAVE = "passthrough-runtime-have:"
# the direct command's result line (passthrough/hosttask.py RESULT)
DIRECT_RESULT = "passthrough-task-result:"
LACKING = "passthrough-runtime-lacking:"


# The interpreter's own line where the venv holds no library (the package quoted, inside the
# error finding the module's spec) or one without the command: "PYTHON: No module named
# passthrough.hosttask" or "PYTHON: Error while finding module specification for
# 'passthrough.hosttask' (ModuleNotFoundError: No module named 'passthrough')". A whole line,
# starting with the venv's interpreter: a failed command's output that merely quotes the words
# is not it. The shell's 127 where the venv has no interpreter.
def _no_library(python: str) -> re.Pattern[str]:
    return re.compile(
        rf"^{re.escape(python)}: (?:No module named passthrough(?:\.[\w.]+)?|Error while "
        r"finding module specification for 'passthrough(?:\.[\w.]+)?' \(ModuleNotFoundError: "
        r"No module named 'passthrough(?:\.[\w.]+)?'\))\r?$",
        re.MULTILINE,
    )


def cannot_run(rc: object, stdout: str, stderr: str, python: str) -> bool:
    """Whether the direct command could not start under the venv's ``python``. Both streams
    are read: over SSH the command runs on a terminal (``ssh -tt``), where the host's stderr
    arrives in stdout."""
    return rc == 127 or bool(_no_library(python).search(stdout + "\n" + stderr))


def direct_result(stdout: str) -> dict[str, Any] | None:
    """The direct command's result from its tagged line (a login or sudo may print first);
    None where there is none that reads whole."""
    for line in reversed(stdout.splitlines()):
        if DIRECT_RESULT in line:
            try:
                found = json.loads(line.split(DIRECT_RESULT, 1)[1])
            except ValueError:
                return None
            return found if isinstance(found, dict) else None
    return None


def parse_probe(stdout: str) -> tuple[str, list[str]]:
    """(identity, modules lacking) from the probe's output, whatever else a host printed."""
    have, lacking = "", []
    for line in stdout.splitlines():
        if HAVE in line:
            have = line.split(HAVE, 1)[1].strip()
        elif LACKING in line:
            lacking = line.split(LACKING, 1)[1].split()
    return have, lacking


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


class RuntimeAction(ActionBase):  # type: ignore[misc] # Ansible is untyped
    """Runs the task's module under the host's passthrough venv, installing it first when the
    host does not hold the controller's identity. ``passthrough_runtime: none`` runs the module
    with the host's interpreter as it is (the library put there by you).

    An action that names a library module in ``direct`` (and the module's argument spec in
    ``spec``) runs that instead of the module where the venv holds the controller's library
    (``_direct``): the same body, the same result, a fraction of the cost per host."""

    direct: str | None = None

    @staticmethod
    def spec() -> dict[str, Any]:
        return {}

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
        unfit = shebang_refusal(venv)  # Ansible's interpreter line names it, as scripts do
        if unfit is not None:
            return {**result, "failed": True, "msg": f"passthrough_runtime_venv: {unfit}"}
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
        # prepared host costs this one module call (or the direct command, `_call`).
        done = self._call(args, venv, module_vars)
        stale = done.get("passthrough_runtime")
        if stale is None and done.get("_ansible_parsed") is False:
            have, lacking = self._probe(venv, requires)
            if have != ident or lacking:
                stale = {"have": have, "lacking": lacking}
        if stale is None:
            result.update(done)
            return result
        # a venv that could not run the task at all is installed again whatever it says it holds
        broken = "venv" in (stale.get("lacking") or [])
        installed = self._install(task_vars, venv, ident, force=broken)
        if installed.get("failed"):
            return {**result, **installed, "msg": f"runtime: {installed.get('msg')}"}
        again = self._call(args, venv, module_vars)
        if again.get("passthrough_runtime") is not None:
            return {
                **result,
                "failed": True,
                "msg": f"runtime: {venv} still does not run passthrough {ident} after installing it "
                f"({again['passthrough_runtime']})",
            }
        result.update(again)
        result["changed"] = True
        result["runtime_installed"] = ident
        return result

    def _call(self, args: dict[str, Any], venv: str, module_vars: dict[str, Any]) -> dict[str, Any]:
        """The task under the venv: the direct command where the action has one, the module
        where that cannot decide."""
        done = None
        if self.direct is not None:  # (an async task never gets here: the action refuses it)
            done = self._direct(self.direct, args, venv)
        if done is None:
            done = self._execute_module(module_args=args, task_vars=module_vars)
        return done

    def _direct(self, module: str, args: dict[str, Any], venv: str) -> dict[str, Any] | None:
        """The task as one command under the venv's interpreter (``python -I -m`` the library's
        ``module``), where the library is there already: no AnsiballZ wrapper to
        send, unpack and compile, no temporary directory. The arguments are checked here with
        the module's own spec first. Where the venv has no interpreter or no such module, the
        runtime is reported missing (the action installs it). None for arguments the module
        would refuse: the module's call then fails with Ansible's own message."""
        spec = self.spec()
        given = {k: v for k, v in args.items() if k != "runtime"}
        checked = ArgumentSpecValidator(spec).validate(given)
        if checked.error_messages:
            return None  # the module's call fails with Ansible's own message
        payload = {
            "params": {k: v for k, v in checked.validated_parameters.items() if k != "runtime"},
            "check_mode": bool(self._task.check_mode),
            "runtime": args["runtime"],
        }
        encoded = base64.b64encode(json.dumps(payload).encode()).decode()
        python = shlex.quote(f"{venv}/bin/python")
        env = self._compute_environment_string()
        command = f"{env} {python} -I -m {module} {encoded}".strip()
        res = self._low_level_execute_command(command, sudoable=True)
        stdout, stderr = res.get("stdout", ""), res.get("stderr", "")
        found = direct_result(stdout)
        if found is not None:
            return found
        if cannot_run(res.get("rc"), stdout, stderr, f"{venv}/bin/python"):
            return {"changed": False, "passthrough_runtime": {"have": "", "lacking": ["venv"]}}
        last = (stderr.strip().splitlines() or stdout.strip().splitlines() or ["no output"])[-1]
        return {
            "failed": True,
            "msg": f"{self._task.action} failed on the host (rc {res.get('rc')}): {last}",
            "module_stdout": stdout,
            "module_stderr": stderr,
            "rc": res.get("rc"),
        }

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

    def _install(
        self, task_vars: dict[str, Any], venv: str, ident: str, force: bool = False
    ) -> dict[str, Any]:
        """passthrough_runtime on the host, with the wheel copied over (or the index named)."""
        index = self._var(task_vars, "passthrough_runtime_index_url", "")
        args: dict[str, Any] = {
            "venv": venv,
            "identity": ident,
            "requires": REQUIRES.get(self._task.action.rsplit(".", 1)[-1], []),
            "install_packages": bool(
                self._var(task_vars, "passthrough_runtime_install_packages", False)
            ),
            "force": force,
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
