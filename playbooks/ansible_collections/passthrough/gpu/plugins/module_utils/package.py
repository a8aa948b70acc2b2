# SPDX-License-Identifier: Apache-2.0
# Apache-2.0 (see the passthrough project's LICENSE)
"""What the modules that drive the passthrough package on the target share: how a task
ends when that package cannot be used there, or refuses.

The modules import the package inside this block, not at the top, so that Ansible (and
ansible-test) can read their documentation and arguments on a controller without it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# the option the collection's action gives every module it runs under the runtime
# (doc_fragments/runtime.py); the identity file the runtime module writes into the venv
RUNTIME_OPTION: dict[str, dict[str, Any]] = {"runtime": {"type": "dict"}}
MARKER = "passthrough-runtime"


def stale_runtime(runtime: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the venv lacks against what the action expects (``runtime``: identity, venv,
    requires), or None where it holds exactly that (or nothing is expected). Read before the
    package is imported: an old package must not act for the controller's."""
    if not runtime:
        return None
    try:
        with open(os.path.join(str(runtime.get("venv")), MARKER), encoding="utf-8") as f:
            have = f.read().strip()
    except OSError:
        have = ""
    lacking = [m for m in runtime.get("requires") or [] if importlib.util.find_spec(m) is None]
    if have == runtime.get("identity") and not lacking:
        return None
    return {"have": have, "lacking": lacking}


@contextmanager
def package_errors(module: Any) -> Iterator[None]:
    """Run the block; end the task with one line where the passthrough package (or a library
    it needs, such as libvirt-python) cannot be imported on the target, or where it refuses
    (a PassthroughError: a safety-policy refusal carries its codes, docs/discovery.md "Safety policy",
    and every refusal the command line's exit code).
    Anything else is a bug and shows as Ansible shows an exception.

    First, where the action expects a runtime the host's venv does not hold, the task ends
    with nothing done and ``passthrough_runtime`` returned (the action installs, then runs
    the module again: the no-op path is this one module call)."""
    stale = stale_runtime(module.params.get("runtime"))
    if stale is not None:
        module.exit_json(changed=False, passthrough_runtime=stale)
    try:
        yield
    except ImportError as exc:
        top = (exc.name or "").split(".", maxsplit=1)[0]
        if top and top != "passthrough":
            # a binding the distro provides (seen through the venv's system site packages)
            from ansible_collections.passthrough.gpu.plugins.module_utils.runtime_packages import (
                family,
                package,
            )

            fam = family()
            module.fail_json(
                msg=f"install {package(top, fam)} on this host ({fam or 'unknown'} family): "
                f"passthrough imports {top} ({exc})"
            )
        module.fail_json(
            msg=f"the passthrough Python package is not installed on the target ({exc})"
        )
    except Exception as exc:
        try:
            from passthrough.errors import PassthroughError
        except ImportError:
            raise exc from None
        if not isinstance(exc, PassthroughError):
            raise
        # exit_code: what `passthrough` itself exits with for the same refusal (docs/cli.md),
        # so a fleet summary reads as the command line would
        module.fail_json(
            msg=str(exc), codes=list(getattr(exc, "codes", ())), exit_code=int(exc.exit_code)
        )
