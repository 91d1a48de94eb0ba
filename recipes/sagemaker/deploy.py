"""Deploy the edge-llm image to a SageMaker real-time endpoint (sagemaker Python SDK).

    python recipes/sagemaker/deploy.py --image ACCOUNT.dkr.ecr.REGION.amazonaws.com/edge-llm:root \
        --role arn:aws:iam::ACCOUNT:role/SageMakerRole --model-data s3://bucket/model.tar.gz

SageMaker starts the container as ``docker run IMAGE serve`` (our ``edge-llm serve``), with the
model unpacked at /opt/ml/model; it health-checks ``GET /ping`` and sends requests to
``POST /invocations`` on port 8080 (``SAGEMAKER_BIND_TO_PORT`` when set), which
``EDGE_LLM_SAGEMAKER`` turns on.
"""

from __future__ import annotations

import argparse

MODEL_DIR = "/opt/ml/model"
PORT = 8080


def container_env(idle_sleep_s: float | None = None) -> dict[str, str]:
    """The container's environment (every value a string, as SageMaker wants)."""
    env = {"EDGE_LLM_SAGEMAKER": "true", "EDGE_LLM_MODEL": MODEL_DIR,
           "EDGE_LLM_HOST": "0.0.0.0", "EDGE_LLM_PORT": str(PORT),
           "EDGE_LLM_DRAIN_TIMEOUT": "25"}  # SageMaker sends SIGKILL 30 s after SIGTERM
    if idle_sleep_s:
        env["EDGE_LLM_IDLE_SLEEP_S"] = str(idle_sleep_s)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", required=True, help="ECR image built with RUN_AS=root")
    parser.add_argument("--role", required=True, help="SageMaker execution role ARN")
    parser.add_argument("--model-data", default=None, help="s3://.../model.tar.gz (optional)")
    parser.add_argument("--instance-type", default="ml.g5.xlarge")
    parser.add_argument("--name", default="edge-llm")
    args = parser.parse_args()

    from sagemaker.model import Model  # the SDK is needed here only

    model = Model(image_uri=args.image, role=args.role, model_data=args.model_data,
                  env=container_env(), name=args.name)
    model.deploy(initial_instance_count=1, instance_type=args.instance_type,
                 endpoint_name=args.name, container_startup_health_check_timeout=1800)
    print(f"endpoint {args.name}: POST /invocations with an OpenAI chat or completions body")


if __name__ == "__main__":
    main()
