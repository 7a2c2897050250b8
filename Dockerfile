# syntax=docker/dockerfile:1
# The rubick image: the control-plane services (`rubick service ...`), the node agent (`rubick agent`) and the
# bootstrap step (`rubick auth bootstrap`), as charts/rubick runs them, and the example trainer with DeepSpeed for
# jobs without a workload of their own (docs/workloads.md; a job's own image runs its own code). CPU build of
# torch: GPU nodes that run the example trainer need an image built FROM a CUDA torch instead.
#
#   docker build -t rubick-controlplane:0.1.0 .

ARG PYTHON_VERSION=3.11
ARG TORCH_VERSION=2.13.0

FROM python:${PYTHON_VERSION}-slim AS builder
ARG TORCH_VERSION
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/rubick/venv/bin:$PATH
RUN python -m venv /opt/rubick/venv
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"
# The packages read their reference data from the source tree (data/ beside them), so the tree is kept at
# /opt/rubick/src and installed in editable mode; the final stage copies both to the same paths.
WORKDIR /opt/rubick/src
COPY pyproject.toml README.md LICENSE ./
COPY controlplane ./controlplane
COPY agents ./agents
COPY modeler ./modeler
COPY policy ./policy
COPY replay ./replay
COPY data ./data
# model specs (examples/models), the example trainer and jobs the agent and `rubick demo` use
COPY examples ./examples
RUN pip install -e ".[train]" \
 && python -m compileall -q /opt/rubick/src \
 && rubick --help >/dev/null

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="rubick-controlplane" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 rubick \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin rubick
COPY --from=builder /opt/rubick /opt/rubick
# HOME and the caches on /tmp: the chart mounts an emptyDir there and keeps the root filesystem read-only
ENV PATH=/opt/rubick/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/cache \
    MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
WORKDIR /tmp
CMD ["rubick", "--help"]
