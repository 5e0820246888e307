"""deploy/k8s rendered as a cluster would get it (`kubectl kustomize`, no cluster needed)
and validated against the Kubernetes API schemas (kubernetes-validate, strict: unknown
fields are errors), then checked for what the deployment promises: the front finds every
tritonserver pod through the headless Service, readiness comes from Triton's and the
front's health endpoints, Prometheus scrapes both, the front pods share one ReadWriteMany
voices volume, the GPU overlay asks for a GPU and the gpu profile, and the commands in the
manifests parse with our own launchers' options."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from frontend.__main__ import parse_args as front_args
from tritontts.families import FAMILIES
from tritontts.deploy.profiles import PROFILES

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"


def render(overlay: str) -> dict[tuple[str, str], dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to render deploy/k8s (scripts/setup.sh installs it)"
    out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)],
                         capture_output=True, text=True, check=True).stdout
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(out) if doc}


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def rendered(request):
    return request.param, render(request.param)


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) substitution in command arguments."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)


def container(docs, name: str) -> dict:
    return docs[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]


def test_every_rendered_object_is_valid_for_the_kubernetes_api(rendered):
    overlay, docs = rendered
    assert {kind for kind, _ in docs} == {"ConfigMap", "PersistentVolumeClaim", "Deployment",
                                          "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    for (kind, name), doc in docs.items():
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_front_finds_every_tritonserver_pod_through_the_headless_service(rendered):
    _, docs = rendered
    env = docs[("ConfigMap", "tritontts-config")]["data"]
    front = front_args([expand(a, env) for a in container(docs, "tritontts-front")["args"]])
    assert front.triton_url and len(front.triton_url) == 1
    host, port = front.triton_url[0].removeprefix("dns:").rsplit(":", 1)
    service = docs[("Service", host)]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == docs[("Deployment", "tritontts-triton")]["spec"]["selector"]["matchLabels"]
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["port"] == int(port) == 8001
    assert set(front.families.split(",")) <= set(FAMILIES)


def test_tritonserver_pods_serve_the_configured_families_with_the_profile(rendered):
    overlay, docs = rendered
    env = docs[("ConfigMap", "tritontts-config")]["data"]
    triton = container(docs, "tritontts-triton")
    assert triton["command"] == ["python", "-m", "tritontts.deploy.tritonserver"]
    args = dict(expand(a, env).lstrip("-").split("=", 1) for a in triton["args"])
    assert set(args["families"].split(",")) <= set(FAMILIES)
    assert args["profile"] == overlay and overlay in PROFILES
    assert (args["grpc-port"], args["http-port"], args["metrics-port"]) == ("8001", "8000", "8002")


def test_readiness_comes_from_triton_and_front_health_and_prometheus_scrapes_both(rendered):
    _, docs = rendered
    triton, front = container(docs, "tritontts-triton"), container(docs, "tritontts-front")
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert triton["startupProbe"]["failureThreshold"] * triton["startupProbe"]["periodSeconds"] >= 600
    assert front["readinessProbe"]["httpGet"]["path"] == "/health"
    ports = {"tritontts-triton": "8002", "tritontts-front": "8091"}
    for name, port in ports.items():
        notes = docs[("Deployment", name)]["spec"]["template"]["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/port"] == port
        declared = {p["containerPort"] for p in container(docs, name)["ports"]}
        assert int(port) in declared


def test_tritonserver_scales_horizontally_and_keeps_one_pod_through_disruptions(rendered):
    _, docs = rendered
    hpa = docs[("HorizontalPodAutoscaler", "tritontts-triton")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "tritontts-triton"}
    assert 1 < hpa["minReplicas"] < hpa["maxReplicas"]
    assert docs[("PodDisruptionBudget", "tritontts-triton")]["spec"]["minAvailable"] == 1


def test_the_gpu_overlay_asks_for_a_gpu_on_gpu_nodes_and_the_cpu_one_does_not():
    gpu, cpu = render("gpu"), render("cpu")
    spec = gpu[("Deployment", "tritontts-triton")]["spec"]["template"]["spec"]
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert gpu[("ConfigMap", "tritontts-config")]["data"]["TRITONTTS_PROFILE"] == "gpu"
    assert container(gpu, "tritontts-triton")["image"] == "tritontts:gpu"
    cpu_spec = cpu[("Deployment", "tritontts-triton")]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in str(cpu_spec) and "nodeSelector" not in cpu_spec
    assert container(cpu, "tritontts-triton")["image"] == "tritontts:cpu"


def test_every_front_pod_keeps_uploaded_voices_on_one_shared_read_write_many_volume(rendered):
    """The fronts are one voice store (frontend/voices.py): --voices-dir is on a writable
    mount of a ReadWriteMany claim of its own, and there is more than one front to share it.
    Fails if the flag is dropped (the image's default path is not on the volume), if the
    mount is read-only or another path, or if the claim is ReadWriteOnce or the models one."""
    _, docs = rendered
    env = docs[("ConfigMap", "tritontts-config")]["data"]
    deployment = docs[("Deployment", "tritontts-front")]
    front = container(docs, "tritontts-front")
    args = front_args([expand(a, env) for a in front["args"]])
    assert "--voices-dir=/voices" in front["args"] and args.voices_dir == Path("/voices")
    mounts = [m for m in front["volumeMounts"] if Path(m["mountPath"]) == args.voices_dir]
    assert len(mounts) == 1 and not mounts[0].get("readOnly", False)
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == mounts[0]["name"])
    claim_ref = volume["persistentVolumeClaim"]
    assert not claim_ref.get("readOnly", False)
    claim = docs[("PersistentVolumeClaim", claim_ref["claimName"])]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim_ref["claimName"] != "tritontts-models"
    assert deployment["spec"]["replicas"] > 1
