# The graphrun image: the operator, the partitioner and the workers all run it.
#   docker build -t ghcr.io/graphrun/graphrun:0.1.0 .
#   kind load docker-image ghcr.io/graphrun/graphrun:0.1.0      (local clusters)
# The image needs no kubectl and no SSH: workers talk ZeroMQ and torch.distributed.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements ./requirements
COPY graphrun ./graphrun
# CPU wheels of torch (a CUDA image would use the matching index instead), pinned by the
# constraint file scripts/install takes, so the image runs the torch the tests ran.
RUN pip install --prefix=/install --extra-index-url https://download.pytorch.org/whl/cpu -c requirements/constraints.txt .

FROM python:3.11-slim
RUN useradd --uid 10001 --create-home graphrun
COPY --from=build /install /usr/local
USER 10001
WORKDIR /home/graphrun
ENTRYPOINT []
CMD ["graphrun", "--help"]
