"""The Cloud Run and KServe manifests against their published schemas and documented limits.

Schemas: the Kubernetes API models of the ``kubernetes`` client (``V1Container``,
``V1Volume``, ``V1Probe``, ``V1PersistentVolumeClaim``: the OpenAPI spec Kubernetes publishes,
generated into Python) and KServe's own models from the ``kserve`` package
(``V1beta1InferenceService`` down to ``V1beta1PredictorSpec``), walked field by field: an
unknown field, a misplaced one or a wrong type fails. Knative Service (Cloud Run) has no model
package; its revision spec is a pod spec subset plus two fields, checked against the subset
Cloud Run's Admin API lists. Limits no schema carries are encoded below with their sources.
The probes' paths and ports are exercised against a live server (the fake engine's)."""

from __future__ import annotations

import importlib.util
import sys
import types

import httpx
import pytest
import yaml

from tests.recipe_fixtures import (  # noqa: F401
    DEFAULT_MAX_REPLICAS,
    RECIPES,
    REPLICA_CONCURRENCY,
    SCALE_TARGET,
    image_env,
    resolved,
    served,
)

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client is in the test extra")

# https://cloud.google.com/run/docs/configuring/healthchecks (startup probes) and the Admin API
# v1 Probe reference: initialDelaySeconds and periodSeconds at most 240 for a startup probe,
# failureThreshold x periodSeconds at most 240 s; timeoutSeconds <= periodSeconds.
CLOUD_RUN_STARTUP_MAX_S = 240
# https://cloud.google.com/run/docs/reference/rest/v1/RevisionSpec: the fields Cloud Run takes
CLOUD_RUN_REVISION_FIELDS = {"containerConcurrency", "timeoutSeconds", "serviceAccountName",
                             "containers", "volumes", "imagePullSecrets", "nodeSelector",
                             "enableServiceLinks", "runtimeClassName"}
# https://cloud.google.com/run/docs/configuring/services/gpu: a GPU needs >= 4 CPU, >= 16 GiB,
# CPU always allocated; request timeout at most 3600 s (request-timeout docs)
CLOUD_RUN_GPU_MIN_CPU, CLOUD_RUN_GPU_MIN_MEMORY_GI, CLOUD_RUN_MAX_TIMEOUT_S = 4, 16, 3600
# https://knative.dev/docs/serving/configuration/deployment/#configuring-progress-deadlines:
# a revision that is not ready within the progress deadline (default 600 s) fails; with
# KServe the storage initializer's model download runs inside it, before the server starts
KNATIVE_DEFAULT_PROGRESS_DEADLINE_S = 600
# the model download the deadline must leave room for beyond the readiness window (a 7B 4-bit
# checkpoint is ~4 GiB: 10 minutes at ~7 MB/s)
KSERVE_DOWNLOAD_BUDGET_S = 600
IMAGE_UID = 1000  # the Dockerfile's `useradd --uid 1000 ... edge`


def kserve_models():
    """KServe's model classes without the package's server (``kserve/__init__`` imports
    FastAPI, gRPC, ...): the ``kserve`` package is imported as a bare namespace."""
    spec = importlib.util.find_spec("kserve")
    if spec is None:
        pytest.skip("the kserve package is not installed (pip install --no-deps kserve)")
    saved = sys.modules.get("kserve")
    package = types.ModuleType("kserve")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["kserve"] = package
    try:
        import kserve.models as models
    finally:
        if saved is not None:
            sys.modules["kserve"] = saved
    return models


def model_class(name: str, extra=None):
    for source in (kubernetes.client.models, extra):
        if source is not None and hasattr(source, name):
            return getattr(source, name)
    raise AssertionError(f"no model class {name}")


def check(value, type_name: str, path: str, extra=None) -> None:
    """``value`` (parsed YAML) against an OpenAPI-generated type; AssertionError naming the
    path of the first field the schema does not have or does not type so."""
    if type_name.lower().startswith("list["):
        assert isinstance(value, list), f"{path}: a list expected"
        for i, item in enumerate(value):
            check(item, type_name[5:-1], f"{path}[{i}]", extra)
    elif type_name.lower().startswith(("dict(", "dict[")):
        assert isinstance(value, dict), f"{path}: a map expected"
        inner = type_name[5:-1].split(",", 1)[1].strip()
        for key, item in value.items():
            check(item, inner, f"{path}.{key}", extra)
    elif type_name in ("str", "int", "bool", "float"):
        python = {"str": str, "int": int, "bool": bool, "float": (int, float)}[type_name]
        assert isinstance(value, python) and not (type_name == "int" and value is True), \
            f"{path}: {type_name} expected, got {value!r}"
    elif type_name == "object":
        pass  # int-or-string and free-form fields (ports, quantities)
    else:
        cls = model_class(type_name, extra)
        assert isinstance(value, dict), f"{path}: a {type_name} object expected"
        fields = {v: k for k, v in cls.attribute_map.items()}
        for key, item in value.items():
            assert key in fields, f"{path}.{key}: not a field of {type_name}"
            check(item, cls.openapi_types[fields[key]], f"{path}.{key}", extra)


def documents(name: str) -> list[dict]:
    return list(yaml.safe_load_all((RECIPES / name).read_text()))


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def cache_volume(spec: dict, container: dict) -> dict:
    """The volume holding the container's EDGE_LLM_CACHE_DIR (the image's unless set)."""
    cache = (image_env() | env_of(container))["EDGE_LLM_CACHE_DIR"]
    mounts = [m for m in container.get("volumeMounts", [])
              if cache == m["mountPath"] or cache.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"the compile caches ({cache}) are on no volume: every cold start compiles"
    (volume,) = [v for v in spec.get("volumes", []) if v["name"] == mounts[0]["name"]]
    return volume


def probe_window(probe: dict) -> int:
    """Seconds a probe lets a container fail before giving up (Kubernetes' defaults)."""
    return probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get(
        "failureThreshold", 3)


def _probes(container: dict) -> dict[str, tuple[str, int]]:
    return {name: (p["httpGet"]["path"], p["httpGet"]["port"])
            for name, p in container.items() if name.endswith("Probe")}


def _check_probes(url: str, probes: dict[str, tuple[str, int]], port: int) -> None:
    """Every probe targets the serving port; readiness-like probes 503 while the engine
    sleeps, liveness stays 200 (or an idle replica would be restarted)."""
    assert probes and {p for _, p in probes.values()} == {port}
    for name, (path, _) in probes.items():
        assert httpx.get(url + path).status_code == 200, name
    assert httpx.post(url + "/sleep").status_code == 200
    try:
        for name, (path, _) in probes.items():
            expected = 200 if name == "livenessProbe" else 503
            assert httpx.get(url + path).status_code == expected, name
    finally:
        assert httpx.post(url + "/wake_up").status_code == 200


# ---- Cloud Run ------------------------------------------------------------------------------


def cloud_run_service() -> dict:
    (service,) = documents("cloud-run/service.yaml")
    return service


def test_cloud_run_service_matches_the_schema():
    service = cloud_run_service()
    assert (service["apiVersion"], service["kind"]) == ("serving.knative.dev/v1", "Service")
    check(service["metadata"], "V1ObjectMeta", "metadata")
    assert set(service["spec"]) == {"template"}
    template = service["spec"]["template"]
    check(template["metadata"], "V1ObjectMeta", "spec.template.metadata")
    spec = template["spec"]
    unknown = set(spec) - CLOUD_RUN_REVISION_FIELDS
    assert not unknown, f"not Cloud Run revision fields: {unknown}"
    check(spec["containers"], "list[V1Container]", "spec.template.spec.containers")
    check(spec.get("volumes", []), "list[V1Volume]", "spec.template.spec.volumes")


def test_cloud_run_documented_limits():
    template = cloud_run_service()["spec"]["template"]
    spec, (container,) = template["spec"], template["spec"]["containers"]
    startup = container["startupProbe"]
    period = startup.get("periodSeconds", 10)
    assert startup.get("initialDelaySeconds", 0) <= CLOUD_RUN_STARTUP_MAX_S
    assert period <= CLOUD_RUN_STARTUP_MAX_S
    assert period * startup.get("failureThreshold", 3) <= CLOUD_RUN_STARTUP_MAX_S
    assert startup.get("timeoutSeconds", 1) <= period
    assert spec["timeoutSeconds"] <= CLOUD_RUN_MAX_TIMEOUT_S
    limits = container["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert int(limits["cpu"]) >= CLOUD_RUN_GPU_MIN_CPU
    assert int(limits["memory"].removesuffix("Gi")) >= CLOUD_RUN_GPU_MIN_MEMORY_GI
    annotations = template["metadata"]["annotations"]
    assert annotations["run.googleapis.com/cpu-throttling"] == "false"
    assert annotations["autoscaling.knative.dev/minScale"] == "0"


def test_cloud_run_scales_zero_to_n_at_the_replica_concurrency():
    """Cloud Run sends an instance at most containerConcurrency requests: the server's
    --max-num-seqs, so none waits in a replica while another instance could take it."""
    template = cloud_run_service()["spec"]["template"]
    (container,) = template["spec"]["containers"]
    args = resolved(image_env() | env_of(container))
    assert template["spec"]["containerConcurrency"] == args.max_num_seqs == REPLICA_CONCURRENCY
    assert args.max_queue is not None and args.max_queue >= args.max_num_seqs
    annotations = template["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/minScale"] == "0"
    assert int(annotations["autoscaling.knative.dev/maxScale"]) == DEFAULT_MAX_REPLICAS > 1


def test_cloud_run_keeps_the_caches_on_a_bucket_volume():
    """Cloud Run's own filesystem is in memory and gone when an instance stops; a Cloud
    Storage volume (gen2 execution environment) keeps the kernels across cold starts."""
    template = cloud_run_service()["spec"]["template"]
    (container,) = template["spec"]["containers"]
    volume = cache_volume(template["spec"], container)
    assert volume["csi"]["driver"] == "gcsfuse.run.googleapis.com"
    assert volume["csi"].get("readOnly") is False
    options = volume["csi"]["volumeAttributes"].get("mountOptions", "").split(",")
    assert f"uid={IMAGE_UID}" in options  # the image's user may write it
    assert template["metadata"]["annotations"]["run.googleapis.com/execution-environment"] \
        == "gen2"


def test_cloud_run_probes_and_port(served):  # noqa: F811
    url = served[0]
    (container,) = cloud_run_service()["spec"]["template"]["spec"]["containers"]
    port = container["ports"][0]["containerPort"]
    env = image_env() | env_of(container)
    args = resolved({**env, "PORT": str(port)})  # Cloud Run sets PORT to containerPort
    assert args.port == port and args.lifecycle.idle_sleep_s == float(env["EDGE_LLM_IDLE_SLEEP_S"])
    _check_probes(url, _probes(container), port)


# ---- KServe ---------------------------------------------------------------------------------


def kserve_documents() -> tuple[dict, dict]:
    pvc, isvc = documents("kserve/inferenceservice.yaml")
    return pvc, isvc


def test_kserve_manifests_match_the_schemas():
    models = kserve_models()
    pvc, isvc = kserve_documents()
    assert (pvc["apiVersion"], pvc["kind"]) == ("v1", "PersistentVolumeClaim")
    check(pvc, "V1PersistentVolumeClaim", "pvc")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    check(isvc, "V1beta1InferenceService", "isvc", models)


def test_kserve_scales_zero_to_n_on_concurrency_below_the_replica_limit():
    """Knative's hard limit per pod (containerConcurrency) is the server's --max-num-seqs; the
    autoscaler's target is below it, so a new pod starts before the others are full."""
    _, isvc = kserve_documents()
    predictor = isvc["spec"]["predictor"]
    (container,) = predictor["containers"]
    args = resolved(image_env() | env_of(container))
    assert predictor["containerConcurrency"] == args.max_num_seqs == REPLICA_CONCURRENCY
    assert args.max_queue is not None and args.max_queue >= args.max_num_seqs
    assert predictor["scaleMetric"] == "concurrency"
    assert predictor["scaleTarget"] == SCALE_TARGET < predictor["containerConcurrency"]
    assert predictor["minReplicas"] == 0
    assert predictor["maxReplicas"] == DEFAULT_MAX_REPLICAS > 1


def test_kserve_progress_deadline_covers_download_and_readiness():
    _, isvc = kserve_documents()
    annotations = isvc["metadata"]["annotations"]
    deadline = int(annotations.get("serving.knative.dev/progress-deadline",
                                   f"{KNATIVE_DEFAULT_PROGRESS_DEADLINE_S}s").removesuffix("s"))
    (container,) = isvc["spec"]["predictor"]["containers"]
    readiness = probe_window(container["readinessProbe"])
    assert readiness + KSERVE_DOWNLOAD_BUDGET_S <= deadline, (readiness, deadline)
    assert container["livenessProbe"]["httpGet"]["path"] == "/ping"  # 204/200 while loading


def test_kserve_scales_to_zero_and_keeps_the_caches_on_a_pvc(served):  # noqa: F811
    url = served[0]
    pvc, isvc = kserve_documents()
    predictor = isvc["spec"]["predictor"]
    assert predictor["minReplicas"] == 0
    (container,) = predictor["containers"]
    volume = cache_volume(predictor, container)
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert predictor["securityContext"]["fsGroup"] == IMAGE_UID  # the user may write it
    port = container["ports"][0]["containerPort"]
    env = image_env() | env_of(container)
    assert resolved(env).port == port and env["EDGE_LLM_MODEL"] == "/mnt/models"
    _check_probes(url, _probes(container), port)
