# SPDX-License-Identifier: Apache-2.0
"""Domain XML from a VmSpec through the Jinja2 template in templates/.

StrictUndefined (a missing value is an error, not an empty string) and autoescaping (a
value can never become markup). Hex formatting lives here, in one place.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from passthrough import resources
from passthrough.vm.spec import VmSpec
from passthrough.vm.xmlns import POLICY_NS, QEMU_NS

__all__ = ["POLICY_NS", "environment", "render", "templates_dir"]


def templates_dir() -> Path:
    """The installed wheel's templates, or templates/ of the checkout."""
    return resources.find("templates", "domain.xml.j2", "PASSTHROUGH_TEMPLATES")


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["hex1"] = lambda v: f"0x{int(v):x}"
    env.filters["hex2"] = lambda v: f"0x{int(v):02x}"
    env.filters["hex4"] = lambda v: f"0x{int(v):04x}"
    return env


def render(spec: VmSpec) -> str:
    return (
        environment()
        .get_template("domain.xml.j2")
        .render(spec=spec, policy_ns=POLICY_NS, qemu_ns=QEMU_NS)
    )
