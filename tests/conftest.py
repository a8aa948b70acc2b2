"""Shared fixtures: every bundled sample host built once per session as a real tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from passthrough import fakehost

GOLDEN = Path(__file__).parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--regenerate-golden",
        action="store_true",
        help="rewrite golden files from the current output instead of comparing",
    )


@pytest.fixture(scope="session")
def regenerate(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--regenerate-golden"))


@pytest.fixture(scope="session")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hosts")
    return {
        name: fakehost.build(fakehost.load(name), base / name) for name in fakehost.sample_names()
    }


def build_variant(tmp_path: Path, name: str, **overrides: object) -> Path:
    """A sample host with top-level keys of its description replaced."""
    desc = fakehost.load(name)
    data = dict(desc.data)
    data.update(overrides)
    return fakehost.build(fakehost.Description(data, f"{name}+variant"), tmp_path / "root")
