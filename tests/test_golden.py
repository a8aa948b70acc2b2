# SPDX-License-Identifier: Apache-2.0
"""scan --json of every sample host against its golden file.

Regenerate after an intended change with ``pytest --regenerate-golden`` and review the diff.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from passthrough import fakehost
from passthrough.analysis.scan import analyse
from passthrough.host.discover import discover
from passthrough.output.json import scan_json

from .conftest import GOLDEN, assert_golden

SCHEMA = json.loads(
    (Path(__file__).parents[1] / "passthrough/schemas/scan-v1.schema.json").read_text()
)


def _normalised(root: Path) -> str:
    data = scan_json(analyse(discover(str(root))))
    data["root"] = "<root>"
    return json.dumps(data, indent=2) + "\n"


@pytest.mark.parametrize("name", fakehost.sample_names())
def test_scan_json_matches_golden(name: str, hosts: dict[str, Path], regenerate: bool) -> None:
    got = _normalised(hosts[name])
    jsonschema.validate(json.loads(got), SCHEMA)
    path = GOLDEN / "scan" / f"{name}.json"
    assert_golden(path, got, regenerate, "scan")


def test_every_sample_has_a_golden_file() -> None:
    names = {p.stem for p in (GOLDEN / "scan").glob("*.json")}
    assert names == set(fakehost.sample_names())
