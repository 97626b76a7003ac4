"""The Kubernetes overlays as rendered by kustomize (or kubectl kustomize; skipped when neither is on PATH)."""

from __future__ import annotations

from typing import Any

from tests.deploy.deploy_files import BASE, DEV, PRODUCTION, SERVICES, WORKLOAD_KIND, container, env_of, render


def _rendered_deployments(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every service's workload (Deployment, or DaemonSet for the gpu-partitioner) by name."""
    deps = {o["metadata"]["name"]: o for o in objs if o["kind"] in ("Deployment", "DaemonSet")}
    assert {n: deps[f"greenserve-{n}"]["kind"] for n in SERVICES if f"greenserve-{n}" in deps} == WORKLOAD_KIND
    assert set(deps) == {f"greenserve-{n}" for n in SERVICES}
    return deps


def test_rendered_dev_overlay_runs_the_simulated_partitioner_on_any_node() -> None:
    ds = _rendered_deployments(render(DEV))["greenserve-gpu-partitioner"]
    assert "nodeSelector" not in ds["spec"]["template"]["spec"], "dev clusters have no GPU nodes"


def test_rendered_production_overlay() -> None:
    objs = render(PRODUCTION)
    deps = _rendered_deployments(objs)
    certs = {o["spec"]["secretName"]: o for o in objs if o["kind"] == "Certificate"}
    for o in objs:
        if o["kind"] != "Namespace":
            assert o["metadata"].get("namespace") == "greenserve", f"{o['kind']}/{o['metadata']['name']}"
    for name, port in SERVICES.items():
        dep = deps[f"greenserve-{name}"]
        pod = dep["spec"]["template"]["spec"]
        c = container(dep)
        env = env_of(c)
        for var in ("GREENSERVE_TLS_CERT", "GREENSERVE_TLS_KEY", "GREENSERVE_TLS_CLIENT_CA", "GREENSERVE_TLS_CA",
                    "GREENSERVE_AUTH_TOKEN_FILE"):
            assert var in env, f"{name}: {var}"
        if name == "gpu-partitioner":
            assert "GREENSERVE_DB_URL" not in env and "hostPath" in {v["name"]: v for v in pod["volumes"]}["data"]
        else:
            assert env["GREENSERVE_DB_URL"]["secretKeyRef"]["key"] == name
        assert env["GREENSERVE_PORT"] == str(port)
        # every file named by an env var lies in a mounted Secret volume
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        for var in ("GREENSERVE_TLS_CERT", "GREENSERVE_TLS_KEY", "GREENSERVE_TLS_CLIENT_CA", "GREENSERVE_AUTH_TOKEN_FILE"):
            directory, _, key = env[var].rpartition("/")
            volume = volumes[mounts[directory]]
            assert "secret" in volume, f"{name}: {var} on a Secret volume"
        tls_secret = volumes[mounts[env["GREENSERVE_TLS_CERT"].rpartition("/")[0]]]["secret"]["secretName"]
        assert tls_secret in certs, f"{name}: TLS Secret {tls_secret} is issued by a Certificate"
        token_secret = volumes[mounts[env["GREENSERVE_AUTH_TOKEN_FILE"].rpartition("/")[0]]]["secret"]
        assert token_secret["secretName"] == "greenserve-auth-token"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["exec"]["command"] == ["greenserve-healthcheck"], f"{name}: {probe} (TLS needs exec)"
        if name != "gpu-partitioner":
            assert pod["securityContext"]["runAsNonRoot"] is True
    assert deps["greenserve-router"]["spec"]["replicas"] >= 2
    gpu = deps["greenserve-gpu-partitioner"]["spec"]["template"]["spec"]
    assert gpu["nodeSelector"]["nvidia.com/gpu.present"] == "true" and gpu["runtimeClassName"] == "nvidia"
    kinds = {o["kind"] for o in objs}
    assert {"Issuer", "Certificate", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Namespace"} <= kinds


def test_rendered_dev_overlay_is_plaintext_sqlite() -> None:
    objs = render(DEV)
    deps = _rendered_deployments(objs)
    for name, port in SERVICES.items():
        dep = deps[f"greenserve-{name}"]
        assert dep["metadata"]["namespace"] == "greenserve-dev"
        c = container(dep)
        env = env_of(c)
        assert not any(k.startswith("GREENSERVE_TLS_") for k in env), f"{name}: no TLS in dev"
        assert "GREENSERVE_DB_URL" not in env, f"{name}: SQLite in the data emptyDir"
        assert env["GREENSERVE_HOST"] == "0.0.0.0"
        assert c["readinessProbe"]["grpc"]["port"] == port
    assert not [o for o in objs if o["kind"] in ("Certificate", "Issuer")]


def test_rendered_base() -> None:
    objs = render(BASE)
    assert len(_rendered_deployments(objs)) == len(SERVICES)
