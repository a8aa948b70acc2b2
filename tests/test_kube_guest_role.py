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
