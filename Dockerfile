# One image for the API and the GPU workers.
#
# Base: a PyTorch *devel* image, so torch, Triton and CUDA come matched from one build and a C
# compiler is there (Triton compiles its launcher, torch.compile's inductor compiles kernels). The
# default tag is a released one with Triton >= 3.2 (what benchlab needs); pick the tag whose CUDA
# your hosts' driver supports with `--build-arg BASE=pytorch/pytorch:<tag>`.
ARG BASE=pytorch/pytorch:2.7.1-cuda12.8-cudnn9-devel
FROM ${BASE}

ARG BENCHLAB_COMMIT=unknown
ENV BENCHLAB_COMMIT=${BENCHLAB_COMMIT} \
    BENCHLAB_DATA_DIR=/data \
    BENCHLAB_HOST=0.0.0.0 \
    BENCHLAB_HEARTBEAT_FILE=/tmp/benchlab-heartbeat \
    PYTHONUNBUFFERED=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY scripts/install-image.sh scripts/requirements.py scripts/
COPY backend backend
COPY worker worker
COPY kernels kernels
COPY parallel parallel
COPY frontend frontend
# benchlab beside the image's own torch and Triton, never replacing them
RUN scripts/install-image.sh python postgres

RUN useradd --create-home --uid 10001 benchlab && mkdir -p /data && chown benchlab /data
USER benchlab
VOLUME /data
EXPOSE 8000
# the API answers /api/health; a worker's heartbeat file is fresh (docker-compose.yml sets the
# worker's own check)
HEALTHCHECK --interval=15s --timeout=5s --retries=5 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/api/health', timeout=4)"
CMD ["benchlab", "api"]
