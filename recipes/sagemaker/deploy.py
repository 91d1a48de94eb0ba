"""Deploy edge-llm to a SageMaker real-time endpoint that scales to zero (SageMaker Python SDK v3).

    python recipes/sagemaker/deploy.py --image ACCOUNT.dkr.ecr.REGION.amazonaws.com/edge-llm:root \
        --role arn:aws:iam::ACCOUNT:role/SageMakerRole --region us-east-1 \
        [--model-data s3://bucket/model.tar.gz] [--max-replicas 4]

What it creates, in order (``sagemaker.core.resources``, the SDK v3 resource API; boto3 for
Application Auto Scaling and CloudWatch, which the SDK does not wrap, and for the endpoint
config, whose zero minimum the SDK's serializer drops):

    Model               the image, its environment, the model data unpacked at /opt/ml/model
    EndpointConfig      one variant with managed instance scaling from 0 to N instances, least
                        outstanding requests routing, and an inference AMI whose driver runs
                        the image's CUDA 12.8 (see the Dockerfile)
    Endpoint            waited for until InService
    InferenceComponent  one copy of the model on one GPU; the start-up health check window
    scaling             copies 0..N: target tracking on concurrent requests per copy (target
                        SCALE_TARGET, below the MAX_NUM_SEQS a copy runs at once) scales out
                        and in to zero; a step policy on the NoCapacityInvocationFailures
                        alarm scales out from zero when a request arrives

SageMaker starts the container as ``docker run IMAGE serve`` (our ``edge-llm serve``); it
health-checks ``GET /ping`` and sends requests to ``POST /invocations`` on port 8080
(``SAGEMAKER_BIND_TO_PORT`` when set; nothing here sets ``PORT`` or ``EDGE_LLM_PORT``, which
would override it). Long generations: ``InvokeEndpointWithResponseStream`` with
``"stream": true`` in the body streams the OpenAI chunks as they are made, where
``InvokeEndpoint`` cuts a whole answer at 60 s.
"""

from __future__ import annotations

import argparse
from typing import Any

MODEL_DIR = "/opt/ml/model"
PORT = 8080  # SageMaker's; the server picks it (or SAGEMAKER_BIND_TO_PORT) in SageMaker mode
# NVIDIA driver 550 / CUDA 12.4 (SageMaker's ProductionVariant.InferenceAmiVersion docs):
# newer than the image's 525 minimum; the default AMI of older instance types may be older
INFERENCE_AMI = "al2-ami-sagemaker-inference-gpu-3-1"
STARTUP_TIMEOUT_S = 1800  # download + load + kernel compile + warm-up on a cold instance
SCALE_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
# docs/scaling.md's sizing from BENCHMARKS.md's serving table: one copy (one GPU) runs C = 32
# requests at once; target tracking adds a copy at T = 24 concurrent requests per copy, so the
# new one is up (a cold start) before the others are full
MAX_NUM_SEQS = 32
SCALE_TARGET = 24


def container_env(idle_sleep_s: float | None = None) -> dict[str, str]:
    """The container's environment (every value a string, as SageMaker wants). The compile
    caches come with the image (``recipes/warm-cache``: EDGE_LLM_CACHE_DIR is set there)."""
    env = {"EDGE_LLM_SAGEMAKER": "true", "EDGE_LLM_MODEL": MODEL_DIR,
           "EDGE_LLM_DRAIN_TIMEOUT": "25",  # SageMaker sends SIGKILL 30 s after SIGTERM
           "EDGE_LLM_MAX_NUM_SEQS": str(MAX_NUM_SEQS),
           "EDGE_LLM_MAX_QUEUE": str(2 * MAX_NUM_SEQS)}  # past it: 429 at once, not a queue
    if idle_sleep_s:
        env["EDGE_LLM_IDLE_SLEEP_S"] = str(idle_sleep_s)
    return env


def deploy(args: argparse.Namespace, session: Any) -> dict[str, str]:
    """Create the resources listed in the module docstring with a boto3 ``session``; returns
    their names. Each call is validated by botocore against the service's API model."""
    from sagemaker.core import shapes
    from sagemaker.core.resources import Endpoint, InferenceComponent, Model

    name, region = args.name, args.region
    container = shapes.ContainerDefinition(image=args.image, environment=container_env(
        args.idle_sleep_s), **({"model_data_url": args.model_data} if args.model_data else {}))
    Model.create(model_name=name, primary_container=container, execution_role_arn=args.role,
                 session=session, region=region)
    # boto3 here: the SDK's serializer drops zero values, MinInstanceCount=0 among them (the
    # endpoint would never scale to zero); tests/test_recipe_sagemaker.py checks the request
    session.client("sagemaker", region_name=region).create_endpoint_config(
        EndpointConfigName=name, ExecutionRoleArn=args.role, ProductionVariants=[{
            "VariantName": "main", "InstanceType": args.instance_type,
            "InitialInstanceCount": 1, "InferenceAmiVersion": INFERENCE_AMI,
            "ManagedInstanceScaling": {"Status": "ENABLED", "MinInstanceCount": 0,
                                       "MaxInstanceCount": args.max_replicas},  # a copy each
            "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}}])
    endpoint = Endpoint.create(endpoint_name=name, endpoint_config_name=name, session=session,
                               region=region)
    endpoint.wait_for_status("InService")
    spec = shapes.InferenceComponentSpecification(
        model_name=name,
        startup_parameters=shapes.InferenceComponentStartupParameters(
            model_data_download_timeout_in_seconds=STARTUP_TIMEOUT_S,
            container_startup_health_check_timeout_in_seconds=STARTUP_TIMEOUT_S),
        compute_resource_requirements=shapes.InferenceComponentComputeResourceRequirements(
            number_of_accelerator_devices_required=1, min_memory_required_in_mb=8192))
    InferenceComponent.create(
        inference_component_name=name, endpoint_name=name, variant_name="main",
        specification=spec,
        runtime_config=shapes.InferenceComponentRuntimeConfig(copy_count=1),
        session=session, region=region)
    autoscale(session, region, name, args.max_replicas)
    return {"endpoint": name, "inference_component": name}


def autoscale(session: Any, region: str, component: str, max_copies: int) -> None:
    """Copies 0..``max_copies``: target tracking on concurrent requests per copy adds copies
    under load and scales in to zero when idle; a step policy fired by the
    NoCapacityInvocationFailures alarm adds the first copy when a request finds none."""
    scaling = session.client("application-autoscaling", region_name=region)
    resource_id = f"inference-component/{component}"
    scaling.register_scalable_target(ServiceNamespace="sagemaker", ResourceId=resource_id,
                                     ScalableDimension=SCALE_DIMENSION, MinCapacity=0,
                                     MaxCapacity=max_copies)
    scaling.put_scaling_policy(
        PolicyName=f"{component}-concurrency", ServiceNamespace="sagemaker",
        ResourceId=resource_id, ScalableDimension=SCALE_DIMENSION,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": float(SCALE_TARGET), "ScaleInCooldown": 900, "ScaleOutCooldown": 60,
            "PredefinedMetricSpecification": {"PredefinedMetricType":
                "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"}})
    step = scaling.put_scaling_policy(
        PolicyName=f"{component}-from-zero", ServiceNamespace="sagemaker",
        ResourceId=resource_id, ScalableDimension=SCALE_DIMENSION, PolicyType="StepScaling",
        StepScalingPolicyConfiguration={
            "AdjustmentType": "ChangeInCapacity", "MetricAggregationType": "Maximum",
            "Cooldown": 60,
            "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]})
    session.client("cloudwatch", region_name=region).put_metric_alarm(
        AlarmName=f"{component}-no-capacity", Namespace="AWS/SageMaker",
        MetricName="NoCapacityInvocationFailures",
        Dimensions=[{"Name": "InferenceComponentName", "Value": component}],
        Statistic="Maximum", Period=30, EvaluationPeriods=1, Threshold=1,
        ComparisonOperator="GreaterThanOrEqualToThreshold", TreatMissingData="missing",
        AlarmActions=[step["PolicyARN"]])


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", required=True, help="ECR image built with RUN_AS=root")
    parser.add_argument("--role", required=True, help="SageMaker execution role ARN")
    parser.add_argument("--region", required=True)
    parser.add_argument("--model-data", default=None, help="s3://.../model.tar.gz (optional)")
    parser.add_argument("--instance-type", default="ml.g5.xlarge")
    parser.add_argument("--name", default="edge-llm")
    parser.add_argument("--idle-sleep-s", type=float, default=None)
    parser.add_argument("--max-replicas", type=_positive, default=4,
                        help="most copies (one GPU instance each) to scale out to (default: 4)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import boto3

    args = parse_args(argv)
    names = deploy(args, boto3.Session(region_name=args.region))
    print(f"endpoint {names['endpoint']}, inference component {names['inference_component']}:"
          " POST /invocations with an OpenAI chat or completions body")


if __name__ == "__main__":
    main()
