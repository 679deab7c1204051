"""The NATS permissions of fusee's three roles in one namespace, and the accounts config
that grants them (``nats/accounts.conf`` is :func:`accounts_config` of ``"fusee"``).

The lists are made from :class:`~fusee.adapters.jetstream.layout.Layout`, so they name
exactly the subjects, streams and buckets fusee uses; NATS wildcards match whole tokens
only, so streams are listed by name, never patterned. Why each line is there (measured
against a real server by ``tests/integration/test_nats_permissions.py``):
``docs/reference/nats-permissions.md``.

- **admin**: everything in the account (creates and updates the layout, purges, deletes).
- **worker**: runs workflows and objects: writes journals, inboxes, values, token
  streams and the buckets; never creates, updates, purges or deletes a stream or a
  consumer.
- **client**: reads runs and token streams, signals and cancels runs, calls objects:
  writes only inbox messages (``<ns>.in.<partition>.<id>``), never a journal
  (``<ns>.run.>``), a value, a token, a bucket, nor anything the worker may not; on
  core NATS it only calls shared handlers and hears heartbeats (never poses as a
  worker: no heartbeat, ping answer, take or wake), and subscribes to its own reply
  inboxes only (:func:`inbox_prefix`); it reads the work bucket key by key, never the
  namespace's secret (:func:`_client_work_reads`).

These roles are not a security boundary against a hostile client or worker: what each
can still do is in ``docs/reference/nats-permissions.md`` ("What the roles do not
stop"); untrusted callers go through the HTTP API and its tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from fusee.adapters.jetstream.layout import Layout

__all__ = (
    "Permissions",
    "ROLES",
    "permissions",
    "accounts_config",
    "permission_denied",
    "inbox_prefix",
    "role_for",
)

ROLES = ("admin", "worker", "client")

# Never for a worker or a client ("deny has priority" over allow, authorization.md):
# removing or rewriting what is stored, changing the layout, the account's JetStream.
_NO_ADMIN = (
    "$JS.API.STREAM.CREATE.>",
    "$JS.API.STREAM.UPDATE.>",
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.STREAM.PURGE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
    "$JS.API.STREAM.SNAPSHOT.>",
    "$JS.API.STREAM.RESTORE.>",
    "$JS.API.STREAM.LEADER.>",
    "$JS.API.STREAM.PEER.>",
    "$JS.API.CONSUMER.DELETE.>",
    "$JS.API.CONSUMER.DURABLE.CREATE.>",
    "$JS.API.CONSUMER.PAUSE.>",
    "$JS.API.CONSUMER.LEADER.>",
    "$JS.API.CONSUMER.UNPIN.>",
    "$JS.API.META.>",
    "$JS.API.ACCOUNT.>",
    "$JS.API.SERVER.>",
)


@dataclass(frozen=True)
class Permissions:
    """What one role may publish and subscribe to (``None``: no restriction)."""

    publish_allow: tuple[str, ...] | None
    publish_deny: tuple[str, ...]
    subscribe_allow: tuple[str, ...] | None


def _streams(lay: Layout) -> tuple[list[str], list[str]]:
    """(the streams anyone reads, the KV buckets' streams): the API checks its tokens
    in the ``<ns>_auth`` bucket with the client's credentials (read and watch only;
    writing tokens is an admin's)."""
    read = (lay.runs_bucket, lay.work_bucket, lay.objects_bucket, lay.auth_bucket)
    buckets = [lay.kv_stream(b) for b in read]
    tokens = f"{lay.stream}_TOKENS"  # TokenStore.stream
    return [lay.stream, lay.values_stream, tokens], buckets


# The work bucket's keys a client reads, one by one (``NatsStore``): the namespace's
# settings but its secret, objects' active markers, partitions' owners, limits.
_CLIENT_WORK_KEYS = (
    "config.partitions",
    "config.listed_from",
    "config.paused_listed",
    "active.>",
    "owner.>",
    "limit.>",
)


def _client_work_reads(lay: Layout) -> list[str]:
    """The client's reads of the work bucket: its info (key names, no values) and a
    Direct Get per key it reads, by subject. Not the secret (``config.secret``, the
    key of completion URLs and API tokens): no Direct Get of it, nor the forms that
    name their subject in the body (a Direct Get or message get without a subject
    token, a consumer), which would reach it too."""
    stream, bucket = lay.kv_stream(lay.work_bucket), lay.work_bucket
    gets = [f"$JS.API.DIRECT.GET.{stream}.$KV.{bucket}.{k}" for k in _CLIENT_WORK_KEYS]
    return [f"$JS.API.STREAM.INFO.{stream}", *gets]


def _read(lay: Layout, *, client: bool = False) -> list[str]:
    """What every role needs to read: stream info, direct gets, the ordered consumers a
    watch (results, token streams, bucket listings) makes, and their flow control (the
    client reads the work bucket key by key: :func:`_client_work_reads`)."""
    streams, buckets = _streams(lay)
    if client:
        buckets = [b for b in buckets if b != lay.kv_stream(lay.work_bucket)]
    out = ["$JS.API.INFO", *(_client_work_reads(lay) if client else ())]
    for s in (*streams, *buckets):
        out += [
            f"$JS.API.STREAM.INFO.{s}",
            f"$JS.API.DIRECT.GET.{s}",
            f"$JS.API.DIRECT.GET.{s}.>",
            f"$JS.API.STREAM.MSG.GET.{s}",
            f"$JS.API.CONSUMER.CREATE.{s}",
            f"$JS.API.CONSUMER.CREATE.{s}.>",
            f"$JS.API.CONSUMER.INFO.{s}.*",
            f"$JS.API.CONSUMER.MSG.NEXT.{s}.*",
            f"$JS.ACK.{s}.>",
            f"$JS.FC.{s}.>",
        ]
    return out


def inbox_prefix(user: str | None) -> str:
    """The reply inbox prefix of a connection as ``user``: ``_INBOX.<user>`` when the
    name is one subject token (so a role's subscribe permission names its own replies
    only: ``_INBOX.<user>.>``), else nats-py's ``_INBOX``.

    Example:
        ``inbox_prefix("fusee_client") == "_INBOX.fusee_client"``
    """
    if user and not any(c in user for c in ".*> \t\r\n"):
        return f"_INBOX.{user}"
    return "_INBOX"


def _worker_core(lay: Layout, user: str) -> tuple[list[str], list[str]]:
    """(publish, subscribe) on core NATS for a worker: wake hints, heartbeats, pings,
    hand-overs, shared calls under ``_fusee.<ns>.>``; answers to any caller's inbox."""
    core = f"_fusee.{lay.namespace}.>"
    return [core, "_INBOX.>"], [core, f"{inbox_prefix(user)}.>"]


def _client_core(lay: Layout, user: str) -> tuple[list[str], list[str]]:
    """(publish, subscribe) on core NATS for a client: calls to shared handlers and
    pings of a partition's owner (``Run.describe``), their replies to its own inbox;
    the heartbeats ``Engine.live_workers`` hears. No heartbeat, ping answer, take or
    wake of its own: it cannot pose as a worker (a worker follows every inbox, so a
    signal needs no wake hint), nor take another's calls or replies."""
    shared = lay.shared_calls("x").rpartition(".")[0] + ".*"  # every object type
    pub = [shared, lay.ping("*")]
    sub = [lay.heartbeat("*"), f"{inbox_prefix(user)}.>"]
    return pub, sub


def permissions(namespace: str, role: str) -> Permissions:
    """The permissions of ``role`` (one of :data:`ROLES`) in ``namespace``.

    Raises:
        ValueError: an unknown role.

    Example:
        ``permissions("fusee", "client").publish_deny`` includes ``"fusee.run.>"``
    """
    lay = Layout(namespace)
    ns = lay.namespace
    user = f"{ns}_{role}"  # as accounts_config names the role's user
    if role == "admin":
        return Permissions(None, (), None)
    if role == "worker":
        buckets = [f"$KV.{b}.>" for b in (lay.runs_bucket, lay.work_bucket, lay.objects_bucket)]
        pub, sub = _worker_core(lay, user)
        allow = [*_read(lay), f"{ns}.>", *buckets, *pub]
        return Permissions(tuple(allow), _NO_ADMIN, tuple(sub))
    if role == "client":
        pub, sub = _client_core(lay, user)
        # inbox messages only: signals, cancels, invocations (``Layout.inbox``)
        allow = [
            *_read(lay, client=True),
            f"{ns}.in.*.*",
            # an object call marks its key active (``NatsStore.ensure_active``), so the
            # partition's owner activates it
            f"$KV.{lay.work_bucket}.active.>",
            *pub,
        ]
        deny = (
            *_NO_ADMIN,
            f"{ns}.run.>",  # journals: only their actor writes them, under its fence
            f"{ns}.in.x.>",  # index and listing entries (``in.x`` is no partition)
            f"{ns}.val.>",
            f"{ns}.tok.>",
            f"$KV.{lay.runs_bucket}.>",
            f"$KV.{lay.objects_bucket}.>",
            f"$KV.{lay.auth_bucket}.>",
        )
        return Permissions(tuple(allow), deny, tuple(sub))
    raise ValueError(f"role={role!r}: must be one of {', '.join(ROLES)}")


def _matches(pattern: str, subject: str) -> bool:
    """Whether NATS subject ``pattern`` (``*`` one token, ``>`` the rest) covers ``subject``."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def role_for(namespace: str, subject: str) -> str:
    """The least of :data:`ROLES` (client, then worker, then admin) whose permissions
    let it publish to ``subject`` (compared case-insensitively: the server's refusal
    lowercases it).

    Example:
        ``role_for("fusee", "fusee.run.r1.j") == "worker"``
    """
    low = subject.lower()
    for role in ("client", "worker"):
        perms = permissions(namespace, role)
        allow = perms.publish_allow or ()
        if any(_matches(p.lower(), low) for p in allow) and not any(
            _matches(p.lower(), low) for p in perms.publish_deny
        ):
            return role
    return "admin"


# nats-py's text for the server's ``-ERR 'Permissions Violation for Publish to "X"'``
# (lowercased), and the same for a subscription
_VIOLATION = re.compile(r'permissions violation for (?:publish|subscription) to "([^"]+)"', re.I)


def permission_denied(exc: BaseException) -> str | None:
    """The subject of a permission violation nats-py reported (its error callback),
    lowercased as nats-py gives it; None for any other error."""
    found = _VIOLATION.search(str(exc))
    return None if found is None else found.group(1).lower()


def _list(items: tuple[str, ...], indent: str) -> str:
    q = json.dumps  # a JSON string is a valid quoted string in the nats config syntax
    return "[\n" + "".join(f"{indent}  {q(i)}\n" for i in items) + f"{indent}]"


def _user(namespace: str, role: str, indent: str) -> str:
    perms = permissions(namespace, role)
    head = (
        f"{indent}{{ user: {namespace}_{role}, password: ${namespace.upper()}_{role.upper()}_PASS"
    )
    if perms.publish_allow is None:
        return head + " }\n"
    i2, i3 = indent + "  ", indent + "    "
    sub = perms.subscribe_allow or ()
    return (
        head
        + "\n"
        + f"{i2}permissions: {{\n"
        + f"{i3}publish: {{\n"
        + f"{i3}  allow: {_list(perms.publish_allow, i3 + '  ')}\n"
        + f"{i3}  deny: {_list(perms.publish_deny, i3 + '  ')}\n"
        + f"{i3}}}\n"
        + f"{i3}subscribe: {{ allow: {_list(sub, i3)} }}\n"
        + f"{i2}}}\n"
        + f"{indent}}}\n"
    )


def accounts_config(namespace: str) -> str:
    """A nats-server ``accounts`` block for ``namespace``: account ``<NS>`` with users
    ``<ns>_admin``, ``<ns>_worker`` and ``<ns>_client`` (passwords from the server's
    environment: ``$<NS>_ADMIN_PASS`` and so on), and a system account ``SYS``
    (``$<NS>_SYS_PASS``). ``include`` it from the server's config.

    Example:
        ``Path("accounts.conf").write_text(accounts_config("fusee"))``
    """
    ns = Layout(namespace).namespace
    users = "".join(_user(ns, role, "      ") for role in ROLES)
    return (
        f"# Least-privilege accounts for the fusee namespace {ns!r} (stream {ns.upper()}).\n"
        "# Made by fusee.adapters.jetstream.permissions.accounts_config; do not edit by hand:\n"
        f"#   python -m fusee.adapters.jetstream.permissions {ns} > accounts.conf\n"
        "# Include it from a server config (`include ./accounts.conf`) and set the passwords\n"
        "# in nats-server's environment. Why each line: docs/reference/nats-permissions.md.\n"
        "accounts {\n"
        f"  {ns.upper()} {{\n"
        "    jetstream: enabled\n"
        "    users: [\n"
        f"{users}"
        "    ]\n"
        "  }\n"
        f"  SYS {{ users: [ {{ user: sys, password: ${ns.upper()}_SYS_PASS }} ] }}\n"
        "}\n"
        "system_account: SYS\n"
    )


if __name__ == "__main__":
    import sys

    sys.stdout.write(accounts_config(sys.argv[1] if len(sys.argv) > 1 else "fusee"))
