"""What of a request's path may go into a log line.

A completion URL's last segment is its signed token (``/v1/completions/{token}``):
whoever holds it can answer the run's wait, so it never reaches a log. Every log line
of the HTTP API that carries a path takes it through :func:`redacted`.
"""

from __future__ import annotations

import re

__all__ = ("redacted",)

# the segment after /v1/completions/, also percent-encoded or behind a doubled slash
_COMPLETION = re.compile(r"(/v1/+completions/+)[^/?#]+", re.IGNORECASE)


def redacted(path: object) -> str:
    """``path`` with a completion token replaced by ``***``.

    Example:
        ``redacted("/v1/completions/c1.abc")`` -> ``'/v1/completions/***'``
    """
    return _COMPLETION.sub(r"\1***", str(path))
