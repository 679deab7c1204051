"""``fusee region failover|status``: a regional namespace's home, epoch and mirror, and
failing it over to the partner region (``fusee.fail_over``; docs/operations.md, "Two
regions").

``failover --to west`` (``--nats`` naming servers of ``west``) prints what it did:
the new epoch and stream, the journal's last sequence, the records lost when the old
home did not answer (unknown: at most the mirror's last reported lag). ``status``
prints the home, the epoch and the mirror's lag (``engine.mirror_lag()``).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated

import typer

import fusee
from fusee.adapters.cli.commands import CONNECT_TIMEOUT_QUERY, open_engine
from fusee.adapters.cli.errors import CliError, Exit
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.cli.params import fusee_command
from fusee.adapters.cli.render import json_text

__all__ = ("region_app", "region_failover", "region_status")

region_app = typer.Typer(
    no_args_is_help=True,
    help="A regional namespace's home and mirror; fail it over to the partner region.",
)


@region_app.command("failover")
@fusee_command()
async def _failover(
    opts: GlobalOptions,
    to: Annotated[
        str,
        typer.Option("--to", metavar="REGION", help="the partner region to move the home to"),
    ],
) -> int:
    """Move the namespace's home to REGION: once the old home is lost (or its workers
    are stopped, for a planned handover).

    Deletes the old home's streams and buckets through the meta group, promotes the
    mirrors in REGION to the next epoch's streams, and from then on refuses every
    writer of the old epoch. --nats must name servers of REGION. Then start workers
    there (fusee worker --region REGION).
    """
    return await region_failover(opts, to)


@region_app.command("status")
@fusee_command()
async def _status(
    opts: GlobalOptions,
    region: Annotated[
        str,
        typer.Option(
            "--region", metavar="REGION", envvar="FUSEE_REGION", help="the region asked from"
        ),
    ],
) -> int:
    """The namespace's home region, epoch, journal stream and its mirror's lag."""
    return await region_status(opts, region)


async def region_failover(opts: GlobalOptions, to: str) -> int:
    if opts.nats is None:
        raise CliError("fusee region failover needs --nats (servers of the target region)")
    report = await fusee.fail_over(
        opts.nats,
        to=to,
        namespace=opts.namespace,
        user=opts.user,
        password=opts.password,
        creds=opts.creds,
    )
    if opts.as_json:
        sys.stdout.write(json_text(dict(report.__dict__)) + "\n")
        return Exit.OK
    lost = "unknown (the old home did not answer)" if report.lost is None else str(report.lost)
    sys.stdout.write(
        f"namespace {report.namespace!r}: home {report.from_region} -> {report.to_region}, "
        f"epoch {report.epoch}, journal {report.stream} (last sequence {report.last_seq}); "
        f"records lost: {lost}, the mirror's last reported lag {report.last_lag}; "
        f"{report.seconds:.1f}s. Start workers with --region {report.to_region}.\n"
    )
    return Exit.OK


async def region_status(opts: GlobalOptions, region: str) -> int:
    opts = dataclasses.replace(opts, region=region)
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        layout = engine.store.layout
        lag = await engine.mirror_lag()
    out = {
        "namespace": layout.namespace,
        "home": layout.home,
        "epoch": layout.epoch,
        "stream": layout.stream,
        "mirror": None if lag is None else {**lag.__dict__, "behind": lag.behind},
    }
    if opts.as_json:
        sys.stdout.write(json_text(out) + "\n")
        return Exit.OK
    mirror = (
        "no mirror"
        if lag is None
        else f"mirror {lag.mirror} in {lag.region}: {lag.behind} records behind "
        f"(its own lag {lag.lag})"
    )
    sys.stdout.write(
        f"namespace {layout.namespace!r}: home {layout.home}, epoch {layout.epoch}, "
        f"journal {layout.stream}; {mirror}\n"
    )
    return Exit.OK
