# SPDX-License-Identifier: Apache-2.0
"""Running the guest's tools (nvidia-smi, dmesg, containerd, kubectl, nvidia-ctk).

A runner takes an argv and returns a :class:`CommandResult`, or None when the tool is not
there. The live runner runs the real tool; :class:`RecordedRunner` replays the output
recorded on a real machine (the captures under a fixture's ``commands/``), so the checks
read the same bytes either way.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str = ""


# quoted: module_utils are also read by tools that evaluate it for older Pythons
Runner = Callable[[Sequence[str]], "CommandResult | None"]

# Where the tools live besides PATH: cloud GPU images put the driver's tools under
# /usr/local/nvidia/bin; sbin is not on a normal user's PATH but dmesg may be there.
EXTRA_PATH = ("/usr/local/nvidia/bin", "/usr/local/sbin", "/usr/sbin", "/sbin")
TIMEOUT_S = 60


def live_runner(argv: Sequence[str]) -> CommandResult | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *EXTRA_PATH])
    exe = shutil.which(argv[0], path=path)
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, *argv[1:]],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return CommandResult(124, "", f"{argv[0]}: no answer in {TIMEOUT_S}s")
    except OSError as exc:
        return CommandResult(126, "", f"{argv[0]}: {exc.strerror or exc}")
    return CommandResult(done.returncode, done.stdout, done.stderr)


def no_runner(argv: Sequence[str]) -> CommandResult | None:
    """A captured root: its tools cannot be run, so every command is 'not there'."""
    return None


def runner_for(live: bool, commands: str | None) -> Runner:
    """Recorded outputs when given; else the real tools on a live root, none on a capture."""
    if commands:
        return RecordedRunner(commands)
    return live_runner if live else no_runner


# argv prefix → the file a recording keeps its output in (names as in the fixtures).
RECORDED_FILES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("nvidia-smi", "-q", "-x"), "nvidia-smi-q.xml"),
    (("dmesg",), "dmesg.txt"),
    (("containerd", "config", "dump"), "containerd-config-dump.toml"),
    (("nvidia-ctk", "--version"), "nvidia-ctk-version.txt"),
    (("kubectl", "get", "node"), "kubectl-get-node.json"),
)


# The most one recording may hold: ``nvidia-smi -q -x`` of an 8-GPU guest is about 0.3 MiB,
# a long ``dmesg`` a few MiB.
MAX_RECORDING = 16 << 20


class BadRecording(Exception):
    """A recording that is not a regular file, or is larger than :data:`MAX_RECORDING`."""


def read_recording(directory: str, name: str) -> str | None:
    """The text of ``directory/name``; None when there is none. Only a regular file is read
    (a link may point at one): a FIFO, a device such as /dev/zero or a directory is
    refused without waiting or reading, and so is a file over :data:`MAX_RECORDING`."""
    path = os.path.join(directory, name)
    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadRecording(f"{name}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadRecording(f"{name}: not a regular file")
        chunks: list[bytes] = []
        total = 0
        while total <= MAX_RECORDING:
            chunk = os.read(fd, min(1 << 20, MAX_RECORDING + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > MAX_RECORDING:
        raise BadRecording(f"{name}: larger than {MAX_RECORDING >> 20} MiB")
    return b"".join(chunks).decode("utf-8", "replace")


class RecordedRunner:
    """Replays recorded outputs from a directory; a command with no recording is 'not there'.

    A file ``NAME.rc`` next to a recording holds a non-zero exit status, if it had one.
    Recordings are read with :func:`read_recording` (regular files only, size-capped).
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str]) -> CommandResult | None:
        self.calls.append(tuple(argv))
        for prefix, name in RECORDED_FILES:
            if tuple(argv[: len(prefix)]) == prefix:
                out = read_recording(self.directory, name)
                if out is None:
                    return None
                try:
                    rc = int((read_recording(self.directory, name + ".rc") or "0").strip() or 0)
                except ValueError:
                    rc = 0
                return CommandResult(rc, out if rc == 0 else "", "" if rc == 0 else out)
        return None
