# SPDX-License-Identifier: Apache-2.0
"""The guest role's cluster manifests through real ansible-playbook: the DRA form of GPU sharing
(one role variable picks it over the device plugin's config) and the Windows DirectX path, every
object validated offline (kubernetes-validate at pinned versions, the DRA driver's opaque-config
schema from ../shared/realworld)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from .kube_schemas import kubernetes_errors, opaque_errors
from .test_ansible import guest_manifests


def _manifests(tmp_path: Path, extravars: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out = guest_manifests(tmp_path, extravars)
    return {
        f.stem: [d for d in yaml.safe_load_all(f.read_text()) if d]
        for f in sorted(out.glob("*.yaml"))
    }


def _all_valid(files: dict[str, list[dict[str, Any]]]) -> None:
    for name, docs in files.items():
        for doc in docs:
            assert kubernetes_errors(doc) == [], (name, doc["kind"])
            for config in doc.get("spec", {}).get("devices", {}).get("config", []):
                assert opaque_errors(config["opaque"]["parameters"]) == [], name


@pytest.mark.parametrize("sharing", ["none", "time-slicing", "mps"])
def test_dra_sharing_replaces_the_device_plugin(sharing: str, tmp_path: Path) -> None:
    files = _manifests(
        tmp_path,
        {
            "passthrough_guest_k8s_enabled": True,
            "passthrough_guest_gpu_api": "dra",
            "passthrough_guest_sharing": sharing,
            "passthrough_guest_dra_time_slice": "Long",
            "passthrough_guest_dra_mps_thread_percentage": 50,
            "passthrough_guest_dra_mps_memory_limit": "10Gi",
        },
    )
    assert set(files) == {"runtimeclass", "dra-gpu-claim", "vectoradd-pod"}
    _all_valid(files)
    (claim,) = files["dra-gpu-claim"]
    (pod,) = files["vectoradd-pod"]
    assert pod["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}
    if sharing == "none":
        assert claim["kind"] == "ResourceClaimTemplate"
        assert pod["spec"]["resourceClaims"] == [
            {"name": "gpu", "resourceClaimTemplateName": "passthrough-gpu"}
        ]
        return
    assert claim["kind"] == "ResourceClaim"  # one claim: the pods that name it share the GPU
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimName": "passthrough-gpu"}
    ]
    params = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params["kind"] == "GpuConfig"
    if sharing == "time-slicing":
        assert params["sharing"] == {
            "strategy": "TimeSlicing",
            "timeSlicingConfig": {"interval": "Long"},
        }
    else:
        assert params["sharing"] == {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
            },
        }


def test_dra_rejects_what_the_driver_rejects() -> None:
    """The opaque schema is not vacuous: both strategies' blocks at once, a bad interval."""
    both = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}, "mpsConfig": {}},
    }
    assert opaque_errors(both)
    bad = {
        **both,
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}},
    }
    assert opaque_errors(bad)


def test_windows_directx_is_the_published_plugin_and_a_job_that_proves_the_gpu(
    tmp_path: Path,
) -> None:
    files = _manifests(
        tmp_path,
        {
            "passthrough_guest_windows_directx": True,
            "passthrough_guest_windows_directx_region": "cn-beijing",
        },
    )
    assert set(files) == {"windows-directx-device-plugin", "windows-directx-workload"}
    _all_valid(files)
    (plugin,) = files["windows-directx-device-plugin"]
    (job,) = files["windows-directx-workload"]
    spec = plugin["spec"]["template"]["spec"]
    assert spec["containers"][0]["image"] == (
        "registry-vpc.cn-beijing.aliyuncs.com/acs/directx-device-plugin-windows:v1.0.0"
    )
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    for term in terms:
        keys = {e["key"]: e for e in term["matchExpressions"]}
        assert keys["windows.alibabacloud.com/directx-supported"]["values"] == ["true"]
        assert keys["windows.alibabacloud.com/deployment-topology"]["values"] == ["2.0"]
        assert keys["type"] == {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]}
    assert {k for t in terms for k in (e["key"] for e in t["matchExpressions"])} >= {
        "kubernetes.io/os",
        "beta.kubernetes.io/os",
    }
    assert spec["hostNetwork"] is True
    assert {v["hostPath"]["path"] for v in spec["volumes"]} == {
        "c:/opt/bin",
        "\\\\.\\pipe\\rancher_wins",
    }
    assert job["kind"] == "Job"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert (
        container["image"] == "registry-vpc.cn-beijing.aliyuncs.com/acs/sample-gpu-windows:v1.0.0"
    )
    assert container["resources"]["limits"] == {"windows.alibabacloud.com/directx": "1"}
    assert container["resources"]["requests"] == container["resources"]["limits"]


# -- labelling KubeVirt nodes from the preflight -------------------------------------------

MODULE = (
    Path(__file__).parents[1]
    / "playbooks/ansible_collections/passthrough/gpu/plugins/modules/passthrough_kubevirt_preflight.py"
)


def _label_play() -> list[dict[str, Any]]:
    """The module's own EXAMPLES as the play (so the documented way is the tested way), reading
    the node's sample root, with the report kept for the test."""
    import ast

    tree = ast.parse(MODULE.read_text())
    examples = next(
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and getattr(n.targets[0], "id", "") == "EXAMPLES"
        and isinstance(n.value, ast.Constant)
    )
    tasks = yaml.safe_load(examples)
    tasks[0]["passthrough.gpu.passthrough_kubevirt_preflight"] = {"root": "{{ node_root }}"}
    keep = {
        "name": "Keep the report",
        "ansible.builtin.copy": {
            "content": "{{ preflight | to_json }}",
            "dest": "{{ report_dir }}/{{ inventory_hostname }}.json",
            "mode": "0644",
        },
        "delegate_to": "localhost",
    }
    return [
        {
            "name": "Label nodes",
            "hosts": "nodes",
            "gather_facts": False,
            "tasks": [tasks[0], keep, *tasks[1:]],
        }
    ]


def test_nodes_are_labelled_only_when_the_preflight_passes(tmp_path: Path) -> None:
    """Real ansible-playbook and the real module on two sample nodes. No cluster exists here,
    so the labelling task of the passing node runs and fails to reach one; the failing node's
    labelling task is skipped: that is the gate under test."""
    import json
    import os
    import subprocess
    import sys

    from .conftest import REPO
    from .test_kubevirt import _variant, _vfio_bound

    passing = _variant(tmp_path, "turing-desktop", "passing", _vfio_bound)
    failing = _variant(tmp_path, "turing-desktop", "failing", lambda d: None)
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "nodes": {
            "hosts": {
                "node-pass": {**common, "node_root": str(passing)},
                "node-fail": {**common, "node_root": str(failing)},
            }
        }
    }
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(_label_play(), sort_keys=False))
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "playbooks"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_NOCOLOR": "1",
        "PYTHONPATH": str(REPO),  # the module imports this checkout's passthrough
    }
    r = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(tmp_path / "inv.yml"),
            str(tmp_path / "play.yml"),
            "-e",
            f"report_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    out = json.loads(r.stdout)
    label = next(p for p in out["plays"][0]["tasks"] if p["task"]["name"].startswith("Label"))
    assert label["hosts"]["node-fail"].get("skipped") is True, label["hosts"]["node-fail"]
    tried = label["hosts"]["node-pass"]
    assert tried.get("failed") is True, tried  # it tried: no cluster (or no kubernetes client) here
    assert (
        "kubernetes" in str(tried.get("msg", "")).lower()
        or "config" in str(tried.get("msg", "")).lower()
    ), tried
    good = json.loads((tmp_path / "node-pass.json").read_text())
    bad = json.loads((tmp_path / "node-fail.json").read_text())
    assert good["ok"] is True and good["labels"] == {
        "nvidia.com/gpu.workload.config": "vm-passthrough"
    }
    assert bad["ok"] is False and bad["labels"] == {}
    assert any(f.startswith("kube-vfio-bound:") for f in bad["failures"])
