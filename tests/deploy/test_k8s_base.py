"""The Kubernetes kustomizations (base and overlays list only files that exist) and the base: a workload and a
Service per service, hardened and bounded pods, the router's HTTP port and disruption budget, the ConfigMap's
addresses."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.deploy_files import (
    ADDR_VARS,
    BASE,
    DEV,
    PRODUCTION,
    ROOT,
    ROUTER_HTTP_PORT,
    SERVICES,
    WORKLOAD_KIND,
    base_objects,
    console_scripts,
    container,
    dockerfile_stages,
    env_of,
    exec_form,
    find,
    image_repo,
    kustomization,
    stage_value,
)


@pytest.mark.parametrize("directory", [BASE, PRODUCTION, DEV], ids=["base", "production", "dev"])
def test_kustomization_lists_only_files_that_exist(directory: Path) -> None:
    kust = kustomization(directory)
    assert kust["resources"]
    for res in kust["resources"]:
        assert (directory / res).exists(), f"{directory.relative_to(ROOT)}: resource {res} missing"
    for patch in kust.get("patches", []):
        if "path" in patch:
            assert (directory / patch["path"]).is_file(), f"patch {patch['path']} missing"
    listed = {(directory / r).resolve() for r in kust["resources"]}
    listed |= {(directory / p["path"]).resolve() for p in kust.get("patches", []) if "path" in p}
    for path in directory.rglob("*.yaml"):
        if path.name != "kustomization.yaml":
            assert path.resolve() in listed, f"{path.relative_to(ROOT)} is not used by its kustomization"


def test_base_has_a_deployment_and_service_per_service() -> None:
    objs = base_objects()
    stages = dockerfile_stages()
    for name, port in SERVICES.items():
        dep = find(objs, WORKLOAD_KIND[name], f"greenserve-{name}")
        svc = find(objs, "Service", f"greenserve-{name}")
        c = container(dep)
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert svc["spec"]["selector"].items() <= pod_labels.items()

        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["grpc"] == port
        svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
        assert svc_ports["grpc"]["port"] == port and svc_ports["grpc"]["targetPort"] in ("grpc", port)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"]["port"] == port, f"{name}: {probe} uses gRPC health on {port}"

        repo = image_repo(c["image"])
        assert repo == f"greenserve/{name}" and repo.split("/")[-1] in stages
        script = exec_form(stage_value(name, "ENTRYPOINT") or "[]")
        assert script == [f"greenserve-{name}"] and script[0] in console_scripts()
        assert "command" not in c or c["command"] == script, f"{name}: command keeps the image's console script"

        env = env_of(c)
        assert env["GREENSERVE_HOST"] == "0.0.0.0" and env["GREENSERVE_PORT"] == str(port)
        assert any(ref["configMapRef"]["name"] == "greenserve-config" for ref in c["envFrom"])


def test_base_pods_are_hardened_and_bounded() -> None:
    objs = base_objects()
    for name in SERVICES:
        dep = find(objs, WORKLOAD_KIND[name], f"greenserve-{name}")
        pod = dep["spec"]["template"]["spec"]
        c = container(dep)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert pod["terminationGracePeriodSeconds"] >= 30
        assert pod["enableServiceLinks"] is False, "service links would inject GREENSERVE_*_PORT=tcp://..."
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{name}: resources.{kind}"
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        data_dir = env_of(c)["GREENSERVE_DATA_DIR"]
        assert "emptyDir" in volumes[mounts[data_dir]], f"{name}: data dir on an emptyDir"
        assert "emptyDir" in volumes[mounts["/tmp"]]


def test_base_router_http_port_and_disruption_budget() -> None:
    objs = base_objects()
    dep = find(objs, "Deployment", "greenserve-router")
    c = container(dep)
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["http"] == ROUTER_HTTP_PORT
    assert env_of(c)["GREENSERVE_HTTP_PORT"] == str(ROUTER_HTTP_PORT)
    svc = find(objs, "Service", "greenserve-router")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]}["http"] == ROUTER_HTTP_PORT
    pdb = find(objs, "PodDisruptionBudget", "greenserve-router")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert dep["spec"]["replicas"] >= 2


def test_base_configmap_addresses_name_existing_services() -> None:
    objs = base_objects()
    data = find(objs, "ConfigMap", "greenserve-config")["data"]
    addrs = {k: v for k, v in data.items() if k.endswith("_ADDR")}
    assert set(addrs) == set(ADDR_VARS)
    for var, value in addrs.items():
        host, _, port = value.rpartition(":")
        svc = find(objs, "Service", host)
        assert svc["metadata"]["name"] == f"greenserve-{ADDR_VARS[var]}"
        grpc_port = {p["name"]: p["port"] for p in svc["spec"]["ports"]}["grpc"]
        assert int(port) == grpc_port == SERVICES[ADDR_VARS[var]]
