# SPDX-License-Identifier: Apache-2.0
"""The CLI in a process of its own, as a user meets it, without paying for a new interpreter.

``run_cli(args)`` answers what ``subprocess.run([python, "-m", "passthrough", *args],
capture_output=True, text=True)`` would: the command runs in a forked child of the test
process, with its own file descriptors 0, 1 and 2 (pipes, or the inherited stdin), its own
environment and working directory, ``sys.argv`` as ``-m`` sets it, and its exit status from
``os._exit`` — what ``passthrough/__main__.py`` does, less the interpreter's start-up and the
imports (a quarter of a second each, hundreds of times in the quick tier).

What is decided when an interpreter starts cannot be given to a fork: an environment that
changes Python's own settings or the locale (``PYTHON*``, ``LANG``, ``LC_*``) runs a real
``python -m passthrough``, and so does any call with ``fresh=True`` (start-up, imports and
signals under test). The child puts back what the test process set up for itself (pytest's
warning recorder and log handlers, faulthandler) but inherits the rest of its state: modules
already imported (a ``tarfile.py`` in the working directory is not picked up, as ``-m``
would), anything a test monkeypatched (such a test must use ``fresh=True``), and it skips
``atexit`` handlers (``os._exit``; the CLI registers none)."""

from __future__ import annotations

import faulthandler
import io
import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

PT = [sys.executable, "-m", "passthrough"]
MAIN = str(Path(__file__).parents[1] / "passthrough" / "__main__.py")
# settings the interpreter reads once, at start-up
_STARTUP = ("PYTHON", "LANG", "LC_")
# how warnings are shown and filtered before pytest records them per test (this module is
# imported at collection, outside any test): the child shows them on its stderr again
_SHOWWARNING = warnings.showwarning
_FILTERS = list(warnings.filters)


def _startup_differs(env: Mapping[str, str]) -> bool:
    keys = {k for k in (*env, *os.environ) if k.startswith(_STARTUP)}
    return any(env.get(k) != os.environ.get(k) for k in keys)


def run_cli(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    cwd: str | Path | None = None,
    timeout: float = 120,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    argv = [*PT, *args]
    if fresh or (env is not None and _startup_differs(env)):
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            env=None if env is None else dict(env),
            input=input,
            cwd=cwd,
            timeout=timeout,
        )
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if input is not None else (-1, -1)
    pid = os.fork()
    if pid == 0:  # the child: becomes `python -m passthrough ARGS`
        _child(list(args), env, cwd, in_r, out_w, err_w)
    for fd in (out_w, err_w, in_r):
        if fd >= 0:
            os.close(fd)
    return _collect(pid, argv, out_r, err_r, in_w, input, timeout)


def _child(
    args: list[str],
    env: Mapping[str, str] | None,
    cwd: str | Path | None,
    in_r: int,
    out_w: int,
    err_w: int,
) -> None:
    code = 1
    try:
        if in_r >= 0:
            os.dup2(in_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (in_r, out_w, err_w):
            if fd > 2:
                os.close(fd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        tempfile.tempdir = None  # TMPDIR is read again, as a new interpreter would
        if cwd is not None:
            os.chdir(cwd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # what the test process set up for itself is not the command's: pytest's warning
        # recorder, its log handlers, faulthandler on its own descriptor
        warnings.showwarning = _SHOWWARNING
        warnings.filters[:] = _FILTERS
        logging.root.handlers.clear()
        faulthandler.disable()
        # the standard streams as a new interpreter opens them on pipes (UTF-8 here)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False),
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        sys.argv = [MAIN, *args]
        from passthrough.cli import main

        code = main(args)
    except SystemExit as exc:  # what the interpreter makes of SystemExit
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                code = code or 120  # as the interpreter's exit when its flush fails
        os._exit(code & 0xFF)


def _feed(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


def _collect(
    pid: int,
    argv: list[str],
    out_r: int,
    err_r: int,
    in_w: int,
    input: str | None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    if input is not None:
        # fed beside the reading below: a child that answers before it has read all of its
        # input fills its pipes while we write, and neither would go on
        threading.Thread(target=_feed, args=(in_w, input.encode()), daemon=True).start()
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for fd in chunks:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                for fd in chunks:
                    os.close(fd)
                raise subprocess.TimeoutExpired(argv, timeout)
            for key, _ in sel.select(left):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fd)
                    os.close(key.fd)
    _, status = os.waitpid(pid, 0)
    # text=True's reading: UTF-8 (the locale here) with universal newlines
    out, err = (
        b"".join(chunks[fd]).decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        for fd in (out_r, err_r)
    )
    return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status), out, err)
