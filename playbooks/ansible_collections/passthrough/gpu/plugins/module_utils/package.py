# SPDX-License-Identifier: Apache-2.0
# Apache-2.0 (see the passthrough project's LICENSE)
"""What the modules that drive the passthrough package on the target share: how a task
ends when that package cannot be used there, or refuses.

The modules import the package inside this block, not at the top, so that Ansible (and
ansible-test) can read their documentation and arguments on a controller without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def package_errors(module: Any) -> Iterator[None]:
    """Run the block; end the task with one line where the passthrough package (or a library
    it needs, such as libvirt-python) cannot be imported on the target, or where it refuses
    (a PassthroughError: a safety-policy refusal carries its codes, docs/discovery.md "Safety policy",
    and every refusal the command line's exit code).
    Anything else is a bug and shows as Ansible shows an exception."""
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
