"""How fusee authenticates to NATS: the credential options of ``fusee.connect``, checked
before anything connects, and turned into nats-py's options.

One method at a time (user/password, token, nkey seed, ``.creds`` file), plus TLS
(a CA bundle, and a client certificate with its key for mutual TLS), which goes with
any of them. A file that is missing is named here, not by an ``OSError`` deep in
nats-py; an auth failure is reported by :func:`refused` naming the server and the
method, never the secret.
"""

from __future__ import annotations

import importlib.util
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from fusee.errors import ConfigError

__all__ = ("Credentials", "redact")

PathLike = str | os.PathLike[str]


def _file(value: PathLike, option: str) -> str:
    path = Path(os.fspath(value)).expanduser()
    if not path.is_file():
        raise ConfigError(f"{option}={os.fspath(value)!r}: no such file")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"{option}={os.fspath(value)!r}: cannot be read ({exc.strerror})"
        ) from None
    return str(path)


@dataclass(frozen=True)
class Credentials:
    """The credential options of ``fusee.connect``, checked (see :meth:`make`)."""

    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkey_seed: str | None = None  # a seed file's path, or the seed itself ("SU...")
    nkey_is_file: bool = False
    creds: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def make(
        cls,
        *,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        nkey_seed: PathLike | None = None,
        creds: PathLike | None = None,
        tls_ca: PathLike | None = None,
        tls_cert: PathLike | None = None,
        tls_key: PathLike | None = None,
    ) -> Credentials:
        """Check the options: one auth method, files that exist, a client certificate
        with its key.

        Raises:
            ConfigError: naming the option that is wrong (never its secret).
        """
        if (user is None) != (password is None):
            given, missing = ("user", "password") if password is None else ("password", "user")
            raise ConfigError(f"{given} was given without {missing}: NATS needs both")
        methods = [
            name
            for name, value in (
                ("user/password", user),
                ("token", token),
                ("nkey_seed", nkey_seed),
                ("creds", creds),
            )
            if value is not None
        ]
        if len(methods) > 1:
            raise ConfigError(
                f"{' and '.join(methods)} were both given: choose one way to authenticate to NATS"
            )
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError(
                "tls_cert and tls_key go together: a client certificate needs its private key"
            )
        for name, value in (("user", user), ("password", password), ("token", token)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name} must be a non-empty string")
        seed, seed_file = None, False
        if nkey_seed is not None:
            text = os.fspath(nkey_seed)
            if isinstance(nkey_seed, str) and text.startswith("SU") and "/" not in text:
                seed = text  # the seed itself (a user's seed starts "SU")
            else:
                seed, seed_file = _file(nkey_seed, "nkey_seed"), True
        return cls(
            user=user,
            password=password,
            token=token,
            nkey_seed=seed,
            nkey_is_file=seed_file,
            creds=None if creds is None else _file(creds, "creds"),
            tls_ca=None if tls_ca is None else _file(tls_ca, "tls_ca"),
            tls_cert=None if tls_cert is None else _file(tls_cert, "tls_cert"),
            tls_key=None if tls_key is None else _file(tls_key, "tls_key"),
        )

    @property
    def method(self) -> str:
        """How this authenticates, for messages: ``user/password (user 'w')``, ``token``..."""
        if self.user is not None:
            out = f"user/password (user {self.user!r})"
        elif self.token is not None:
            out = "token"
        elif self.nkey_seed is not None:
            out = f"nkey seed file {self.nkey_seed}" if self.nkey_is_file else "nkey seed"
        elif self.creds is not None:
            out = f"creds file {self.creds}"
        else:
            out = ""
        if self.tls_cert is not None:
            out += f"{', ' if out else ''}TLS client certificate {self.tls_cert}"
        return out or "no credentials"

    def options(self) -> dict[str, Any]:
        """The keyword arguments of ``nats.connect`` for these credentials.

        Raises:
            ConfigError: a TLS file that is not a certificate or key, or an nkey seed
                without the ``nkeys`` package.
        """
        out: dict[str, Any] = {}
        if self.user is not None:
            out["user"], out["password"] = self.user, self.password
        if self.token is not None:
            out["token"] = self.token
        signs = self.nkey_seed is not None or self.creds is not None
        if signs and importlib.util.find_spec("nkeys") is None:  # nats-py signs with it
            raise ConfigError(
                "nkey and .creds authentication need the nkeys package: pip install 'fusee[nkeys]'"
            )
        if self.nkey_seed is not None:
            self._check_seed()
            out["nkeys_seed" if self.nkey_is_file else "nkeys_seed_str"] = self.nkey_seed
        if self.creds is not None:
            out["user_credentials"] = self.creds
        if self.tls_ca is not None or self.tls_cert is not None:
            out["tls"] = self._tls()
        return out

    def _check_seed(self) -> None:
        """Decode the nkey seed as nats-py will (a traceback from deep in its connect
        otherwise); the error names the option, never the seed."""
        import nkeys  # (present: checked by options)

        where = f"the seed file {self.nkey_seed}" if self.nkey_is_file else "the seed given"
        try:
            if self.nkey_is_file:
                seed = Path(self.nkey_seed or "").read_bytes().strip()
            else:
                seed = (self.nkey_seed or "").encode()
            nkeys.from_seed(bytearray(seed))
        except (OSError, ValueError, nkeys.NkeysError) as exc:
            raise ConfigError(
                f"nkey_seed: {where} is not an nkey seed ({type(exc).__name__}; a user's "
                "seed is one line starting 'SU', as `nsc` or `nk -gen user` writes it)"
            ) from None

    def _tls(self) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"tls_ca={self.tls_ca!r}: not a CA certificate bundle ({exc})"
            ) from None
        if self.tls_cert is not None:
            try:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
            except ssl.SSLError as exc:
                raise ConfigError(
                    f"tls_cert={self.tls_cert!r}, tls_key={self.tls_key!r}: not a certificate "
                    f"and its private key ({exc})"
                ) from None
        return ctx


def url_user(url: str) -> str | None:
    """The user named in ``url`` (the first of a comma-separated list that names one):
    ``nats://w:secret@host`` -> ``"w"``; None when none does (or it is a bare token)."""
    for part in url.split(","):
        try:
            netloc = urlsplit(part.strip()).netloc
        except ValueError:
            continue
        userinfo, at, _ = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        if at and colon and user:
            return unquote(user)
    return None


def url_method(url: str) -> str | None:
    """How ``url`` authenticates, for messages (never the secret): ``user/password in
    the URL (user 'w')``, ``token in the URL``; None when it carries no credentials."""
    user = url_user(url)
    if user is not None:
        return f"user/password in the URL (user {user!r})"
    if any("@" in part for part in url.split(",")):
        return "token in the URL"
    return None


def redact(url: str) -> str:
    """``url`` (or each of a comma-separated list) without a password or token in it:
    ``nats://w:secret@host:4222`` -> ``nats://w:***@host:4222``."""
    out = []
    for part in url.split(","):
        try:
            split = urlsplit(part.strip())
        except ValueError:
            out.append(part)
            continue
        if "@" not in split.netloc:
            out.append(part.strip())
            continue
        userinfo, _, host = split.netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        masked = f"{user}:***" if colon else "***"
        netloc = f"{masked}@{host}"
        out.append(urlunsplit((split.scheme, netloc, split.path, split.query, split.fragment)))
    return ",".join(out)
