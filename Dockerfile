# edge-llm: an OpenAI-compatible server for 4-bit GPTQ/AWQ models on one CUDA GPU.
#
#   docker build -t edge-llm .                                    # the demo model, fetched at start
#   docker build -t edge-llm --build-arg MODEL_ID=org/model-AWQ .  # a hub model baked in
#   docker run --gpus all -p 8000:8000 -v edge-llm-cache:/cache edge-llm
#
# The entry point is `edge-llm`, the command `serve` (SageMaker's `docker run IMAGE serve`
# gives the same). Every flag has an EDGE_LLM_* variable; PORT is honoured.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

# PyTorch wheels built for the base image's CUDA (12.8)
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
# a hub model id to bake into /models/baked (empty: nothing baked)
ARG MODEL_ID=""
# SageMaker wants root; everywhere else the server runs as this unprivileged user
ARG RUN_AS=edge

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && useradd --create-home --uid 1000 --shell /usr/sbin/nologin edge

WORKDIR /opt/edge-llm
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
COPY pyproject.toml README.md ./
COPY edge_llm ./edge_llm
COPY quant ./quant
COPY kernels ./kernels
RUN pip install .

# Triton's kernel and autotune caches, TorchInductor's cache, the start-up memory probes and
# the demo model live here: keep it on a volume and the second cold start compiles and
# profiles nothing.
ENV EDGE_LLM_CACHE_DIR=/cache \
    HF_HOME=/cache/huggingface \
    EDGE_LLM_HOST=0.0.0.0 \
    PORT=8000 \
    EDGE_LLM_MODEL=${MODEL_ID:+/models/baked}
RUN mkdir -p /cache /models \
    && if [ -n "${MODEL_ID}" ]; then \
         python -c "import sys; from huggingface_hub import snapshot_download; snapshot_download(sys.argv[1], local_dir='/models/baked')" "${MODEL_ID}"; \
       fi \
    && chown -R edge:edge /cache /models
VOLUME ["/cache"]

USER ${RUN_AS}
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '8000'), timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["edge-llm"]
CMD ["serve"]
