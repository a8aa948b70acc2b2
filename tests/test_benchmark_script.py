# SPDX-License-Identifier: Apache-2.0
"""The benchmark script keeps working (its figures live in the README; no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "benchmarks" / "bench_scan.py"


def test_benchmark_runs_on_a_small_synthetic_host() -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH), "--ports", "3", "--runs", "1", "--loop-runs", "1", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["functions"] == 2 * (1 + 3 * 9)  # host bridge + 3 ports with 8-function cards
    assert set(report["median_seconds"]) == {
        "passthrough scan --json",
        "passthrough scan --json, regular install",
        "passthrough scan (tree)",
        "lspci -nn (one call)",
    }
    assert all(v > 0 for v in report["median_seconds"].values())
    assert report["ratio"]["lspci -nn (one call)"] == 1.0
    assert report["shell_loop_median_seconds"] > 0 and report["speedup_vs_shell_loop"] > 0


def test_validate_benchmark_runs_on_a_few_files() -> None:
    bench = Path(__file__).parents[1] / "benchmarks" / "bench_validate.py"
    r = subprocess.run(
        [sys.executable, str(bench), "--files", "5", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["files"] == 5
    assert report["passthrough_ok"] is True and report["virt_xml_validate_failures"] == 0


def test_validate_startup_benchmark_runs() -> None:
    bench = Path(__file__).parents[1] / "benchmarks" / "bench_validate_startup.py"
    r = subprocess.run(
        [sys.executable, str(bench), "--runs", "1", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert set(report["median_seconds"]) == {
        "passthrough-validate FILE",
        "passthrough-validate FILE, regular install",
        "passthrough validate FILE",
        "virt-xml-validate FILE domain",
    }
    assert all(v > 0 for v in report["median_seconds"].values())


# slow: synthetic hosts of 1,000 and 2,000 functions (60,000 files; bench_speed.py's smallest)
# and about 40 process starts, 15 s of CPU: a sixth of the quick tier's; CI runs the slow tier
@pytest.mark.slow
def test_speed_benchmark_reports_each_figure_beside_its_reference() -> None:
    """bench_speed.py, shrunk: start-up beside the interpreter, scan beside lspci for each
    size (with its growth), one file and a batch beside virt-xml-validate, all in one run."""
    bench = Path(__file__).parents[1] / "benchmarks" / "bench_speed.py"
    r = subprocess.run(
        [
            sys.executable,
            str(bench),
            "--runs",
            "1",
            "--sizes",
            "1000,2000",
            "--batch",
            "3",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["start_up"]["ratio"]["python -c pass (the interpreter alone)"] == 1.0
    assert report["start_up"]["median_seconds"]["passthrough --version"] > 0
    assert report["start_up"]["median_seconds"]["passthrough --version (console script)"] > 0
    assert set(report["scan"]) == {"1000", "2000"}
    for figures in report["scan"].values():
        assert figures["ratio"]["lspci -nn (one call)"] == 1.0
        assert figures["median_seconds"]["passthrough scan --json"] > 0
        assert figures["median_seconds"]["passthrough scan --json (console script)"] > 0
    assert report["scan"]["1000"]["growth_median_cpu_seconds"]["passthrough scan --json"] == 1.0
    assert report["validate_one_file"]["ratio"]["virt-xml-validate FILE domain"] == 1.0
    assert report["validate_one_file"]["median_seconds"][
        "passthrough validate FILE (console script)"
    ]
    floors = (
        "floor: python, lxml, libvirt's schema compiled",
        "floor: that, then the file by the schema",
    )
    for floor in floors:
        assert report["validate_one_file"]["median_cpu_seconds"][floor] > 0
    for figures in report["scan"].values():
        assert figures["median_cpu_seconds"]["floor: the same reads in bare Python"] > 0
    batch = report["validate_batch"]
    assert batch["files"] == 3 and batch["passthrough_ok"] is True
    assert batch["virt_xml_validate_failures"] == 0 and batch["speedup"] > 0
    assert set(batch["speedups"]) == {
        "passthrough validate FILES",
        "passthrough validate --schema-only FILES",
        "floor: lxml's parse and RelaxNG alone, same workers",
    }
    assert len(report["load_average"]) == 3


def test_hostdevs_benchmark_runs_on_a_small_domain() -> None:
    bench = Path(__file__).parents[1] / "benchmarks" / "bench_validate_hostdevs.py"
    r = subprocess.run(
        [sys.executable, str(bench), "--hostdevs", "40", "--runs", "1", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["hostdevs"] == 40
    for case in ("valid", "one_bad_hostdev"):
        assert report[case]["passthrough_cpu"] > 0 and report[case]["virt_xml_validate_cpu"] > 0
    # 1x, 2x, 4x: a quarter, half and all of --hostdevs, every one failing
    assert list(report["all_failing_cpu"]) == ["10", "20", "40"]
    assert all(cpu > 0 for cpu in report["all_failing_cpu"].values())
