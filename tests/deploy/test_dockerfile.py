"""The Dockerfile (deploy/docker/): a target per service running its console script, slim non-root
runtime images built from a wheel, the LMCache server target, the build context and the health check script."""

from __future__ import annotations

from tests.deploy.deploy_files import (
    DOCKERFILE,
    HEALTHCHECK,
    ROOT,
    ROUTER_HTTP_PORT,
    SERVICES,
    console_scripts,
    dockerfile_stages,
    dockerignore_excludes,
    exec_form,
    stage_chain,
    stage_env,
    stage_value,
)


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
