# edge-llm: an OpenAI-compatible server for 4-bit GPTQ/AWQ models on one CUDA GPU.
#
#   docker build -t edge-llm .                                    # the demo model, made at start
#   docker build -t edge-llm --build-arg MODEL_ID=org/model-AWQ .  # a hub model baked in
#   docker run --gpus all -p 8000:8000 -v edge-llm-cache:/cache edge-llm
#
# The entry point is `edge-llm`, the command `serve` (SageMaker's `docker run IMAGE serve`
# gives the same). Every flag has an EDGE_LLM_* variable; PORT is honoured when the platform
# sets it (the image does not: it would override SAGEMAKER_BIND_TO_PORT).
#
# CUDA and the driver: torch's PyPI wheels bring their own CUDA libraries, so the base needs
# none of them (`-base`, not `-runtime`: that would ship cuBLAS/cuDNN twice). torch 2.10.0 is
# the newest PyPI release built for CUDA 12 (12.8); 2.11 and later are built for CUDA 13, which
# needs driver >= 580, and the cu128 index has no 2.12+. CUDA 12's minor version compatibility
# runs 12.8 on any driver >= 525.60.13: Cloud Run's L4 (535), SageMaker's inference AMIs
# (535/550), RunPod, Modal, HF Endpoints and GKE/KServe nodes all qualify.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04
FROM ${BASE_IMAGE}

ARG TORCH_VERSION=2.10.0
# a hub model id to bake into /models/baked (empty: nothing baked)
ARG MODEL_ID=""
# SageMaker wants root; everywhere else the server runs as this unprivileged user
ARG RUN_AS=edge
# pip's settings for builds behind a proxy or off PyPI (a wheel directory, a local index, a CA
# bundle, a constraints file); unset: PyPI with the base's certificates
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_CERT
ARG PIP_CONSTRAINT

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_DISABLE_REQUIRE=1

# Python, and gcc + headers for the launcher stubs Triton compiles at run time. uid 1000 is
# the `ubuntu` user on Ubuntu 24.04 bases: it makes way for `edge`.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
       ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && if id -nu 1000 >/dev/null 2>&1; then userdel --remove "$(id -nu 1000)"; fi \
    && useradd --create-home --uid 1000 --shell /usr/sbin/nologin edge

WORKDIR /opt/edge-llm
# Dependencies before sources, and the model before both: a code change rebuilds only the last
# two layers, never downloads torch or the model again.
RUN pip install "torch==${TORCH_VERSION}"
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "torch==${TORCH_VERSION}" \
    && rm /tmp/requirements.txt

# Triton's kernel and autotune caches, TorchInductor's cache, the start-up memory probes and
# the demo model live here: keep it on a volume and the second cold start compiles and
# profiles nothing.
ENV EDGE_LLM_CACHE_DIR=/cache \
    HF_HOME=/cache/huggingface \
    EDGE_LLM_HOST=0.0.0.0 \
    EDGE_LLM_MODEL=${MODEL_ID:+/models/baked}
RUN mkdir -p /cache /models \
    && if [ -n "${MODEL_ID}" ]; then \
         python -c "import sys; from huggingface_hub import snapshot_download; snapshot_download(sys.argv[1], local_dir='/models/baked')" "${MODEL_ID}"; \
       fi \
    && chown -R edge:edge /cache /models

COPY README.md ./
COPY edge_llm ./edge_llm
COPY quant ./quant
COPY kernels ./kernels
RUN pip install --no-deps . && edge-llm --help >/dev/null
VOLUME ["/cache"]

USER ${RUN_AS}
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/health' % (os.environ.get('EDGE_LLM_PORT') or os.environ.get('PORT') or '8000'), timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["edge-llm"]
CMD ["serve"]
