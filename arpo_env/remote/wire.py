"""What crosses the wire between `arpo serve` and `RemoteEnv`: JSON values, the bearer token, signed snapshots.

A snapshot leaves the server as ``<base64 JSON>.<HMAC-SHA256>``, signed with a key derived from the server's token:
a server that serves the same envs with the same token restores it, and any change to it is refused before it is
read. Nothing from the wire is ever unpickled.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import os
from pathlib import Path
from typing import Any

TOKEN_VARIABLE = "ARPO_SERVE_TOKEN"
"""The environment variable a token is read from, by the server and the client."""


class WireError(RuntimeError):
    """A request the server answered with an error, or a server that could not be reached in time: the message says
    which, in a person's words."""


def read_token(token: str | None = None, token_file: str | os.PathLike | None = None) -> str:
    """The token: given, read from `token_file`, or from ``$ARPO_SERVE_TOKEN``; a `ValueError` when there is none or
    it is too short to guess at."""
    if token is None and token_file is not None:
        token = Path(token_file).read_text(encoding="utf-8").strip()
    if token is None:
        token = os.environ.get(TOKEN_VARIABLE)
    if not token:
        raise ValueError(f"no token: set {TOKEN_VARIABLE}, or give a token file (--token_file); the server refuses "
                         "every request without one")
    if len(token) < 16:
        raise ValueError("the token is shorter than 16 characters: make one with "
                         "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return token


def _key(token: str) -> bytes:
    return hmac.new(token.encode(), b"arpo snapshot v1", hashlib.sha256).digest()


def sign(value: Any, token: str) -> str:
    body = base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).decode()
    mac = hmac.new(_key(token), body.encode(), hashlib.sha256).hexdigest()
    return f"{body}.{mac}"


def verify(signed: Any, token: str) -> Any:
    """The value `sign` wrapped, or a `ValueError` when it was not signed with this token or was changed."""
    if not isinstance(signed, str) or signed.count(".") != 1:
        raise ValueError("a snapshot is the string the server's snapshot endpoint returned")
    body, mac = signed.split(".")
    if not hmac.compare_digest(hmac.new(_key(token), body.encode(), hashlib.sha256).hexdigest(), mac):
        raise ValueError("the snapshot's signature does not match: it was changed, or made by a server with another "
                         "token")
    return json.loads(base64.urlsafe_b64decode(body.encode()))


def jsonable(value: Any) -> Any:
    """`value` as JSON can carry it: tuples and sets as lists, numpy scalars as numbers, NaN as None, anything else
    as its text (an env's ``info`` may hold any of these)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)
    if callable(item):
        return jsonable(item())
    return str(value)
