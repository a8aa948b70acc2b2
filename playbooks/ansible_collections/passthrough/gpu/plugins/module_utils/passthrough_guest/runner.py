"""Running the guest's tools (nvidia-smi, dmesg, containerd, kubectl, nvidia-ctk).

A runner takes an argv and returns a :class:`CommandResult`, or None when the tool is not
there. The live runner runs the real tool; :class:`RecordedRunner` replays the output
recorded on a real machine (the captures under a fixture's ``commands/``), so the checks
read the same bytes either way.
"""

from __future__ import annotations

import os
import shutil
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


class RecordedRunner:
    """Replays recorded outputs from a directory; a command with no recording is 'not there'.

    A file ``NAME.rc`` next to a recording holds a non-zero exit status, if it had one.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str]) -> CommandResult | None:
        self.calls.append(tuple(argv))
        for prefix, name in RECORDED_FILES:
            if tuple(argv[: len(prefix)]) == prefix:
                path = os.path.join(self.directory, name)
                try:
                    with open(path, encoding="utf-8", errors="replace") as f:
                        out = f.read()
                except FileNotFoundError:
                    return None
                try:
                    with open(path + ".rc", encoding="utf-8") as f:
                        rc = int(f.read().strip() or 0)
                except (FileNotFoundError, ValueError):
                    rc = 0
                return CommandResult(rc, out if rc == 0 else "", "" if rc == 0 else out)
        return None
