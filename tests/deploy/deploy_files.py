"""Reading deploy/ for its tests: the paths, the services and their ports, a Dockerfile parser (stages,
inherited instructions, ENV), the dockerignore's matching, the compose file, the Kubernetes kustomizations and
their rendering (with kustomize or kubectl, when one is on PATH), and small accessors of Kubernetes objects.

The tests cross-check these files against each other and against pyproject.toml: test_deploy_tree.py (every
file), test_dockerfile.py, test_compose.py, test_k8s_base.py (kustomizations and the base), test_k8s_production.py
(the production overlay, from its files), test_k8s_rendered.py (the rendered overlays) and test_pod_healthcheck.py
(the image's health check against a real service started with the production pod's environment, as the exec
probes run it).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
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


def production_patches() -> dict[str, Any]:
    kust = kustomization(PRODUCTION)
    out: dict[str, Any] = {}
    for patch in kust["patches"]:
        (doc,) = load_yaml_docs(PRODUCTION / patch["path"])
        out[patch["path"]] = (patch.get("target"), doc)
    return out
