"""``fusee.fail_over``: move a regional namespace's home to its partner region (the
procedure is ``adapters/jetstream/failover.py``; docs/operations.md, "Two regions")."""

from __future__ import annotations

import os
from collections.abc import Sequence

from fusee._engine import nats_urls
from fusee.adapters.jetstream.credentials import Credentials
from fusee.adapters.jetstream.failover import FailoverReport
from fusee.adapters.jetstream.failover import fail_over as _fail_over
from fusee.adapters.jetstream.store import NatsStore
from fusee.errors import ConfigError
from fusee.runtime.ids import validate_namespace
from fusee.runtime.regions import validate_lease, validate_region

__all__ = ("fail_over",)


async def fail_over(
    url: str | Sequence[str] | None = None,
    *,
    to: str,
    namespace: str = "fusee",
    user: str | None = None,
    password: str | None = None,
    creds: str | os.PathLike[str] | None = None,
    lease: float | None = None,
) -> FailoverReport:
    """Fail ``namespace`` over to region ``to``, through ``url`` (servers of ``to``;
    default ``$FUSEE_NATS_URL``): the old home's streams and buckets are deleted through
    the meta group, the partner's mirrors promoted to the next epoch's streams, and
    every writer of the old epoch is refused from then on. Run it only once the old
    home is lost (or, for a planned handover, its workers stopped): a home that is up
    and serving loses what its mirror has not copied. Then start workers in ``to``.
    When the old home does not answer, the promotion waits ``lease`` seconds (the
    workers' region lease: ``$FUSEE_REGION_LEASE``, default 20) after the old home's
    streams are deleted, so that a home cut off but alive has stopped appending.

    Raises:
        ConfigError: no ``url``, or a bad region name.
        InvalidArgument: ``to`` is the home already, or the namespace has no regions.
        FuseeError: ``to`` holds no mirror of the journal.

    Example:
        ``report = await fusee.fail_over("nats://west-1:4222", to="west")``
    """
    namespace = validate_namespace(namespace)
    to = validate_region(to, "target region")
    urls = nats_urls(url or os.environ.get("FUSEE_NATS_URL") or None)
    if not urls:
        raise ConfigError("fail_over needs the url of servers of the target region")
    credentials = Credentials.make(
        user=user or os.environ.get("FUSEE_NATS_USER") or None,
        password=password or os.environ.get("FUSEE_NATS_PASSWORD") or None,
        creds=creds or os.environ.get("FUSEE_NATS_CREDS") or None,
    )
    store = await NatsStore.connect(urls, namespace, region=to, credentials=credentials)
    store.follows_failover = False  # it makes the failover, reading the epoch it ends
    try:
        return await _fail_over(store, to, lease=None if lease is None else validate_lease(lease))
    finally:
        await store.close()
