# syntax=docker/dockerfile:1
# The kernelsearch image: API, worker and CLI. A CUDA base gives the driver-facing libraries;
# torch's wheel carries its own CUDA runtime, and Triton compiles its launcher with gcc at run
# time, so gcc and the Python headers stay in the image.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04
FROM ${CUDA_IMAGE}

# Torch and Triton must agree: the kernels are written and tested against Triton 3.6.
ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG TRITON_VERSION=3.6.0

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

# The heavy layer first, so that a code change rebuilds only the small layers below it.
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" \
      "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY kernels ./kernels
COPY search_space ./search_space
COPY db ./db
COPY service ./service
RUN pip install . \
 && python -c "import db, search_space, service, kernels; print('kernelsearch installed')"
COPY deploy ./deploy

# Run unprivileged; Triton's compile cache and the default SQLite file live under the home/app.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin ks \
 && mkdir -p /app/var \
 && chown ks:ks /app/var
USER ks
ENV TRITON_CACHE_DIR=/home/ks/.triton/cache

EXPOSE 8000
CMD ["kernelsearch", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-worker"]
