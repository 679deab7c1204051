"""Namespaces whose names look like another's epoch: ``<ns>_e2``'s own journal stream is
named as ``<ns>``'s epoch-2 journal would be (``<NS>_E2``). It is no failover of
``<ns>``: only a mirror of ``<ns>``'s previous epoch, recorded as fusee's, is taken as a
failover waiting for its promotion (``regions.pending_promotion``)."""

from __future__ import annotations

import fusee
from fusee.adapters.jetstream.regions import pending_promotion
from fusee.adapters.jetstream.server import EmbeddedServer


async def test_a_namespace_named_like_anothers_epoch_is_not_its_failover(
    nats_server: EmbeddedServer, namespace: str
) -> None:
    lookalike = await fusee.connect(nats_server.url, namespace=f"{namespace}_e2")
    try:
        assert lookalike.store.layout.stream == f"{namespace.upper()}_E2"
        assert await pending_promotion(lookalike.store.nc, namespace) is None
        # a new namespace beside it is made, not refused as failed over
        engine = await fusee.connect(nats_server.url, namespace=namespace)
        try:
            assert engine.store.layout.stream == namespace.upper()
            info = await engine.store.js.stream_info(namespace.upper())
            assert f"{namespace}.run.>" in (info.config.subjects or [])
        finally:
            await engine.close()
    finally:
        await lookalike.close()
