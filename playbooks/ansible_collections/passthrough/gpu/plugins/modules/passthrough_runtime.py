#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: put the passthrough library on a host, in a venv of its own.

The modules of this collection run it for you (their action plugins) when the host does not
have the version the controller runs; call it yourself only to install ahead of time."""

from __future__ import annotations

DOCUMENTATION = r"""
module: passthrough_runtime
short_description: Install the passthrough library into a venv on the host
description:
  - Creates I(venv) (seeing the system's site packages, so that the distro's libvirt binding
    is used rather than compiled) and installs the passthrough wheel into it, from a wheel
    already on the host or from an index. Writes I(identity) into the venv last; a venv that
    already holds I(identity) is left as it is.
  - Only a venv this module made (it holds C(passthrough-runtime-made) or
    C(passthrough-runtime)) is ever cleared and made again. Any other directory that is not
    empty is refused, nothing changed; I(venv) is resolved first (C(..) and links), so
    C(venv/..) names the parent directory, and is refused as such.
  - Needs only the host's python3 (3.11 or newer); the packages I(requires) names come from
    the distro, installed when I(install_packages) is true, otherwise named in the failure.
  - Check mode installs too (the venv is apart from the system; the other modules need it to
    compute their plans); it never installs distro packages.
options:
  venv:
    description: Where the venv goes
    type: path
    required: true
  identity:
    description: What the controller runs (version and content hash); the venv records it
    type: str
    required: true
  wheel:
    description: Path of the passthrough wheel on the host
    type: path
  index_url:
    description: Install passthrough==I(version) from this index instead (needs pip in the venv)
    type: str
  version:
    description: The version to install from I(index_url)
    type: str
  requires:
    description: Python modules the system must provide (for the VM module libvirt, lxml, jinja2, yaml)
    type: list
    elements: str
    default: []
  install_packages:
    description: Install the distro packages that provide what is missing
    type: bool
    default: false
  force:
    description:
      - Install again even where the venv's identity file names O(identity) already (the
        collection's action sets it when that venv's library could not run its task)
    type: bool
    default: false
author: passthrough developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Install the library ahead of time from a wheel already copied to the host
  passthrough.gpu.passthrough_runtime:
    venv: /opt/passthrough/venv
    identity: "0.1.0"
    wheel: /tmp/passthrough-0.1.0-py3-none-any.whl
"""

RETURN = r"""
python:
  description: the venv's interpreter
  returned: success
  type: str
family:
  description: the distro family (debian, redhat, arch, suse) or null
  returned: always
  type: str
"""

import os  # noqa: E402
import sys  # noqa: E402
import zipfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.passthrough.gpu.plugins.module_utils.runtime_packages import (  # noqa: E402
    INSTALL,
    family,
    missing,
    package,
    shebang_refusal,
)

MARKER = "passthrough-runtime"
# Written into a venv the moment this module has made it (MARKER comes last, after the
# install): only a directory holding one of the two is ever cleared (python -m venv --clear
# empties whatever directory it is given).
MADE = "passthrough-runtime-made"


def _refusal(venv: str, given: str) -> str | None:
    """Why ``venv`` (already resolved) may not be cleared for a new venv; None: it may."""
    shown = venv if venv == given else f"{given} (that is {venv})"
    if not os.path.lexists(venv):
        return None
    if not os.path.isdir(venv):
        return f"venv {shown}: something other than a directory is there; nothing changed"
    if not os.listdir(venv):
        return None
    if os.path.isfile(os.path.join(venv, MADE)) or os.path.isfile(os.path.join(venv, MARKER)):
        return None
    return (
        f"venv {shown}: a directory that is not empty and not a venv this module made "
        f"(no {MADE} in it); nothing changed: give a new or empty directory"
    )


def _make_venv(module: AnsibleModule, venv: str, fam: str | None) -> None:
    """A new venv at ``venv`` (already resolved), where only a venv this module made may
    stand; marked as ours at once (:data:`MADE`)."""
    refused = _refusal(venv, module.params["venv"])
    if refused:
        module.fail_json(msg=refused, family=fam)
    venv_args = ["--system-site-packages", "--clear"] + (
        [] if module.params["index_url"] else ["--without-pip"]
    )
    rc, out, err = module.run_command([sys.executable, "-m", "venv", *venv_args, venv])
    if rc != 0:
        module.fail_json(
            msg=f"python3 -m venv failed: {(err or out).strip()[-300:]} (install "
            f"{package('ensurepip', fam)})",
            family=fam,
        )
    with open(os.path.join(venv, MADE), "w", encoding="utf-8") as f:
        f.write("made by passthrough.gpu.passthrough_runtime: it may clear this venv\n")


def _unpack(wheel: str, purelib: str) -> None:
    """A pure-Python wheel is installed by unpacking it into site-packages; no member may
    leave it."""
    top = os.path.realpath(purelib)
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            target = os.path.realpath(os.path.join(top, name))
            if os.path.commonpath([top, target]) != top:
                raise ValueError(f"wheel member {name!r} leaves site-packages")
        zf.extractall(top)


def _scripts(venv: str, purelib: str) -> None:
    """The console scripts the wheel declares, in the venv's bin/."""
    for entry in os.listdir(purelib):
        points = os.path.join(purelib, entry, "entry_points.txt")
        if not (entry.startswith("passthrough-") and os.path.isfile(points)):
            continue
        section = ""
        with open(points, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line.startswith("["):
                    section = line
                elif section == "[console_scripts]" and "=" in line:
                    name, _eq, target = (p.strip() for p in line.partition("="))
                    mod, _colon, func = target.partition(":")
                    path = os.path.join(venv, "bin", name)
                    with open(path, "w", encoding="utf-8") as out:
                        out.write(
                            f"#!{venv}/bin/python\nfrom {mod} import {func}\n"
                            f"raise SystemExit({func}())\n"
                        )
                    os.chmod(path, 0o755)


def _need_packages(module: AnsibleModule, fam: str | None) -> bool:
    """Whether distro packages were installed; fails naming them where that is not allowed."""
    wanted = list(module.params["requires"]) + (["ensurepip"] if module.params["index_url"] else [])
    lacking = missing(wanted)
    if not lacking:
        return False
    names = sorted({package(m, fam) for m in lacking})
    command = INSTALL.get(fam or "", [])
    if not module.params["install_packages"] or not command or module.check_mode:
        module.fail_json(
            msg=f"install {' '.join(names)} on this host ({fam or 'unknown'} family), or set "
            "passthrough_runtime_install_packages: true",
            missing=names,
            family=fam,
        )
        return False
    module.run_command([*command, *names], check_rc=True)
    return True


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "venv": {"type": "path", "required": True},
            "identity": {"type": "str", "required": True},
            "wheel": {"type": "path"},
            "index_url": {"type": "str"},
            "version": {"type": "str"},
            "requires": {"type": "list", "elements": "str", "default": []},
            "install_packages": {"type": "bool", "default": False},
            "force": {"type": "bool", "default": False},
        },
        required_one_of=[["wheel", "index_url"]],
        required_together=[["index_url", "version"]],
        supports_check_mode=True,
    )
    p = module.params
    fam = family()
    # `..` and links resolved before anything is decided: `venv/..` is the parent directory
    venv = os.path.realpath(p["venv"])
    # the console scripts' #! line names it, and so does Ansible's interpreter for the modules
    unfit = shebang_refusal(venv)
    if unfit is not None:
        module.fail_json(msg=unfit)
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, MARKER)
    if sys.version_info < (3, 11):  # noqa: UP036 (the host's python3, not ours)
        module.fail_json(
            msg=f"{sys.executable} is Python {sys.version_info[0]}.{sys.version_info[1]}; "
            "passthrough needs 3.11 or newer (set ansible_python_interpreter to one)",
            family=fam,
        )
    packages = _need_packages(module, fam)
    try:
        with open(marker, encoding="utf-8") as f:
            if f.read().strip() == p["identity"] and not p["force"]:
                module.exit_json(changed=packages, python=python, family=fam)
    except OSError:
        pass
    _make_venv(module, venv, fam)
    if p["index_url"]:
        module.run_command(
            [
                python,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "--index-url",
                p["index_url"],
                f"passthrough=={p['version']}",
            ],
            check_rc=True,
        )
    else:
        _rc, out, _err = module.run_command(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check_rc=True,
        )
        purelib = out.strip()
        _unpack(p["wheel"], purelib)
        _scripts(venv, purelib)
        # byte code now, as pip does: every module call would otherwise compile the library
        # again where nothing may write it (or PYTHONDONTWRITEBYTECODE is set)
        module.run_command(
            [python, "-m", "compileall", "-q", os.path.join(purelib, "passthrough")],
            check_rc=True,
        )
    with open(marker + ".tmp", "w", encoding="utf-8") as f:
        f.write(p["identity"] + "\n")
    os.replace(marker + ".tmp", marker)
    module.exit_json(changed=True, python=python, family=fam)


if __name__ == "__main__":
    main()
