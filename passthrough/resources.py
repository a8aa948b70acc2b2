# SPDX-License-Identifier: Apache-2.0
"""Where the templates and playbooks are: in an installed wheel they are package data
(``passthrough/data/``, copied there by setup.py's build step); in a checkout or an
editable install they are the top-level ``templates/`` and ``playbooks/``, where people
and Ansible look for them. An environment variable names another copy."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def find(name: str, marker: str, env: str) -> Path:
    """The directory ``name`` holding ``marker``: $``env``, the wheel's copy, the checkout's.
    Raises FileNotFoundError naming all three when none holds it."""
    given = os.environ.get(env)
    candidates = [Path(given)] if given else []
    candidates += [PACKAGE / "data" / name, PACKAGE.parent / name]
    for candidate in candidates:
        if (candidate / marker).is_file():
            return candidate
    raise FileNotFoundError(
        f"{name}/{marker} not found in the installed package or the checkout (set {env})"
    )
