# The fusee worker image that compose.yaml runs.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir . && useradd --create-home fusee
COPY examples ./examples

USER fusee
# the servers come from $FUSEE_NATS_URL (compose.yaml sets all three nodes)
CMD ["fusee", "worker", "examples/agent.py"]
