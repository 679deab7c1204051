"""The suite's fixtures (a real nats-server, the HTTP client) for these repros
(tests/conftest.py is not an ancestor of this folder)."""

from tests.conftest import (  # noqa: F401
    namespace,
    nats_server,
    pytest_addoption,
    pytest_collection_modifyitems,
)
from tests.e2e.conftest import client, engine  # noqa: F401
