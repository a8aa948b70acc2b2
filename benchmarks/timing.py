# SPDX-License-Identifier: Apache-2.0
"""What the start-up benchmarks share: timing whole processes (wall and CPU), run
alternately so that every command sees the same machine load, and the toolkit as a
regular (non-editable) install runs it.

Not a test and not part of the package: imported by the scripts next to it.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import time
import venv
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).parents[1]

# As installed by pip (which compiles every module): byte code cached, so the untimed
# warm-up run writes it even where the environment turns that off.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(argv: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """(wall, cpu) seconds of one run, output discarded; exits naming the command if it fails."""
    cpu0, start = _cpu(), time.perf_counter()
    r = subprocess.run(
        list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False, env=env or ENV
    )
    elapsed, cpu = time.perf_counter() - start, _cpu() - cpu0
    if r.returncode != 0:
        sys.exit(f"{argv[0]} failed: {r.stderr.decode(errors='replace').strip()}")
    return elapsed, cpu


class Samples:
    """Wall and CPU seconds per command label, in the order the commands were given."""

    def __init__(self, labels: Sequence[str]) -> None:
        self.wall: dict[str, list[float]] = {k: [] for k in labels}
        self.cpu: dict[str, list[float]] = {k: [] for k in labels}

    def add(self, label: str, sample: tuple[float, float]) -> None:
        self.wall[label].append(sample[0])
        self.cpu[label].append(sample[1])

    def median(self, label: str) -> float:
        return statistics.median(self.wall[label])

    def median_cpu(self, label: str) -> float:
        return statistics.median(self.cpu[label])

    def fastest(self, label: str) -> float:
        return min(self.wall[label])


def alternate(
    commands: Mapping[str, Sequence[str]], runs: int, env: Mapping[str, str] | None = None
) -> Samples:
    """Each command ``runs`` times, one after another in turn, after one untimed run each
    (the page cache warm for all)."""
    for argv in commands.values():
        run_once(argv, env)
    samples = Samples(list(commands))
    for _ in range(runs):
        for label, argv in commands.items():
            samples.add(label, run_once(argv, env))
    return samples


def regular_install(tmp: str) -> Path:
    """The python of a fresh venv whose site-packages lists this checkout and ours in a .pth
    file: the toolkit as a regular install runs it, without the editable-install finder
    that ``site`` imports at every start of an editable one."""
    env_dir = Path(tmp) / "regular"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "passthrough-checkout.pth").write_text(
        f"{REPO}\n{sysconfig.get_paths()['purelib']}\n"
    )
    return python


def summary(samples: Samples, base: str) -> dict[str, dict[str, float]]:
    """Median and fastest wall time, median CPU time, and both medians as multiples of
    ``base``'s (the tool a user would otherwise run)."""
    labels = list(samples.wall)
    wall = {k: samples.median(k) for k in labels}
    cpu = {k: samples.median_cpu(k) for k in labels}
    return {
        "median_seconds": {k: round(v, 4) for k, v in wall.items()},
        "min_seconds": {k: round(samples.fastest(k), 4) for k in labels},
        "median_cpu_seconds": {k: round(v, 4) for k, v in cpu.items()},
        "ratio": {k: round(v / wall[base], 2) for k, v in wall.items()},
        "cpu_ratio": {k: round(v / cpu[base], 2) for k, v in cpu.items() if cpu[base] > 0},
    }


def print_summary(report: Mapping[str, Mapping[str, float]]) -> None:
    print(f"{'':<44} {'median':>9} {'fastest':>9} {'x':>5} {'CPU':>9} {'x':>5}")
    for label in report["median_seconds"]:
        print(
            f"{label:<44} {report['median_seconds'][label] * 1000:7.1f}ms"
            f" {report['min_seconds'][label] * 1000:7.1f}ms"
            f" {report['ratio'][label]:5.1f}"
            f" {report['median_cpu_seconds'][label] * 1000:7.1f}ms"
            f" {report['cpu_ratio'].get(label, 0):5.1f}"
        )
