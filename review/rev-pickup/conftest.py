"""The suite's fixtures (a real nats-server, an engine per test) for the review repros."""

from tests.conftest import *  # noqa: F403
from tests.conftest import pytest_addoption, pytest_collection_modifyitems  # noqa: F401
from tests.integration.conftest import *  # noqa: F403
