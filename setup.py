# SPDX-License-Identifier: Apache-2.0
"""The one build step pyproject.toml cannot say: the top-level templates/ and playbooks/
(where people and Ansible look for them in a checkout) go into the wheel as package data
under passthrough/data/, which passthrough/resources.py finds. Everything else about the
package is in pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

TREES = ("templates", "playbooks")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.retry")


class BuildPyWithData(build_py):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads them from the checkout itself
        for name in TREES:
            target = Path(self.build_lib, "passthrough", "data", name)
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(name, target, ignore=SKIP)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs: list[str] = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            data = Path(self.build_lib, "passthrough", "data")
            outputs += [str(p) for p in sorted(data.rglob("*")) if p.is_file()]
        return outputs


# The manual pages (generated from the parsers, docs/man) go where man looks for a prefix's
# own: <venv>/share/man/man1, found by man for a venv whose bin/ is on PATH.
MAN_PAGES = sorted(str(p) for p in Path("docs/man").glob("*.1"))

setup(cmdclass={"build_py": BuildPyWithData}, data_files=[("share/man/man1", MAN_PAGES)])
