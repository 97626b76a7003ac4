"""Checks of deploy/: the Dockerfile targets, the compose file, the Kubernetes base and overlays.

Static checks parse the files (YAML, Dockerfile, dockerignore) and cross-check them against each
other and against pyproject.toml. Where `kustomize` or `kubectl` is on PATH the overlays are also
rendered and the rendered objects checked. One test starts a real service with the environment the
production overlay gives a pod (paths remapped to temporary files) and runs the image's health
check against it, as the exec probes do.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
DOCKERIGNORE = DEPLOY / "docker" / "Dockerfile.dockerignore"
HEALTHCHECK = DEPLOY / "docker" / "healthcheck.py"
COMPOSE = DEPLOY / "compose.yaml"
K8S = DEPLOY / "k8s"
BASE = K8S / "base"
PRODUCTION = K8S / "overlays" / "production"
DEV = K8S / "overlays" / "dev"

# service (compose name, Dockerfile target, image name) -> default gRPC port
SERVICES: dict[str, int] = {
    "forecaster": 50051,
    "profiler": 50052,
    "optimizer": 50053,
    "cache-manager": 50054,
    "gpu-partitioner": 50055,
    "router": 50056,
}
ROUTER_HTTP_PORT = 8080
# every service is a Deployment but the gpu-partitioner: one per GPU node (DaemonSet)
WORKLOAD_KIND: dict[str, str] = {name: "DaemonSet" if name == "gpu-partitioner" else "Deployment" for name in SERVICES}
ADDR_VARS = {f"GREENSERVE_{name.upper().replace('-', '_')}_ADDR": name for name in SERVICES}


# ----------------------------------------------------------------------------------------------
# helpers


def load_yaml_docs(path: Path) -> list[Any]:
    with path.open() as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


def console_scripts() -> dict[str, str]:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        return tomllib.load(fh)["project"]["scripts"]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        instr, _, args = line.partition(" ")
        out.append((instr.upper(), args.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


@cache
def dockerfile_stages() -> dict[str, dict[str, Any]]:
    """Stage name -> {'base': image or stage, 'instructions': [...]}; global ARG defaults expanded."""
    global_args: dict[str, str] = {}
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for instr, args in dockerfile_instructions(DOCKERFILE):
        if instr == "ARG" and current is None:
            name, _, default = args.partition("=")
            global_args[name] = default
            continue
        if instr == "FROM":
            parts = args.split()
            parts = [p for p in parts if not p.startswith("--")]
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: global_args[m.group(1) or m.group(2)], parts[0])
            assert len(parts) == 3 and parts[1].upper() == "AS", f"every stage is named: FROM {args}"
            current = {"base": base, "instructions": []}
            stages[parts[2]] = current
            continue
        assert current is not None, f"{instr} before the first FROM"
        current["instructions"].append((instr, args))
    return stages


def stage_chain(name: str) -> list[str]:
    """The stage and the stages it builds on, nearest first."""
    stages = dockerfile_stages()
    chain = [name]
    while stages[chain[-1]]["base"] in stages:
        chain.append(stages[chain[-1]]["base"])
    return chain


def stage_value(name: str, instr: str) -> str | None:
    """The last value of an instruction in effect for a stage (inherited from its parents)."""
    for stage in stage_chain(name):
        values = [a for i, a in dockerfile_stages()[stage]["instructions"] if i == instr]
        if values:
            return values[-1]
    return None


def stage_env(name: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for stage in reversed(stage_chain(name)):
        for instr, args in dockerfile_stages()[stage]["instructions"]:
            if instr == "ENV":
                for token in re.findall(r'(\w+)=("[^"]*"|\S+)', args):
                    env[token[0]] = token[1].strip('"')
    return env


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"exec form expected: {args}"
    return value


def dockerignore_excludes(rel_path: str) -> bool:
    """Whether the dockerignore keeps rel_path out of the build context (last matching rule wins)."""
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        rules.append((negate, re.compile(regex.strip("/"))))
    parts = rel_path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negate, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            excluded = not negate
    return excluded


_INTERP = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: Any) -> Any:
    """Compose variable interpolation with every variable unset: ${X:-default} -> default."""
    if isinstance(value, str):
        return _INTERP.sub(lambda m: m.group(2) or "", value)
    return value


@cache
def compose() -> dict[str, Any]:
    (doc,) = load_yaml_docs(COMPOSE)
    return doc


def compose_env(service: str) -> dict[str, Any]:
    env = compose()["services"][service].get("environment", {})
    assert isinstance(env, dict), f"{service}: environment as a mapping"
    return {k: interpolate(v) for k, v in env.items()}


def kustomization(directory: Path) -> dict[str, Any]:
    (doc,) = load_yaml_docs(directory / "kustomization.yaml")
    return doc


def base_objects() -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for res in kustomization(BASE)["resources"]:
        objs.extend(load_yaml_docs(BASE / res))
    return objs


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"exactly one {kind}/{name}, found {len(hits)}"
    return hits[0]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{deployment['metadata']['name']}: one container"
    return containers[0]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def image_repo(image: str) -> str:
    return image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


def kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


@cache
def render(directory: Path) -> list[dict[str, Any]]:
    cmd = kustomize_command()
    if cmd is None:
        pytest.skip("neither kustomize nor kubectl is on PATH; the rendered-overlay checks need one")
    proc = subprocess.run([*cmd, str(directory)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)} {directory.relative_to(ROOT)} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d is not None]


# ----------------------------------------------------------------------------------------------
# every file


def test_every_yaml_file_under_deploy_parses() -> None:
    files = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
    assert len(files) >= 10
    for path in files:
        docs = load_yaml_docs(path)
        assert docs, f"{path.relative_to(ROOT)} holds no document"
        for doc in docs:
            assert isinstance(doc, (dict, list)), f"{path.relative_to(ROOT)}: a mapping or a JSON patch list"


def test_no_machine_paths_in_deploy_files() -> None:
    for path in DEPLOY.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            text = path.read_bytes()
            for bad in (b"/work/", b"/root/", b"/home/runner"):
                assert bad not in text, f"{path.relative_to(ROOT)} names a machine path {bad!r}"


# ----------------------------------------------------------------------------------------------
# Dockerfile


def test_dockerfile_has_a_target_per_service_running_its_console_script() -> None:
    stages = dockerfile_stages()
    scripts = console_scripts()
    for name, port in SERVICES.items():
        assert name in stages, f"Dockerfile target {name!r} missing"
        script = f"greenserve-{name}"
        assert script in scripts, f"pyproject.toml has no console script {script}"
        entrypoint = [a for i, a in stages[name]["instructions"] if i == "ENTRYPOINT"]
        assert len(entrypoint) == 1, f"target {name} declares its own ENTRYPOINT"
        assert exec_form(entrypoint[0]) == [script]
        expose = [a for i, a in stages[name]["instructions"] if i == "EXPOSE"]
        assert str(port) in " ".join(expose).split(), f"target {name} exposes {port}"
        env = stage_env(name)
        assert env["GREENSERVE_PORT"] == str(port)
        assert env["GREENSERVE_HOST"] == "0.0.0.0", "containers bind all interfaces"
        assert env["OTEL_SERVICE_NAME"] == script
    assert str(ROUTER_HTTP_PORT) in " ".join(a for i, a in stages["router"]["instructions"] if i == "EXPOSE").split()
    assert stage_env("router")["GREENSERVE_HTTP_PORT"] == str(ROUTER_HTTP_PORT)


def test_runtime_images_are_slim_non_root_and_built_from_a_wheel() -> None:
    stages = dockerfile_stages()
    builder = " ".join(a for i, a in stages["builder"]["instructions"] if i == "RUN")
    assert "pip wheel" in builder, "the builder stage builds wheels"
    for name in SERVICES:
        chain = stage_chain(name)
        root = stages[chain[-1]]["base"]
        assert root == "python:3.11-slim", f"{name} is built on python:3.11-slim, not {root}"
        assert "builder" not in chain, f"{name} must not inherit the builder stage"
        user = stage_value(name, "USER")
        assert user is not None and user.split(":")[0] not in {"0", "root"}, f"{name} runs as non-root"
        runs = " ".join(a for s in chain for i, a in stages[s]["instructions"] if i == "RUN")
        assert "apt-get install" not in runs and "gcc" not in runs, f"{name}: no build tools in the runtime image"
        assert "from=builder" in runs and "--no-index" in runs, f"{name} installs the builder's wheels offline"
        healthcheck = stage_value(name, "HEALTHCHECK")
        assert healthcheck is not None and "greenserve-healthcheck" in healthcheck


def test_gpu_partitioner_image_documents_the_nvidia_runtime() -> None:
    text = DOCKERFILE.read_text()
    block = text[: text.index("FROM runtime AS gpu-partitioner")].rsplit("\n\n", 1)[-1]
    words = " ".join(block.replace("#", " ").split())
    assert "NVIDIA container runtime" in words and "simulated NVML" in words
    assert stage_env("gpu-partitioner")["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_lmcache_server_target() -> None:
    stages = dockerfile_stages()
    assert "lmcache-server" in stages
    args = [a for i, a in stages["lmcache-server"]["instructions"] if i == "ARG"]
    assert "LMCACHE_VERSION=0.5.6" in args
    runs = " ".join(a for i, a in stages["lmcache-server"]["instructions"] if i == "RUN")
    assert 'lmcache==${LMCACHE_VERSION}' in runs
    entry = exec_form(stage_value("lmcache-server", "ENTRYPOINT") or "[]")
    cmd = exec_form(stage_value("lmcache-server", "CMD") or "[]")
    argv = entry + cmd
    assert argv[:2] == ["lmcache", "server"]
    flags = dict(zip(argv[2::2], argv[3::2]))
    assert flags["--l1-size-gb"] == "1" and flags["--eviction-policy"] == "LRU"
    assert flags["--http-port"] == "8300" and flags["--port"] == "8301"
    # LMCache binds loopback by default; a container must listen on all interfaces
    assert flags["--http-host"] == "0.0.0.0" and flags["--host"] == "0.0.0.0"
    user = stage_value("lmcache-server", "USER")
    assert user is not None and user.split(":")[0] not in {"0", "root"}
    assert "CPU build" in DOCKERFILE.read_text()


def test_build_context_holds_what_the_build_needs_and_nothing_else() -> None:
    for needed in ("pyproject.toml", "setup.py", "services/__init__.py", "services/v1/router_pb2.py",
                   "clients/python/greenserve_client/__init__.py", "deploy/docker/healthcheck.py"):
        assert (ROOT / needed).exists(), needed
        assert not dockerignore_excludes(needed), f"the dockerignore keeps {needed} out of the context"
    for unwanted in (".git/HEAD", ".venv/bin/python", "tests/unit/test_carbon.py", "services/__pycache__/x.pyc",
                     "deploy/k8s/base/kustomization.yaml", "services/router/x.db"):
        assert dockerignore_excludes(unwanted), f"{unwanted} should stay out of the build context"
    for stage in dockerfile_stages().values():
        for instr, args in stage["instructions"]:
            if instr != "COPY" or "--from" in args:
                continue
            sources = [a for a in args.split() if not a.startswith("--")][:-1]
            for src in sources:
                if src == ".":
                    continue
                assert (ROOT / src).exists(), f"COPY source {src} missing"
                assert not dockerignore_excludes(src), f"COPY source {src} excluded by the dockerignore"


def test_healthcheck_script_compiles() -> None:
    compile(HEALTHCHECK.read_text(), str(HEALTHCHECK), "exec")  # no __pycache__ left in deploy/
    assert HEALTHCHECK.read_text().startswith("#!/usr/bin/env python3")


# ----------------------------------------------------------------------------------------------
# compose


def test_compose_has_six_services_postgres_and_lmcache() -> None:
    services = compose()["services"]
    assert set(SERVICES) | {"postgres", "lmcache"} <= set(services)
    assert services["postgres"]["image"] == "postgres:16"
    lmcache = services["lmcache"]
    assert lmcache["build"]["target"] == "lmcache-server" and "lmcache-server" in dockerfile_stages()
    for name in SERVICES:
        svc = services[name]
        build = svc["build"]
        assert build["target"] == name
        context = (COMPOSE.parent / build["context"]).resolve()
        assert context == ROOT, f"{name}: build context is the repository root"
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE
        assert image_repo(interpolate(svc["image"])) == f"greenserve/{name}"


def test_compose_services_settings_and_health() -> None:
    services = compose()["services"]
    databases = set()
    for name, port in SERVICES.items():
        svc, env = services[name], compose_env(name)
        assert env["GREENSERVE_HOST"] == "0.0.0.0"
        assert str(env["GREENSERVE_PORT"]) == str(port)
        url = env["GREENSERVE_DB_URL"]
        match = re.fullmatch(r"postgresql\+psycopg://[^@]+@postgres:5432/(\w+)", url)
        assert match, f"{name}: GREENSERVE_DB_URL on the postgres service, got {url}"
        databases.add(match.group(1))
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
        test = " ".join(svc["healthcheck"]["test"])
        assert "greenserve-healthcheck" in test or "grpc_health" in test or "greenserve status" in test
        published = {p.rsplit(":", 1)[-1] for p in svc.get("ports", [])}
        assert str(port) in published
        for p in svc.get("ports", []):
            assert p.startswith("127.0.0.1:"), f"{name}: publish on loopback only ({p})"
    assert len(databases) == len(SERVICES), "each service has its own database"
    init_sql = (DEPLOY / "postgres" / "init-databases.sql").read_text()
    created = set(re.findall(r"CREATE DATABASE (\w+)", init_sql))
    assert databases <= created
    mounts = " ".join(services["postgres"]["volumes"])
    assert "./postgres/init-databases.sql:/docker-entrypoint-initdb.d/" in mounts
    assert str(ROUTER_HTTP_PORT) in {p.rsplit(":", 1)[-1] for p in services["router"]["ports"]}
    assert str(compose_env("router")["GREENSERVE_HTTP_PORT"]) == str(ROUTER_HTTP_PORT)


def test_compose_addresses_point_at_existing_services_and_ports() -> None:
    services = compose()["services"]
    for name in SERVICES:
        env = compose_env(name)
        addrs = {k: v for k, v in env.items() if re.fullmatch(r"GREENSERVE_\w+_ADDR", k)}
        assert set(addrs) == set(ADDR_VARS), f"{name} knows every service's address"
        for var, value in addrs.items():
            host, _, port = str(value).rpartition(":")
            assert host in services, f"{name}: {var}={value} names no compose service"
            assert host == ADDR_VARS[var], f"{name}: {var} points at {host}"
            assert str(compose_env(host)["GREENSERVE_PORT"]) == port, f"{name}: {var} port {port}"


def test_compose_gpu_override_only_touches_the_gpu_partitioner() -> None:
    (doc,) = load_yaml_docs(DEPLOY / "compose.gpu.yaml")
    assert set(doc["services"]) == {"gpu-partitioner"}
    svc = doc["services"]["gpu-partitioner"]
    assert svc["environment"]["NVIDIA_MIG_CONFIG_DEVICES"] == "all"
    assert "SYS_ADMIN" in svc["cap_add"]


# ----------------------------------------------------------------------------------------------
# Kubernetes: kustomizations


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


# ----------------------------------------------------------------------------------------------
# Kubernetes: base


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


# ----------------------------------------------------------------------------------------------
# Kubernetes: production overlay, from the files


def _production_patches() -> dict[str, Any]:
    kust = kustomization(PRODUCTION)
    out: dict[str, Any] = {}
    for patch in kust["patches"]:
        (doc,) = load_yaml_docs(PRODUCTION / patch["path"])
        out[patch["path"]] = (patch.get("target"), doc)
    return out


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
    patches = {d["metadata"]["name"]: d for t, d in _production_patches().values() if isinstance(d, dict)}
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


def test_rendered_dev_overlay_runs_the_simulated_partitioner_on_any_node() -> None:
    ds = _rendered_deployments(render(DEV))["greenserve-gpu-partitioner"]
    assert "nodeSelector" not in ds["spec"]["template"]["spec"], "dev clusters have no GPU nodes"


# ----------------------------------------------------------------------------------------------
# Kubernetes: rendered overlays (kustomize / kubectl kustomize)


def _rendered_deployments(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every service's workload (Deployment, or DaemonSet for the gpu-partitioner) by name."""
    deps = {o["metadata"]["name"]: o for o in objs if o["kind"] in ("Deployment", "DaemonSet")}
    assert {n: deps[f"greenserve-{n}"]["kind"] for n in SERVICES if f"greenserve-{n}" in deps} == WORKLOAD_KIND
    assert set(deps) == {f"greenserve-{n}" for n in SERVICES}
    return deps


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


# ----------------------------------------------------------------------------------------------
# the image's health check against a real service, with the production pod's environment


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pod_pki(directory: Path) -> dict[str, Path]:
    """A CA and one leaf for server and client auth with the SANs cert-manager gives (certificates.yaml)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def write(name: str, cert: Any, key: Any) -> tuple[Path, Path]:
        c, k = directory / f"{name}.crt", directory / f"{name}.key"
        c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
        return c, k

    now = dt.datetime.now(dt.timezone.utc)

    def ca(cn: str) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        return cert, key

    ca_cert, ca_key = ca("greenserve-ca")
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "greenserve-optimizer")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("greenserve-optimizer"), x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_path, _ = write("ca", ca_cert, ca_key)
    cert_path, key_path = write("tls", leaf, key)
    other_path, _ = write("other-ca", *ca("some other CA"))
    return {"ca.crt": ca_path, "tls.crt": cert_path, "tls.key": key_path, "other-ca.crt": other_path}


def _healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HEALTHCHECK)], env=env, capture_output=True, text=True, timeout=30)


def test_healthcheck_against_a_service_started_with_the_production_pod_environment(tmp_path: Path) -> None:
    """The optimizer started as its console script would be in a production pod: mTLS, token file;
    the exec probe's command reports SERVING, and refuses a server it cannot verify."""
    pki = _pod_pki(tmp_path)
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    remap = {"/etc/greenserve/tls/tls.crt": pki["tls.crt"], "/etc/greenserve/tls/tls.key": pki["tls.key"],
             "/etc/greenserve/tls/ca.crt": pki["ca.crt"], "/etc/greenserve/auth/token": token}
    (ops,) = [d for t, d in _production_patches().values() if isinstance(d, list)]
    pod_env = {op["value"]["name"]: str(remap[op["value"]["value"]]) for op in ops if op["path"].endswith("/env/-")}
    assert set(pod_env) >= {"GREENSERVE_TLS_CERT", "GREENSERVE_TLS_KEY", "GREENSERVE_TLS_CLIENT_CA",
                            "GREENSERVE_AUTH_TOKEN_FILE"}

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GREENSERVE_", "OTEL_"))}
    env.update(pod_env)
    env.update({"GREENSERVE_HOST": "127.0.0.1", "GREENSERVE_PORT": str(port),
                "GREENSERVE_DATA_DIR": str(tmp_path / "data"), "GREENSERVE_LOG_LEVEL": "warning"})
    proc = subprocess.Popen([sys.executable, "-m", "greenserve.optimizer"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        result = _healthcheck(env)
        while result.returncode != 0 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.3)
            result = _healthcheck(env)
        if result.returncode != 0:
            proc.kill()
            pytest.fail(f"no SERVING answer on 127.0.0.1:{port} with the pod's GREENSERVE_* environment: "
                        f"{result.stderr.strip()}\nservice output:\n{proc.communicate()[0]}")

        wrong_ca = {**env, "GREENSERVE_TLS_CA": str(pki["other-ca.crt"])}
        assert _healthcheck(wrong_ca).returncode == 1, "a server the CA does not vouch for is not healthy"
        plaintext = {k: v for k, v in env.items() if not k.startswith("GREENSERVE_TLS_")}
        assert _healthcheck(plaintext).returncode == 1, "plaintext against a TLS server fails"
        no_port = {k: v for k, v in env.items() if k != "GREENSERVE_PORT"}
        assert _healthcheck(no_port).returncode == 1

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=25) == 0, "graceful stop on SIGTERM within terminationGracePeriodSeconds"
        assert _healthcheck(env).returncode == 1, "nothing serving any more"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
