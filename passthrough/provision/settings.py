# SPDX-License-Identifier: Apache-2.0
"""What ``provision`` hands ansible-playbook besides the playbook: the configuration file Ansible
would pick from where the user stands, the command-line flags as a list (never one joined
string), and the ``-e`` forms ansible-playbook takes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from passthrough.errors import PassthroughError, echo


def user_config(cwd: str | None = None) -> str | None:
    """The ansible.cfg Ansible itself would read for a command run in ``cwd``: $ANSIBLE_CONFIG
    (a file, or a directory holding ansible.cfg), ./ansible.cfg (unless the directory is
    world-writable, which Ansible ignores), ~/.ansible.cfg, /etc/ansible/ansible.cfg. First found
    wins; None when the user has none (then provision uses the playbooks' own)."""
    here = Path(cwd or os.getcwd())
    given = os.environ.get("ANSIBLE_CONFIG")
    candidates: list[Path] = []
    if given:
        path = here / os.path.expanduser(given)
        candidates.append(path / "ansible.cfg" if path.is_dir() else path)
    try:
        world_writable = bool(here.stat().st_mode & stat.S_IWOTH)
    except OSError:
        world_writable = True
    if not world_writable:
        candidates.append(here / "ansible.cfg")
    candidates += [Path("~/.ansible.cfg").expanduser(), Path("/etc/ansible/ansible.cfg")]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate.resolve())
    return None


def extra_vars(items: list[str], cwd: str | None = None) -> list[str]:
    """Each ``-e`` as ``-e`` and its value, in order: ``k=v ...``, ``@file`` (made absolute:
    ansible-playbook runs in another directory; a missing file is the user's input, exit 2)
    and JSON/YAML, all passed as ansible-playbook reads them."""
    args: list[str] = []
    for item in items:
        if not item.strip():
            raise PassthroughError("-e '': empty extra variables")
        if item.startswith("@"):
            path = Path(cwd or os.getcwd()) / os.path.expanduser(item[1:])
            if not path.is_file():
                raise PassthroughError(f"-e '{echo(item)}': no such file")
            item = "@" + str(path.resolve())
        args += ["-e", item]
    return args


def flags(check: bool, diff: bool, extra: list[str]) -> list[str]:
    """The flags ansible-runner has no keyword for, as a list."""
    return [*(["--check"] if check else []), *(["--diff"] if diff else []), *extra]
