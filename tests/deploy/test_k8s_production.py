"""The Kubernetes production overlay, from its files: TLS, mTLS and the token for every workload, per-service
patches (certificates, databases), router replicas and the gpu-partitioner's DaemonSet on GPU nodes."""

from __future__ import annotations

from typing import Any

from tests.deploy.deploy_files import (
    PRODUCTION,
    SERVICES,
    WORKLOAD_KIND,
    base_objects,
    container,
    env_of,
    find,
    kustomization,
    label_selector_matches,
    load_yaml_docs,
    production_patches,
)


def _common_patches() -> list[tuple[dict[str, Any], list[Any]]]:
    """The JSON patches with a target (tls-auth.yaml, once per workload kind)."""
    return [(p["target"], load_yaml_docs(PRODUCTION / p["path"])[0]) for p in kustomization(PRODUCTION)["patches"]
            if "target" in p and p["path"] == "patches/tls-auth.yaml"]


def test_production_common_patch_turns_on_tls_mtls_and_token_for_every_deployment() -> None:
    common = _common_patches()
    assert {t["kind"] for t, _ in common} == set(WORKLOAD_KIND.values()), "one JSON patch for every workload kind"
    ops = common[0][1]
    for name in SERVICES:
        dep = find(base_objects(), WORKLOAD_KIND[name], f"greenserve-{name}")
        assert any(t["kind"] == WORKLOAD_KIND[name] and label_selector_matches(t["labelSelector"], dep["metadata"]["labels"])
                   for t, _ in common), name
    env = {op["value"]["name"]: op["value"]["value"] for op in ops if op["path"].endswith("/env/-")}
    for var in ("GREENSERVE_TLS_CERT", "GREENSERVE_TLS_KEY", "GREENSERVE_TLS_CLIENT_CA", "GREENSERVE_AUTH_TOKEN_FILE"):
        assert var in env, var


def test_production_per_service_patches_certificates_and_database() -> None:
    patches = {d["metadata"]["name"]: d for t, d in production_patches().values() if isinstance(d, dict)}
    certs = {d["spec"]["secretName"]: d for d in load_yaml_docs(PRODUCTION / "certificates.yaml")
             if d["kind"] == "Certificate" and not d["spec"].get("isCA")}
    for name in SERVICES:
        patch = patches[f"greenserve-{name}"]
        assert patch["kind"] == WORKLOAD_KIND[name]
        pod = patch["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["name"] == name
        if name == "gpu-partitioner":  # its journal is about its node's GPUs: SQLite on the node's disk
            assert "GREENSERVE_DB_URL" not in env_of(c)
            (data,) = [v for v in pod["volumes"] if v["name"] == "data"]
            assert data["hostPath"]["type"] == "DirectoryOrCreate" and data["emptyDir"] is None
        else:
            db = env_of(c)["GREENSERVE_DB_URL"]["secretKeyRef"]
            assert db == {"name": "greenserve-postgres", "key": name}
        (tls,) = [v for v in pod["volumes"] if v["name"] == "tls"]
        secret = tls["secret"]["secretName"]
        cert = certs[secret]["spec"]
        assert {"server auth", "client auth"} <= set(cert["usages"])
        assert f"greenserve-{name}" in cert["dnsNames"] and "localhost" in cert["dnsNames"]
        assert cert["issuerRef"]["name"] == "greenserve-ca"


def test_production_router_replicas_and_gpu_node_placement() -> None:
    kust = kustomization(PRODUCTION)
    replicas = {r["name"]: r["count"] for r in kust["replicas"]}
    assert replicas["greenserve-router"] >= 2
    (hpa,) = load_yaml_docs(PRODUCTION / "router-hpa.yaml")
    assert hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["scaleTargetRef"]["name"] == "greenserve-router"
    (gpu,) = load_yaml_docs(PRODUCTION / "patches" / "gpu-partitioner.yaml")
    pod = gpu["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    env = env_of(pod["containers"][0])
    assert env["GREENSERVE_ENGINE_LAUNCHER"] == "vllm" and "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]


def test_gpu_partitioner_is_a_daemonset_on_gpu_nodes_named_after_its_node() -> None:
    ds = find(base_objects(), "DaemonSet", "greenserve-gpu-partitioner")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    rolling = ds["spec"]["updateStrategy"]["rollingUpdate"]
    assert rolling["maxSurge"] == 0, "never two partitioners on one node's GPUs"
    env = env_of(container(ds))
    # the flags these variables set exist (GREENSERVE_<FLAG>)
    from greenserve.gpu_partitioner.service import GpuPartitionerSettings

    assert env["GREENSERVE_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["GREENSERVE_ENGINE_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    for var in ("GREENSERVE_NODE_NAME", "GREENSERVE_ENGINE_HOST", "GREENSERVE_ENGINE_PORT_RANGE"):
        assert var.removeprefix("GREENSERVE_").lower() in GpuPartitionerSettings.model_fields, var
    (gpu,) = load_yaml_docs(PRODUCTION / "patches" / "gpu-partitioner.yaml")
    assert env_of(gpu["spec"]["template"]["spec"]["containers"][0])["GREENSERVE_ENGINE_LAUNCHER"] in (
        GpuPartitionerSettings.model_fields["engine_launcher"].annotation.__args__)  # type: ignore[union-attr]
