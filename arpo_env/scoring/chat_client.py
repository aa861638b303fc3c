"""A client for OpenAI-compatible chat endpoints (vLLM, SGLang, OpenAI's API, …), shared by the LLM judge
(`arpo_env.scoring.judge.LLMJudge`) and ``arpo eval --backend openai``.

* ``base_url`` is the API's root, with or without its ``/v1``: ``http://127.0.0.1:8000`` and
  ``http://127.0.0.1:8000/v1`` name the same endpoint.
* ``model=None`` asks the endpoint which model it serves (``GET /v1/models``, the first one listed: vLLM and SGLang
  serve one), once.
* A request that fails for a passing reason — the connection refused or dropped, a timeout, a 408, 409, 429 or 5xx
  answer — is tried again after 1, 2, 4, … seconds (a ``Retry-After`` of up to a minute is honoured), ``retries``
  times. Then, and at once for any other error answer, `ChatError` carries the server's own message (the text of an
  HTML page, on one line); its `refused` tells an error that no request of the run can get past (401, 403, 404: a
  wrong key, address or model name; 405, 501, or an answer that is not JSON or holds no message: not an API there)
  from one of this request, and `context_overflow` a request longer than the model's context.
"""

from __future__ import annotations

import html
import re
import threading
import time
from typing import Any

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
REFUSED_STATUS = frozenset({401, 403, 404, 405, 501})
_OVERFLOW = re.compile(r"context length|context window|maximum context|too many tokens|prompt is too long", re.I)


class ChatError(RuntimeError):
    """A chat request that failed for good: `status` is the HTTP status (None when no answer came), the message the
    server's own words."""

    def __init__(self, message: str, status: int | None = None, refused: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self._refused = refused

    @property
    def refused(self) -> bool:
        """No request of the run can succeed: a wrong key (401, 403), address or model (404), or a base URL that is
        not one (no http:// or https://)."""
        return self._refused or self.status in REFUSED_STATUS

    @property
    def unreachable(self) -> bool:
        """No answer came, or only passing errors, every time it was tried."""
        return self.status is None or self.status in RETRY_STATUS

    @property
    def context_overflow(self) -> bool:
        """The request does not fit the model's context (the conversation has outgrown it)."""
        return self.status == 400 and bool(_OVERFLOW.search(str(self)))


def api_root(base_url: str) -> str:
    """``http://host:port/v1`` for a base URL given with or without its ``/v1``."""
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class ChatClient:
    """Chat completions from one endpoint, from any number of threads.

    Args:
        base_url: the endpoint, with or without ``/v1``.
        model: the model to ask for; None: the one the endpoint serves.
        api_key: sent as a bearer token when given.
        timeout_s: the longest one request may wait on the server at a time (to connect, for each read of the
            answer; a server that answers at all answers within it: the answer comes whole, not streamed).
        retries: further tries of a request that failed for a passing reason.
        backoff_s: the wait before the first retry, doubled before each next one.
    """

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = 600.0, retries: int = 4, backoff_s: float = 1.0) -> None:
        if not isinstance(base_url, str):  # judge_url=5: a clear TypeError, not an AttributeError
            raise ValueError(f"the endpoint's base URL is text (http://host:port/v1), not {base_url!r}")
        self.root = api_root(base_url)
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self._api_key, self._model = api_key, model
        self._lock = threading.RLock()
        self._http: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (an env that holds a judge may be): the connection pool and the lock are made anew."""
        return {**self.__dict__, "_lock": None, "_http": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.RLock())

    @property
    def model(self) -> str:
        """The model asked for: the one given, or the first the endpoint lists (asked once)."""
        with self._lock:
            if self._model is None:
                answer = self._request("GET", "/models")
                listed = answer.get("data")
                if not isinstance(listed, list):  # anything else is an answer we cannot read
                    listed = []
                names = [m["id"] for m in listed if isinstance(m, dict) and m.get("id")]
                if not names:
                    raise ChatError(f"{self.root}/models lists no model as an OpenAI-compatible API does (data: "
                                    f"[{{\"id\": …}}]; it answered {str(answer)[:200]}): name one", refused=True)
                self._model = str(names[0])
            return self._model

    def chat(self, messages: list[dict[str, str]], **params: Any) -> dict[str, Any]:
        """The endpoint's answer to ``messages`` (the whole response: ``choices``, ``usage``, …); `params` are the
        request's other fields (``max_tokens``, ``temperature``, ``stop``, a server's own extensions)."""
        response = self._request("POST", "/chat/completions", {"model": self.model, "messages": messages, **params})
        choices = response.get("choices")
        if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)
                and isinstance(choices[0].get("message"), dict)):  # choices must be a list of messages
            # it answered (no "is it up?"), but not as an OpenAI-compatible API does: no request of the run would do
            raise ChatError(f"{self.root}/chat/completions answered without a message: {str(response)[:300]}",
                            refused=True)
        return response

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import httpx

        url = self.root + path
        with self._lock:  # one pool, whichever threads ask first (re-entrant: `model` holds it while it asks)
            if self._http is None:
                headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
                self._http = httpx.Client(timeout=self.timeout_s, headers=headers)
        for attempt in range(self.retries + 1):
            wait = self.backoff_s * 2 ** attempt
            try:
                reply = self._http.request(method, url, json=body)
            except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:  # no try can get past it: at once
                raise ChatError(f"{url}: {exc} (the base URL is {self.root[:-3] or '?'!r})", refused=True) from None
            except httpx.HTTPError as exc:  # refused, dropped, timed out
                error = ChatError(f"{url}: {type(exc).__name__}: {exc}")
            else:
                if reply.status_code < 400:
                    try:
                        answer = reply.json()
                    except ValueError:
                        answer = None
                    if isinstance(answer, dict):
                        return answer
                    raise ChatError(f"{url} answered {reply.status_code} with something other than a JSON object "
                                    f"(is the base URL an OpenAI-compatible API?): {_server_message(reply)[:300]!r}",
                                    reply.status_code, refused=True)
                error = ChatError(f"{url} answered {reply.status_code}: {_server_message(reply)}", reply.status_code)
                if reply.status_code not in RETRY_STATUS:
                    raise error
                after = reply.headers.get("retry-after", "")
                if after.replace(".", "", 1).isdigit():
                    wait = max(wait, min(float(after), 60.0))
            if attempt == self.retries:
                raise error
            time.sleep(wait)
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Closes the connection pool; a later request opens another."""
        with self._lock:
            http, self._http = self._http, None
        if http is not None:
            http.close()


def content_text(content: Any) -> str:
    """A message's ``content`` as text: a string, a list of content parts (their text: ``[{"type": "text", "text":
    …}]``, as some servers answer and OpenAI's API takes), or null (a turn of tool calls only, a reasoning model
    that ran out of tokens) as nothing."""
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def _server_message(reply: Any) -> str:
    """The error's own words: OpenAI's ``{"error": {"message": …}}``, FastAPI's ``{"detail": …}``, or the text."""
    try:
        body = reply.json()
    except ValueError:
        text = reply.text
        if re.search(r"<(!doctype|html|body|head|title)\b", text[:2000], re.I):  # a web page: its words, not its tags
            text = re.sub(r"<(script|style)\b.*?</\1\s*>|<[^>]*>", " ", text, flags=re.I | re.S)
            text = html.unescape(text)
        return " ".join(text.split())[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
        if body.get("message") or body.get("detail"):
            return str(body.get("message") or body.get("detail"))[:500]
    return str(body)[:500]
