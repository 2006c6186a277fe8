# One image for the API and the GPU workers. The base carries CUDA torch and Triton.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
WORKDIR /app
COPY pyproject.toml README.md ./
COPY backend backend
COPY worker worker
COPY kernels kernels
COPY parallel parallel
COPY frontend frontend
RUN pip install --no-cache-dir -e .
ENV BENCHLAB_DATA_DIR=/data BENCHLAB_HOST=0.0.0.0
EXPOSE 8000
CMD ["benchlab", "api"]
