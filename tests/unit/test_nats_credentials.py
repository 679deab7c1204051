"""The credential options' checks and the roles' lists, without a server (the server
side: tests/integration/test_nats_permissions.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusee.adapters.jetstream.credentials import Credentials, redact
from fusee.adapters.jetstream.permissions import permission_denied, permissions
from fusee.errors import ConfigError


def test_a_password_or_token_in_a_url_is_masked() -> None:
    assert redact("nats://w:secret@h:4222,nats://tok@h2:1,nats://h3:2") == (
        "nats://w:***@h:4222,nats://***@h2:1,nats://h3:2"
    )


def test_an_nkey_seed_is_a_seed_or_a_file(tmp_path: Path) -> None:
    import secrets

    import nkeys

    given = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER).decode()
    assert Credentials.make(nkey_seed=given).options() == {"nkeys_seed_str": given}
    seed = tmp_path / "u.nk"
    seed.write_text(given + "\n")
    assert Credentials.make(nkey_seed=seed).options() == {"nkeys_seed": str(seed)}
    with pytest.raises(ConfigError, match=r"nkey_seed=.*: no such file"):
        Credentials.make(nkey_seed=tmp_path / "nope")


def test_an_nkey_seed_that_does_not_decode_is_named_never_shown(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nkey_seed: the seed given is not") as err:
        Credentials.make(nkey_seed="SUAEXAMPLE").options()
    assert "SUAEXAMPLE" not in str(err.value)
    seed = tmp_path / "u.nk"
    seed.write_text("SUAEXAMPLE")
    with pytest.raises(ConfigError, match=r"the seed file .*u\.nk is not"):
        Credentials.make(nkey_seed=seed).options()


def test_the_method_names_the_user_never_the_secret() -> None:
    made = Credentials.make(user="w", password="secret")
    assert made.method == "user/password (user 'w')"
    assert "secret" not in Credentials.make(token="secret").method


def test_a_permission_violation_names_its_subject() -> None:
    err = Exception('nats: permissions violation for publish to "$js.api.stream.purge.fusee"')
    assert permission_denied(err) == "$js.api.stream.purge.fusee"
    assert permission_denied(Exception("nats: 'Authorization Violation'")) is None


def test_the_client_role_may_not_write_journals_and_no_role_but_admin_may_purge() -> None:
    client, worker = permissions("fusee", "client"), permissions("fusee", "worker")
    assert "fusee.run.>" in client.publish_deny
    assert client.publish_allow is not None
    assert not any(s.startswith("fusee.run") for s in client.publish_allow)
    for role in (client, worker):
        assert "$JS.API.STREAM.PURGE.>" in role.publish_deny
        assert "$JS.API.STREAM.DELETE.>" in role.publish_deny
    assert permissions("fusee", "admin").publish_allow is None
    with pytest.raises(ValueError, match="role='root'"):
        permissions("fusee", "root")
