"""The SageMaker recipe, offline: ``deploy.py`` run through the real SageMaker Python SDK v3
(``sagemaker.core.resources``) and boto3, every request validated by botocore against the
service's API model before a canned answer comes back (no AWS account, no network); the
README's runtime commands validated against the sagemaker-runtime model; the container's
environment resolved as ``edge-llm serve`` resolves it; ``/ping`` and ``/invocations``
(streaming included) against a live server."""

from __future__ import annotations

import datetime as dt
import json
import random

import httpx
import pytest

from tests.recipe_fixtures import (  # noqa: F401
    DEFAULT_MAX_REPLICAS,
    REPLICA_CONCURRENCY,
    SCALE_TARGET,
    image_env,
    load,
    readme_commands,
    resolved,
    served,
)

pytest.importorskip("sagemaker.core.resources", reason="the SageMaker SDK v3 is in the test extra")
botocore = pytest.importorskip("botocore")
ACCOUNT = "123456789012"


def minimal(shape, name: str, hint: str):
    """The smallest value of ``shape`` botocore would parse (required members only)."""
    kind = shape.type_name
    if kind == "structure":
        return {m: minimal(shape.members[m], m, hint) for m in shape.required_members}
    if kind == "list":
        return []
    if kind == "map":
        return {}
    if kind == "timestamp":
        return dt.datetime.now(dt.timezone.utc)
    if kind in ("integer", "long"):
        return 0
    if kind in ("float", "double"):
        return 0.0
    if kind == "boolean":
        return False
    if shape.enum:
        return "InService" if "InService" in shape.enum else shape.enum[0]
    if name.endswith(("Arn", "ARN")):
        return f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:resource/{hint}"
    return hint


@pytest.fixture
def aws(monkeypatch):
    """(boto3 session, calls): every API call validated by botocore and answered with the
    smallest valid response; ``calls`` lists (service, operation, params)."""
    import boto3

    for var in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(var, raising=False)
    session = boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret",
                            region_name="us-east-1")
    calls: list[tuple[str, str, dict]] = []

    def record(model, params, **_):  # the API's parameters, before botocore validates them
        calls.append((model.service_model.service_name, model.name, dict(params)))

    def answer(model, **_):  # after validation and serialization: instead of sending
        params = calls[-1][2]
        hint = next((v for k, v in sorted(params.items()) if k.endswith("Name")
                     and isinstance(v, str)), "edge-llm")
        response = minimal(model.output_shape, "", hint) if model.output_shape else {}
        response["ResponseMetadata"] = {"HTTPStatusCode": 200, "RequestId": "test"}
        return botocore.awsrequest.AWSResponse("https://aws.test", 200, {}, None), response

    session._session.register("before-parameter-build", record)
    session._session.register("before-call", answer)
    return session, calls


def deploy_args(deploy, **kw):
    argv = ["--image", f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/edge-llm:root",
            "--role", f"arn:aws:iam::{ACCOUNT}:role/SageMakerRole", "--region", "us-east-1",
            "--model-data", "s3://bucket/model.tar.gz"]
    for key, value in kw.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return deploy.parse_args(argv)


def test_deploy_requests_pass_botocore_validation_and_scale_to_zero(aws):
    import botocore.validate

    session, calls = aws
    deploy = load("sagemaker/deploy.py")
    deploy.deploy(deploy_args(deploy, idle_sleep_s=60), session)
    made = [(service, op) for service, op, _ in calls if not op.startswith("Describe")]
    assert made == [("sagemaker", "CreateModel"), ("sagemaker", "CreateEndpointConfig"),
                    ("sagemaker", "CreateEndpoint"), ("sagemaker", "CreateInferenceComponent"),
                    ("application-autoscaling", "RegisterScalableTarget"),
                    ("application-autoscaling", "PutScalingPolicy"),
                    ("application-autoscaling", "PutScalingPolicy"),
                    ("cloudwatch", "PutMetricAlarm")]
    body = {op: params for _, op, params in calls}
    model = body["CreateModel"]["PrimaryContainer"]
    assert model["Environment"] == deploy.container_env(60.0)
    (variant,) = body["CreateEndpointConfig"]["ProductionVariants"]
    assert variant["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 0,
                                                 "MaxInstanceCount": DEFAULT_MAX_REPLICAS}
    assert variant["InferenceAmiVersion"] == deploy.INFERENCE_AMI
    spec = body["CreateInferenceComponent"]["Specification"]
    assert spec["ComputeResourceRequirements"]["NumberOfAcceleratorDevicesRequired"] == 1
    startup = spec["StartupParameters"]["ContainerStartupHealthCheckTimeoutInSeconds"]
    assert startup == deploy.STARTUP_TIMEOUT_S
    target = body["RegisterScalableTarget"]
    assert target["MinCapacity"] == 0 and target["MaxCapacity"] == DEFAULT_MAX_REPLICAS > 1
    # the validator itself refuses what the platform refuses: MinInstanceCount has min 0
    bad = json.loads(json.dumps(body["CreateEndpointConfig"]))
    bad["ProductionVariants"][0]["ManagedInstanceScaling"]["MinInstanceCount"] = -1
    shape = session._session.get_service_model("sagemaker").operation_model(
        "CreateEndpointConfig").input_shape
    with pytest.raises(botocore.exceptions.ParamValidationError):
        botocore.validate.validate_parameters(bad, shape)


def test_copies_scale_zero_to_n_below_the_replica_concurrency(aws):
    """Target tracking adds a copy at SCALE_TARGET concurrent requests per copy, below the
    sequences one copy's server runs at once; --max-replicas bounds copies and instances."""
    session, calls = aws
    deploy = load("sagemaker/deploy.py")
    deploy.deploy(deploy_args(deploy, max_replicas=8), session)
    policies = [params for _, op, params in calls if op == "PutScalingPolicy"]
    (tracking,) = [p for p in policies if p["PolicyType"] == "TargetTrackingScaling"]
    config = tracking["TargetTrackingScalingPolicyConfiguration"]
    assert config["PredefinedMetricSpecification"]["PredefinedMetricType"] == \
        "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"
    body = {op: params for _, op, params in calls}
    args = resolved(image_env() | body["CreateModel"]["PrimaryContainer"]["Environment"])
    assert config["TargetValue"] == SCALE_TARGET < args.max_num_seqs == REPLICA_CONCURRENCY
    assert args.max_queue is not None and args.max_queue >= args.max_num_seqs
    (variant,) = body["CreateEndpointConfig"]["ProductionVariants"]
    assert variant["ManagedInstanceScaling"]["MaxInstanceCount"] == 8
    assert body["RegisterScalableTarget"]["MaxCapacity"] == 8
    with pytest.raises(SystemExit):
        deploy_args(deploy, max_replicas=0)


def test_container_env_keeps_sagemaker_port_and_mode():
    deploy = load("sagemaker/deploy.py")
    env = image_env() | deploy.container_env(idle_sleep_s=60)  # the image's ENV, then ours
    assert all(isinstance(v, str) for v in env.values())
    args = resolved(env)
    assert args.lifecycle.sagemaker and args.port == deploy.PORT == 8080
    assert args.host == "0.0.0.0" and args.lifecycle.idle_sleep_s == 60
    # SageMaker may move the port: nothing in the image or the recipe may override it
    assert resolved(env | {"SAGEMAKER_BIND_TO_PORT": "9001"}).port == 9001


def test_readme_runtime_commands_validate(aws):
    """Each ``aws sagemaker-runtime`` command of the README is a valid request of that
    operation (its flags mapped to the API's members), and the streaming one streams."""
    session, _ = aws
    runtime = session._session.get_service_model("sagemaker-runtime")
    import botocore.validate

    commands = [c for c in readme_commands("sagemaker", "aws") if c[1] == "sagemaker-runtime"]
    ops = set()
    for argv in commands:
        op = "".join(w.capitalize() for w in argv[2].split("-"))
        shape = runtime.operation_model(op).input_shape
        params, rest = {}, argv[3:]
        while rest:
            flag = rest.pop(0)
            if not flag.startswith("--"):
                continue  # the output file
            member = "".join(w.capitalize() for w in flag[2:].split("-"))
            if member == "CliBinaryFormat":
                rest.pop(0)
                continue
            params[member] = rest.pop(0)
        params["Body"] = params["Body"].encode()
        botocore.validate.validate_parameters(params, shape)
        ops.add(op)
        if op == "InvokeEndpointWithResponseStream":
            assert json.loads(params["Body"])["stream"] is True
    assert ops == {"InvokeEndpoint", "InvokeEndpointWithResponseStream"}


def test_ping_and_invocations_whole_and_streamed(served, fake_tokenizer):  # noqa: F811
    url, _, scripts = served
    assert httpx.get(url + "/ping").status_code == 200
    n = random.randint(2, 5)
    r = httpx.post(url + "/invocations", json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": n})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == fake_tokenizer.decode(scripts[0][:n])
    r = httpx.post(url + "/invocations", content=json.dumps({"prompt": "Hi", "max_tokens": n}))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == n
    # InvokeEndpointWithResponseStream relays the container's chunked body part by part
    with httpx.stream("POST", url + "/invocations", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": n,
            "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers.get("transfer-encoding") == "chunked"
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= n + 1
