# SPDX-License-Identifier: Apache-2.0
"""One error hierarchy for the whole toolkit.

Every error carries its own data and renders a one-line message; the CLI prints that
line and exits with ``exit_code``. Tracebacks are shown only with ``--debug``.
"""

from __future__ import annotations

import os

# Documented exit codes (README "Exit codes", docs/cli.md): one meaning each.
EXIT_OK = 0
EXIT_CHECK_FAILED = 1  # a check / verify / validate found problems
EXIT_USAGE = 2  # usage, input or a refusal: nothing was changed
EXIT_HOST_STEP = 3  # a step on the host failed part-way: `status` / `undo` say what to do
EXIT_BACKEND = 4  # libvirt or Ansible failed underneath
EXIT_NEXT_BOOT = 5  # apply is done, but what the next boot reads lacks our change
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


ECHO_LIMIT = 80  # characters of user input quoted back in a message


def echo(text: object, limit: int = ECHO_LIMIT) -> str:
    """User input as shown in a message: at most ``limit`` characters, an ellipsis when
    cut, so a 100 KB argument never comes back whole. Control characters are escaped
    so a value cannot forge a second line."""
    shown = str(text)
    cut = len(shown) > limit
    shown = shown[:limit]
    if not shown.isprintable():
        shown = shown.encode("unicode_escape").decode("ascii")
    return shown + "…" if cut else shown


PATH_MAX = 4096  # Linux's limit on a path's length, terminating NUL included


def echo_path(path: object) -> str:
    """A path as shown in a message: whole up to ``PATH_MAX``, so the user can copy it back
    (a temporary directory's path easily passes 80 characters); a longer one cannot name a
    file, and is cut like any other input. Control characters escaped as in :func:`echo`."""
    shown = str(path)
    return echo(shown, PATH_MAX if len(shown) < PATH_MAX else ECHO_LIMIT)


def quote(text: object, limit: int = ECHO_LIMIT) -> str:
    """:func:`echo` in quotes, for a value that is not a path."""
    return f"'{echo(text, limit)}'"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 warning``, ``2 warnings``: a number with its noun agreeing."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


class PassthroughError(Exception):
    """Base class: a problem the user can act on, told in one line."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Interrupted(PassthroughError):
    """Ctrl-C, whether Python saw it or a tool underneath (ansible-runner) did."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self) -> None:
        super().__init__("interrupted")


class InvalidPciAddress(PassthroughError):
    def __init__(self, text: str, expected: str | None = None) -> None:
        super().__init__(
            f"malformed PCI address {quote(text)}: "
            + (expected or "expected [DOMAIN:]BUS:DEVICE.FUNCTION in hex, e.g. 0000:01:00.0")
        )
        self.text = text


class UnknownPciDevice(PassthroughError):
    def __init__(self, address: str) -> None:
        super().__init__(f"no PCI function {address} on this host")
        self.address = address


class NotAHostRoot(PassthroughError):
    """A root that cannot be read, named by the option that gave it (validate's is
    --host-root)."""

    def __init__(self, root: str, why: str, option: str = "--root") -> None:
        super().__init__(f"{option} {echo_path(root)}: {why}")
        self.root = root
        self.why = why


class MalformedHostData(PassthroughError):
    """A file under the root exists but its content cannot be what the kernel writes."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


class BadDescription(PassthroughError):
    """A host description (fixture YAML) that cannot be built."""

    def __init__(self, source: str, why: str) -> None:
        super().__init__(f"{echo_path(source)}: {why}")
        self.source = source
        self.why = why


class SnapshotError(PassthroughError):
    def __init__(self, why: str) -> None:
        super().__init__(f"snapshot: {why}")


class NoOutputDirectory(PassthroughError):
    """``-o DIR/FILE`` where DIR does not exist: we never create it (a typo would
    otherwise scatter directories)."""

    def __init__(self, option: str, path: str, directory: str) -> None:
        super().__init__(f"{option} {echo_path(path)}: no such directory {echo_path(directory)}")
        self.path = path
        self.directory = directory


class ReadOnlyRoot(PassthroughError):
    """A snapshot archive given to a command that changes the host."""

    def __init__(self, command: str, root: str) -> None:
        super().__init__(
            f"--root {echo_path(root)}: a snapshot archive is read-only; {command} changes a host "
            "(unpack it into a directory of your own to try the change on a copy)"
        )
        self.root = root


class NotConfirmed(PassthroughError):
    """A change to the live host that nobody confirmed: no terminal to ask on and no
    ``--yes``, or the answer was not yes."""

    def __init__(self, command: str, why: str) -> None:
        super().__init__(f"{command} on the live host (/): {why}; nothing was changed")
        self.command = command


def output_file(path: str, option: str = "-o") -> str:
    """``path`` when its directory exists, else :class:`NoOutputDirectory`."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise NoOutputDirectory(option, path, directory)
    return path
