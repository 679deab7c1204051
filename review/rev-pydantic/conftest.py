"""The suite's fixtures (a real nats-server, an engine per test) for these repros."""

from tests.conftest import (  # noqa: F401
    namespace,
    nats_server,
    pytest_addoption,
    pytest_collection_modifyitems,
)
from tests.integration.conftest import engine  # noqa: F401
