"""The compose files (deploy/compose.yaml, compose.gpu.yaml): the services, their settings, databases, health
checks and the addresses they give each other."""

from __future__ import annotations

import re

from tests.deploy.deploy_files import (
    ADDR_VARS,
    COMPOSE,
    DEPLOY,
    DOCKERFILE,
    ROOT,
    ROUTER_HTTP_PORT,
    SERVICES,
    compose,
    compose_env,
    dockerfile_stages,
    image_repo,
    interpolate,
    load_yaml_docs,
)


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
