# SPDX-License-Identifier: Apache-2.0
"""CI's schedule beside the lab tier: while the lab's nested guest boots, the tests run beside
it start nothing new (lab/labcore.py `alone`, tests/conftest.py `wait_for_the_lab`). Real
processes and files; the lab itself is not booted here."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .conftest import REPO, wait_for_the_lab

sys.path.insert(0, str(REPO / "lab"))
import labcore as lab_run


def test_no_file_no_wait(tmp_path: Path) -> None:
    assert wait_for_the_lab(str(tmp_path / "none")) < 0.5


def test_a_live_lab_holds_the_tests_until_its_file_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "alone"
    monkeypatch.setenv(lab_run.ALONE, str(flag))
    held = threading.Event()
    done: list[float] = []

    def lab() -> None:
        with lab_run.alone():
            assert flag.read_text().split() == [str(os.getpid())]
            held.set()
            time.sleep(1.5)
        assert not flag.exists()

    t = threading.Thread(target=lab)
    t.start()
    held.wait(5)
    done.append(wait_for_the_lab(str(flag), poll=0.1))
    t.join()
    assert 1.0 <= done[0] < 5


def test_a_dead_lab_or_a_limit_does_not_hold_them(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    flag = tmp_path / "alone"
    flag.write_text(f"{gone.pid}\n")
    assert wait_for_the_lab(str(flag), poll=0.1) < 0.5  # its process is gone
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        flag.write_text(f"{alive.pid}\n")
        assert 0.9 <= wait_for_the_lab(str(flag), limit=1.0, poll=0.1) < 3
    finally:
        alive.kill()
        alive.wait()
