# SPDX-License-Identifier: Apache-2.0
"""Writing files and relative symlinks into a root, as the kernel lays them out."""

from __future__ import annotations

import os
from pathlib import Path


class Writer:
    def __init__(self, dest: Path) -> None:
        self.dest = dest

    def file(self, rel: str, content: str | bytes, mode: int = 0o644) -> None:
        p = self.dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.encode()
        p.write_bytes(content)
        p.chmod(mode)

    def dir(self, rel: str) -> None:
        (self.dest / rel).mkdir(parents=True, exist_ok=True)

    def link(self, rel: str, target_rel: str) -> None:
        """A relative symlink at ``rel`` pointing to ``target_rel`` (both root-relative)."""
        p = self.dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(target_rel, os.path.dirname(rel))
        if p.is_symlink() or p.exists():
            p.unlink()
        p.symlink_to(target)
