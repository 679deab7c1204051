# The fusee worker image that compose.yaml runs.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir . && useradd --create-home fusee
COPY examples ./examples

USER fusee
CMD ["fusee", "worker", "examples/agent.py", "--nats", "nats://n1:4222"]
