"""The ``<browse>`` tool: fetch a page, extract its main text, optionally condense it with a model.

Fetching uses httpx with a per-page deadline, a size cap (on the page as inflated, a bounded piece at a time: a
decompression bomb stops at it, `_decoded`), a redirect limit (loops are detected) and a content-type check (text of any
kind: `is_text_type`); the main text of HTML and XML is extracted with trafilatura (navigation, ads and scripts
dropped), other text (plain text, Markdown, JSON) is read as it is, and either is truncated with a visible note.
Extraction is bounded: trafilatura runs in a killable worker process (`arpo_env.scoring.worker_pool`), since its time
grows faster than the page (a 1.3 MB page of short paragraphs takes it 18 s); past ``extract_timeout_s`` the page's
plain text (lxml, linear time) stands in, and the model is told so. A page that overran is remembered (by its content,
in this process), so another visit reads its plain text at once instead of waiting out the bound again. An offline page
store (``{url: html file}``) serves pages without network; live fetching can be switched off. Results are cached in the
shared SQLite tool cache, a plain-text stand-in excepted: the cache outlives the run, and an overrun can be the
machine's load of the moment. Pages read with ``private_hosts`` are cached under keys of their own, and so are a page
store's copies. Every failure is an observation (``browse failed: …``).

The URL is the model's, so by default only public addresses are fetched: a host that resolves to a loopback, private,
link-local or otherwise non-global address (``127.0.0.1:8000``, a vLLM server; ``169.254.169.254``, a cloud's
metadata service with its credentials; an intranet) is refused, at every redirect too. ``private_hosts=True`` allows
them (a local test server, an intranet wiki). The connection is made to the very addresses checked, so a name whose
address changes between a check and the connection (DNS rebinding) gets nowhere; a name this machine cannot resolve
and a proxy (``HTTPS_PROXY``) then does is not checked: for adversarial models, fetch through a proxy that enforces
the rule itself.
"""

from __future__ import annotations

import codecs
import hashlib
import inspect
import ipaddress
import json
import os
import re
import socket
import threading
import time
import warnings
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urljoin, urlsplit

from arpo_env.tools.cache import ToolCache, resolve_cache
from arpo_env.tools.protocol import (
    MAX_SECONDS,
    PATH_TYPES,
    StatelessTool,
    ToolOutput,
    check_options,
    limit_problem,
    type_problem,
)

MARKUP_TYPES = {"text/html", "application/xhtml+xml", "application/xml", "text/xml"}
"""Content types read for their main text (`extract_text`); other text (`is_text_type`) is read as it is."""
EXTRACT_TIMEOUT_S = 5.0
"""The default bound on extracting a page's main text (`extract_text`, ``BrowseTool(extract_timeout_s=…)``)."""
USER_AGENT = "Mozilla/5.0 (compatible; arpo-browse/0.1; +https://github.com/arpo)"


class BrowseError(RuntimeError):
    """A page that could not be read; the message is shown to the model."""


class PageStore:
    """Offline pages: a folder with ``index.json`` (``{url: file name}``), or a dict of url to html path."""

    def __init__(self, source: str | os.PathLike | dict[str, str]) -> None:
        if isinstance(source, dict):
            self.root, self.index = Path("."), dict(source)
        else:
            self.root = Path(source)
            index = self.root / "index.json"
            try:
                with open(index, encoding="utf-8") as f:
                    self.index = json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"page store index {index} is not JSON in UTF-8 ({exc})") from None
            if not isinstance(self.index, dict):
                raise ValueError(f"page store index {index} is a JSON {type(self.index).__name__}, not an object of "
                                 "url → file name")
        bad = [(url, name) for url, name in self.index.items() if not (isinstance(name, str) and name)]
        if bad:  # said once here, not at every page of every episode
            where = "page_store" if isinstance(source, dict) else f"page store index {self.root / 'index.json'}"
            listed = ", ".join(f"{url!r}: {name!r}"[:200] for url, name in bad[:5])
            raise ValueError(f"{where} holds {len(bad)} {'entry that is' if len(bad) == 1 else 'entries that are'} not "
                             f"url → file name: {listed}" + (", …" if len(bad) > 5 else ""))

    def path(self, url: str) -> Path | None:
        """The file stored for `url`: under the URL as written, or without its fragment (``#History``, a place in
        the page, which a server never sees), with or without a slash at the end. None: not in the store."""
        page = url.split("#", 1)[0]
        name = next((self.index[u] for u in (url, page, page.rstrip("/"), page.rstrip("/") + "/") if u in self.index),
                    None)
        return None if name is None else self.root / name

    def version(self, url: str) -> tuple[Any, ...] | None:
        """What tells this store's copy of `url` from the live page and from another copy (the file, its size and
        time), for the tool cache's key; None when the store has no copy."""
        path = self.path(url)
        if path is None:
            return None
        try:
            stat = path.stat()
        except OSError:  # missing: `get` says so, and a failure is not cached
            return ("page store", str(path))
        return ("page store", str(path.resolve()), stat.st_size, stat.st_mtime_ns)

    def get(self, url: str) -> str | None:
        """The page stored for `url` (see `path`), or None."""
        path = self.path(url)
        if path is None:
            return None
        try:
            return decode_page(path.read_bytes())
        except OSError:  # its message holds the host's path, which is not the model's to read
            raise BrowseError("the page store lists this page but has no file for it") from None


class Summarizer:
    """Condense a page with a chat model behind an OpenAI-compatible endpoint (vLLM, SGLang, a hosted API), through
    the client the judge uses (`arpo_env.scoring.chat_client.ChatClient`): the base URL with or without its ``/v1``, a
    request that fails for a passing reason tried `retries` more times. A summary that fails raises `ChatError`;
    `BrowseTool` then gives the page's own text, and says so once. Once the endpoint could not be reached (or
    refused), it is not asked again for `down_s` seconds, so that a summarizer that is down costs its retries once,
    not at every page (as the judge). `model`: the model's name; None (the default) asks the endpoint which model it
    serves, once, as the judge does."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, max_tokens: int = 512,
                 timeout_s: float = 60.0, retries: int = 2, down_s: float = 30.0) -> None:
        from arpo_env.scoring.chat_client import ChatClient

        # checked here: a bad one would fail every page's summary, silently
        problems = [type_problem("model", model, "a model's name", str)
                    or (None if model or model is None else "model is a name, or None to ask the endpoint"),
                    type_problem("api_key", api_key, "text", str),
                    limit_problem("max_tokens", max_tokens, 1),
                    limit_problem("timeout_s", timeout_s, None, MAX_SECONDS), limit_problem("retries", retries, 0, 100),
                    limit_problem("down_s", down_s, 0.0, MAX_SECONDS)]
        if any(problems):
            raise ValueError("; ".join(p for p in problems if p))
        self.max_tokens, self.down_s, self._down_until = max_tokens, down_s, 0.0
        self.client = ChatClient(base_url, model, api_key or os.environ.get("OPENAI_API_KEY", "EMPTY"), timeout_s,
                                 retries)

    def cache_id(self) -> str | None:
        """What tells this summarizer's summaries from another's, for the tool cache's key: the endpoint, the model
        and `max_tokens`; None while the endpoint cannot say which model it serves (nothing is cached then: the
        summary fails, and the page's own text is given)."""
        from arpo_env.scoring.chat_client import ChatError

        try:
            return f"{self.client.root}:{self._asked(lambda: self.client.model)}:{self.max_tokens}"
        except ChatError:
            return None

    def _asked(self, ask: Callable[[], Any]) -> Any:
        """`ask`'s answer from the endpoint; ChatError without asking within `down_s` of its being unreachable."""
        from arpo_env.scoring.chat_client import ChatError

        if time.monotonic() < self._down_until:
            raise ChatError(f"{self.client.root} could not be reached a moment ago; asked again after "
                            f"{self.down_s:g} s")
        try:
            return ask()
        except ChatError as exc:
            if exc.unreachable or exc.refused:
                self._down_until = time.monotonic() + self.down_s
            raise

    def __call__(self, text: str) -> str:
        from arpo_env.scoring.chat_client import ChatError, content_text

        prompt = ("Condense this web page to the facts it states, keeping names, numbers and dates exactly. "
                  "Write plain text, at most a few paragraphs.\n\n" + text)
        reply = self._asked(lambda: self.client.chat([{"role": "user", "content": prompt}], max_tokens=self.max_tokens,
                                                     temperature=0.0))
        summary = content_text(reply["choices"][0]["message"].get("content")).strip()
        if not summary:
            raise ChatError(f"{self.client.root}/chat/completions answered with no text")
        return summary


def is_text_type(ctype: str) -> bool:
    """Whether a page of content type `ctype` (lower case, without parameters) is text a model can read: any
    ``text/*`` (plain text, Markdown, CSV, source code), JSON and XML (``application/json``, ``application/…+json``,
    ``application/…+xml``) and JavaScript. An API's JSON and a raw Markdown file were refused as "not a text page"."""
    kind, _, sub = ctype.partition("/")
    return kind == "text" or (kind == "application" and (sub in ("json", "xml", "xhtml+xml", "javascript", "x-ndjson")
                                                         or sub.endswith(("+json", "+xml"))))


def is_markup(ctype: str, text: str) -> bool:
    """Whether a page is read for its main text: its content type is HTML or XML (`MARKUP_TYPES`, ``…+xml``), or it
    has none (a page store's file, a server that names no type) and the text starts as markup does (``<``, after
    white space). Other text is the model's as it is: a ``<`` in a plain-text page (``if a < b:`` in source code,
    ``<b>`` in Markdown) made it HTML, of which trafilatura found no text."""
    if ctype:
        return ctype in MARKUP_TYPES or ctype.endswith("+xml")
    return text[:4096].lstrip("\ufeff \t\r\n").startswith("<")


def extract_text(html: str, url: str | None = None, timeout_s: float = EXTRACT_TIMEOUT_S) -> tuple[str, str]:
    """A page's text and how it was read: ``("…", "main")`` — its main text (trafilatura, in a worker process
    bounded by `timeout_s`) — or ``("…", "plain")`` — all its text (`plain_text`), when trafilatura overran, ran out
    of memory or crashed, or when every page worker stayed busy for `timeout_s` (other pages' extractions: the wait
    counts against the same bound). Plain-text pages pass through as ``"main"``. A page (its HTML and URL) on which
    trafilatura gave up after running (nearly) `timeout_s` or longer is read as plain text at once, without trying
    again."""
    if "<" not in html[:2000]:
        return html.strip(), "main"
    from arpo_env.scoring.worker_pool import BoundExceeded, NoWorkerFree, pool

    page = hashlib.sha256(f"{url}\0{html}".encode("utf-8", "surrogatepass")).hexdigest()
    with _OVERRAN_LOCK:
        if _OVERRAN.get(page, -1.0) >= 0.9 * timeout_s:  # it ran (nearly) as long as it would now, in vain
            _OVERRAN.move_to_end(page)
            return plain_text(html), "plain"
    try:
        return pool("page").call(f"{__name__}:main_text", html, url, timeout_s=timeout_s, wait_s=timeout_s), "main"
    except NoWorkerFree:  # the page itself may be fine: not remembered
        return plain_text(html), "plain"
    except BoundExceeded as exc:  # remembered with the time it had (the bound, less the wait for a worker)
        with _OVERRAN_LOCK:
            _OVERRAN[page] = max(exc.bound_s or timeout_s, _OVERRAN.get(page, 0.0))
            _OVERRAN.move_to_end(page)
            while len(_OVERRAN) > _OVERRAN_MAX:
                _OVERRAN.popitem(last=False)
        return plain_text(html), "plain"


_OVERRAN: OrderedDict[str, float] = OrderedDict()
"""Pages trafilatura gave up on, by the hash of their URL and HTML: the longest it ran on one in vain."""
_OVERRAN_MAX = 1024
_OVERRAN_LOCK = threading.Lock()
_WARN_LOCK = threading.Lock()


def main_text(html: str, url: str | None = None) -> str:
    """The main text of a page (trafilatura; navigation, ads and scripts dropped), unbounded: what `extract_text`
    runs in a page worker."""
    import trafilatura

    text = trafilatura.extract(html, url=url, include_comments=False, include_tables=True, favor_precision=True)
    if not text:
        text = trafilatura.extract(html, url=url, include_comments=False, favor_recall=True) or ""
    return text.strip()


_XML_DECLARATION = re.compile(r"^\ufeff?\s*<\?xml[^>]{0,200}\?>")


def plain_text(html: str) -> str:
    """All the text of a page, scripts and styles dropped, in time linear in its size (lxml): the stand-in for its
    main text when extraction overruns."""
    import lxml.html

    try:  # without an XML declaration, which lxml refuses in a str (an XHTML page would read as empty)
        root = lxml.html.document_fromstring(_XML_DECLARATION.sub("", html, count=1))
    except (ValueError, lxml.etree.LxmlError):  # empty, or nothing lxml can make a document of
        return ""
    for node in root.xpath("//script|//style|//noscript|//template|//head"):
        node.drop_tree()
    lines = (" ".join(line.split()) for line in "\n".join(root.itertext()).splitlines())
    return "\n".join(line for line in lines if line)


_BARE_HOST = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+\.[A-Za-z]{2,}(?::\d+)?(?:[/?#]|$)"  # en.wikipedia.org
                        r"|[A-Za-z0-9-]+\.[A-Za-z]{2,}(?::\d+)?[/?#]")  # arxiv.org/abs/…, not a file name: data.csv


def written_url(query: str) -> str:
    """The URL a ``<browse>`` call means: without the quotes, angle brackets or backticks a model puts around it
    (``"https://…"``, ``<https://…>``), and with ``https://`` before a bare host (``en.wikipedia.org/wiki/Vasa``,
    ``arxiv.org/abs/2507.19849``), as a browser's address bar reads it; each was "not an http(s) URL". A name that
    may be a file's (``data.csv``, ``x.org``) stays as written."""
    i, j = 0, len(query)
    while True:  # indices, not slices: linear in a hostile query
        while i < j and query[i].isspace():
            i += 1
        while j > i and query[j - 1].isspace():
            j -= 1
        if j - i < 2 or (query[i], query[j - 1]) not in (('"', '"'), ("'", "'"), ("<", ">"), ("`", "`")):
            break
        i, j = i + 1, j - 1
    url = query[i:j]
    return "https://" + url if _BARE_HOST.match(url) else url


class BrowseTool(StatelessTool):
    """The ``<browse>`` tool. Stateless: `fork` returns itself."""

    name = "browse"
    tag = "browse"

    def __init__(self, page_store: PageStore | None = None, live: bool = True, timeout_s: float = 10.0,
                 max_bytes: int = 5_000_000, max_redirects: int = 5, max_chars: int = 6000,
                 summarizer: Summarizer | None = None, cache: ToolCache | None = None,
                 extract_timeout_s: float = EXTRACT_TIMEOUT_S, private_hosts: bool = False) -> None:
        self.page_store, self.live, self.timeout_s = page_store, live, timeout_s
        self.private_hosts = private_hosts
        self.extract_timeout_s = extract_timeout_s
        self.max_bytes, self.max_redirects, self.max_chars = max_bytes, max_redirects, max_chars
        self.summarizer, self.cache = summarizer, cache
        self._summarizer_warned = False

    # The tool protocol ----------------------------------------------------------------------------------------------
    def call(self, query: str) -> ToolOutput:
        start = time.perf_counter()
        url = written_url(query)
        extra: dict[str, Any] = {}
        # Pages read with private_hosts have keys of their own: a run that refuses local and private addresses must
        # not be served an intranet page (or a local server's) that another run, which allowed them, cached. So have
        # a page store's copies: the cache is shared by every run on the machine, live ones too.
        stored = self.page_store.version(url) if self.page_store else None
        summarized_by = self.summarizer.cache_id() if self.summarizer else None
        # a summarizer that cannot say which model it asks has no key: the cache is neither read nor written (the
        # page cached without a summarizer must not be served as its summary)
        cache = self.cache if self.summarizer is None or summarized_by is not None else None
        key = ToolCache.key("browse", url, self.max_chars, summarized_by,
                            *(("private hosts",) if self.private_hosts else ()), *(stored or ()))
        text = cache.get(key) if cache else None
        extra["cache"] = ("hit" if text is not None else "miss") if cache else "off"
        if text is None:
            try:
                text, how = self._read(url)
            except BrowseError as exc:
                return self._failed(str(exc), start, extra)
            except Exception as exc:  # noqa: BLE001 - whatever breaks, the model reads why
                return self._failed(f"{type(exc).__name__}: {exc}", start, extra)
            extra["extraction"] = how
            if self.summarizer is not None:
                text = self._condensed(text, extra)
            if len(text) > self.max_chars:
                text = text[: self.max_chars] + f"\n[page truncated: {len(text) - self.max_chars:,} more characters]"
            # a stand-in is not stored (the next run tries the main text again), nor a summary that failed
            if cache and how == "main" and "summarizer_error" not in extra:
                cache.put(key, text)
        if self.cache:
            extra.update(self.cache.stats())
        return ToolOutput(text, latency_s=time.perf_counter() - start, extra=extra)

    def _failed(self, message: str, start: float, extra: dict[str, Any]) -> ToolOutput:
        if self.cache:
            extra.update(self.cache.stats())
        return ToolOutput(f"browse failed: {message}", failed=True, error=message,
                          latency_s=time.perf_counter() - start, extra=extra)

    def _read(self, url: str) -> tuple[str, str]:
        """The page's text as the model reads it, and how it was extracted (`extract_text`'s second value)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise BrowseError(f"{url[:200]!r} is not an http(s) URL")
        html, ctype = (self.page_store.get(url) if self.page_store else None), ""
        if html is None:
            if not self.live:
                raise BrowseError("this page is not in the offline page store and live browsing is off")
            html, ctype = self.fetch_typed(url)
        if is_markup(ctype, html):
            text, how = extract_text(html, url, self.extract_timeout_s)
        else:  # plain text, Markdown, JSON: the model reads it as it is
            text, how = html.strip(), "main"
        if not text:
            raise BrowseError("the page has no readable text")
        if how == "plain":
            text = (f"[the page's main text could not be extracted within {self.extract_timeout_s:g} s; "
                    f"this is all of its text]\n{text}")
        return text, how

    def _condensed(self, text: str, extra: dict[str, Any]) -> str:
        """The summarizer's summary of `text`; the text itself when the summary fails (the page still helps), with
        the error in `extra` and, the first time, a warning: a summarizer that could not be reached (down, a wrong
        address or model name) left every page unsummarised, silently."""
        try:
            return self.summarizer(text[: 4 * self.max_chars])  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - ChatError, or a summarizer of the caller's own
            extra["summarizer_error"] = error = f"{type(exc).__name__}: {exc}"
            with _WARN_LOCK:
                warn, self._summarizer_warned = not self._summarizer_warned, True
            if warn:
                where = getattr(getattr(self.summarizer, "client", None), "root", None) or repr(self.summarizer)
                warnings.warn(f"browse: the summarizer at {where} failed ({error[:500]}); pages are given as their "
                              "own text until it answers (warned once)", RuntimeWarning, stacklevel=4)
            return text

    def fetch(self, url: str) -> str:
        """GET `url` within the deadline (`timeout_s` for the whole fetch: its redirects, every connect and read),
        size cap and redirect limit; return its text or raise `BrowseError`."""
        return self.fetch_typed(url)[0]

    def fetch_typed(self, url: str) -> tuple[str, str]:
        """`fetch`, and the page's content type (lower case, without parameters; ``""`` when the server names none)."""
        import httpx

        deadline = time.monotonic() + self.timeout_s
        seen: set[str] = set()
        headers = {"User-Agent": USER_AGENT, "Accept": "text/html,text/plain;q=0.9,*/*;q=0.1",
                   "Accept-Encoding": ", ".join(_CODINGS)}  # what `_decoded` undoes, whatever httpx could
        with httpx.Client(timeout=httpx.Timeout(self.timeout_s), follow_redirects=False, headers=headers,
                          transport=_transport(deadline, public=not self.private_hosts)) as client:
            for _ in range(self.max_redirects + 1):
                if url in seen:
                    raise BrowseError(f"redirect loop at {url}")
                seen.add(url)
                self._check_address(url)
                try:
                    with client.stream("GET", url) as response:
                        if response.is_redirect:
                            url = urljoin(url, response.headers.get("location", ""))
                            continue
                        return self._body(response, deadline)
                except httpx.TimeoutException as exc:
                    raise BrowseError(f"timed out after {self.timeout_s:g} s") from exc
                except httpx.HTTPError as exc:
                    raise BrowseError(f"{type(exc).__name__}: {exc}") from exc
        raise BrowseError(f"more than {self.max_redirects} redirects")

    def _check_address(self, url: str) -> None:
        """Raise `BrowseError` unless every address `url`'s host resolves to is public (or `private_hosts`)."""
        if self.private_hosts:
            return
        parts = urlsplit(url)
        try:
            host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:  # a port that is not a number
            raise BrowseError(f"{url[:200]!r} is not a valid URL: {exc}") from exc
        if not host:
            raise BrowseError(f"{url[:200]!r} has no host")
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):  # not here: httpx fails on it too, or a proxy resolves it
            return
        for info in infos:
            if not _is_public(info[4][0]):
                raise BrowseError(_not_public(host, info[4][0]))

    def _body(self, response: Any, deadline: float) -> tuple[str, str]:
        if response.status_code >= 400:
            raise BrowseError(f"HTTP {response.status_code} {response.reason_phrase}")
        ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype and not is_text_type(ctype):
            raise BrowseError(f"not a text page (content type {ctype})")
        if int(response.headers.get("content-length") or 0) > self.max_bytes:
            raise BrowseError(f"the page is larger than {self.max_bytes / 1e6:g} MB")
        body = bytearray()
        for chunk in _decoded(response):
            body += chunk
            if len(body) > self.max_bytes:
                raise BrowseError(f"the page is larger than {self.max_bytes / 1e6:g} MB")
            if time.monotonic() > deadline:
                raise BrowseError(f"timed out after {self.timeout_s:g} s")
        if not ctype and b"\x00" in body[:4096]:
            raise BrowseError("not a text page (binary content)")
        return decode_page(bytes(body), response.charset_encoding), ctype


_CODINGS = ("gzip", "deflate")
"""The content codings `_decoded` undoes (``x-gzip`` is ``gzip``)."""
_PIECE = 1 << 16
"""The most bytes a page's decoding makes at once (`_decoded`)."""


def _decoded(response: Any) -> Iterator[bytes]:
    """The body of an httpx response as it was before its ``Content-Encoding``, in pieces of at most `_PIECE` bytes.

    httpx undoes a coding a network chunk at a time, and whole: 64 KB of gzip can be 64 MB of page, and each coding
    multiplies again, so a page of 1.8 KB gzipped twice (``Content-Encoding: gzip, gzip``) was inflated to 1 GB in the
    env's process, 2.1 GB at its peak and 10 s, before the size cap could say no, and a few KB more would have taken
    the trainer's memory. Here each coding makes at most `_PIECE` bytes at a time from the one before, so the cap
    (and the deadline) stop the page after a few pieces. A coding other than gzip and deflate (`_CODINGS`) is a
    `BrowseError`: the request asks for none other."""
    codings = [c.strip().lower() for c in response.headers.get("content-encoding", "").split(",")]
    stream: Iterator[bytes] = response.iter_raw(_PIECE)
    for coding in reversed([c for c in codings if c and c != "identity"]):
        coding = "gzip" if coding == "x-gzip" else coding
        if coding not in _CODINGS:
            raise BrowseError(f"the page's content encoding {coding[:40]!r} is not supported")
        stream = _inflated(stream, coding)
    return stream


def _inflated(chunks: Iterator[bytes], coding: str) -> Iterator[bytes]:
    """`chunks` of a body in `coding` (gzip or deflate), inflated a piece of at most `_PIECE` bytes at a time.

    A deflate body is zlib's stream or, where its first two bytes are no zlib header, raw deflate, as browsers read
    it. A gzip body may be several members one after another (RFC 1952; what appending to a ``.gz`` file makes), read
    in turn (httpx read the first alone); what follows the last and does not begin as a member does (padding) is not
    read. Each stream is told by its first two bytes, whatever the sizes of the chunks they come in."""
    inflater: Any = None
    pending = b""
    for chunk in chunks:
        data, pending = pending + chunk, b""
        while data:
            if inflater is None or inflater.eof:  # a stream begins here
                if inflater is not None and coding == "deflate":  # one stream: what follows it is not read
                    return
                if len(data) < 2:
                    pending = data
                    break
                if coding == "gzip" and data[:2] != b"\x1f\x8b":
                    if inflater is None:
                        raise BrowseError("the page's gzip body is corrupt (it does not begin as gzip does)")
                    return
                zlib_header = (data[0] & 0x0F) == 8 and int.from_bytes(data[:2], "big") % 31 == 0
                inflater = zlib.decompressobj(zlib.MAX_WBITS | 16 if coding == "gzip"
                                              else zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)
            try:
                piece = inflater.decompress(data, _PIECE)
            except zlib.error as exc:
                raise BrowseError(f"the page's {coding} body is corrupt ({exc})") from exc
            data = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
            if piece:
                yield piece
        if inflater is not None and inflater.eof and coding == "deflate":
            return
    if inflater is None and pending:
        raise BrowseError(f"the page's {coding} body is corrupt (one byte)")
    tail = inflater.flush() if inflater is not None else b""  # all input went in: at most a few bytes are left
    if tail:
        yield tail


_META_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]{1,40})""", re.I)


_NOT_PAGE_CODECS = {"punycode", "idna", "undefined", "unicode-escape", "raw-unicode-escape"}
"""Python's text codecs that a ``charset`` label may name but no page is written in (`decode_page`)."""


def decode_page(body: bytes, charset: str | None = None) -> str:
    """A page's bytes as text: in the charset its Content-Type header gives, else the one a ``<meta charset>`` (or
    ``http-equiv`` Content-Type) in its first 4 KB declares, else UTF-8 when it is valid UTF-8, else Windows-1252
    (what browsers assume); a byte-order mark comes first of all. A Chinese page in GBK that said so only in its HTML
    was read as UTF-8: all U+FFFD. A label that names one of Python's codecs that is no page's charset
    (`_NOT_PAGE_CODECS`, and those that are not text encodings, ``hex``, ``zlib``) is passed over, as browsers pass
    over a label they do not know: ``charset=punycode`` held the env for minutes (Python's punycode decoder takes
    time with the square of its input: 0.4 s for 40 KB), and ``hex`` or ``idna`` failed the page."""
    boms = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
    for bom, codec in boms:
        if body.startswith(bom):
            return body.decode(codec, errors="replace")
    for name in (charset, *(m.decode("ascii") for m in _META_CHARSET.findall(body[:4096])[:1])):
        if not name:
            continue
        try:
            info = codecs.lookup(name)
        except LookupError:  # a name Python does not know: the next clue
            continue
        codec = info.name
        if not getattr(info, "_is_text_encoding", True) or codec in _NOT_PAGE_CODECS:  # no page's charset either
            continue
        if codec in ("gb2312", "gbk"):
            codec = "gb18030"  # a superset: pages labelled gb2312 hold GBK characters, as browsers know
        if codec in ("latin-1", "iso8859-1", "ascii"):
            codec = "cp1252"  # browsers read these labels as Windows-1252 (the WHATWG encoding standard)
        return body.decode(codec, errors="replace")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body.decode("cp1252", errors="replace")


_EMBEDS_IPV4 = (ipaddress.ip_network("::/96"), ipaddress.ip_network("64:ff9b::/96"))
"""IPv6 addresses whose last 32 bits are an IPv4 address: IPv4-compatible (``::127.0.0.1``) and NAT64's prefix."""


def _is_public(address: object) -> bool:
    """Whether an address from getaddrinfo is a global unicast one. An IPv6 address that carries an IPv4 one is read
    as that: IPv4-mapped (``::ffff:127.0.0.1``), IPv4-compatible (``::127.0.0.1``), NAT64 (``64:ff9b::7f00:1``) and
    6to4 (``2002:7f00:1::``), which Python calls global whatever IPv4 address they carry."""
    ip = ipaddress.ip_address(str(address).split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ip.ipv4_mapped or ip.sixtofour or next(
            (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) for net in _EMBEDS_IPV4 if ip in net), ip)
    return ip.is_global and not ip.is_multicast


def _not_public(host: str, address: object) -> str:
    return f"{host[:200]} is not a public address ({address}); browsing local and private networks is off"


def _transport(deadline: float, public: bool) -> Any:
    """An httpx transport whose every connect, read and write ends by `deadline` (``time.monotonic()``): httpx's
    timeouts bound each socket operation, so a server that trickles its headers a byte at a time held a fetch for as
    long as it liked. With `public`, it connects only to public addresses: it resolves the host itself and connects to
    the addresses it checked, so a name that resolves to a public address for `BrowseTool._check_address` and to a
    private one a moment later (DNS rebinding) gets nowhere. TLS still names the host (SNI, the certificate).
    Requests through a proxy (``HTTPS_PROXY``) go through httpx's own transport: the proxy resolves those, and only
    the body's reading is bounded by the deadline."""
    import httpcore
    import httpx

    def left(timeout: float | None, what: type[Exception]) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise what("the page's deadline passed")
        return remaining if timeout is None else min(timeout, remaining)

    class Bounded(httpcore.NetworkStream):
        def __init__(self, stream: Any) -> None:
            self.stream = stream

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self.stream.read(max_bytes, left(timeout, httpcore.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self.stream.write(buffer, left(timeout, httpcore.WriteTimeout))

        def close(self) -> None:
            self.stream.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                      timeout: float | None = None) -> Any:
            return Bounded(self.stream.start_tls(ssl_context, server_hostname, left(timeout, httpcore.ConnectTimeout)))

        def get_extra_info(self, info: str) -> Any:
            return self.stream.get_extra_info(info)

    class Backend(httpcore.SyncBackend):
        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None) -> Any:
            if not public:
                return Bounded(super().connect_tcp(host, port, left(timeout, httpcore.ConnectTimeout), local_address,
                                                   socket_options))
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except (socket.gaierror, UnicodeError) as exc:
                raise httpcore.ConnectError(f"cannot resolve {host[:200]}: {exc}") from exc
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
            for address in addresses:
                if not _is_public(address):
                    raise httpcore.ConnectError(_not_public(host, address))
            error: Exception = httpcore.ConnectError(f"no address for {host[:200]}")
            for address in addresses:
                try:
                    return Bounded(super().connect_tcp(address, port, left(timeout, httpcore.ConnectTimeout),
                                                       local_address, socket_options))
                except httpcore.ConnectError as exc:  # the next address, as a resolver-driven connect would
                    error = exc
            raise error

    transport = httpx.HTTPTransport()
    pool = getattr(transport, "_pool", None)  # httpx does not take a network backend: its pool's is replaced
    if not isinstance(getattr(pool, "_network_backend", None), httpcore.NetworkBackend):
        raise RuntimeError(f"httpx {httpx.__version__} / httpcore {httpcore.__version__}: the transport's connection "
                           "pool has no network backend to replace; pin httpx<1")
    pool._network_backend = Backend()  # type: ignore[union-attr]
    return transport


def browse_tool_factory(options: dict[str, Any] | None = None) -> Callable[[], BrowseTool]:
    """A factory of ``<browse>`` tools sharing one configuration and cache.

    `options` (the env's ``browse_options``): ``page_store`` (a folder with index.json, or a dict), ``live`` (True),
    ``timeout_s`` (the fetch's deadline), ``extract_timeout_s`` (the main text's, 5 s), ``max_bytes``,
    ``max_redirects``, ``max_chars``, ``summarizer`` (``{"base_url", "model"}``; without ``"model"``, the one the
    endpoint serves), ``cache`` (a path, True for the default file, False for none; default on), ``private_hosts``
    (False: only public addresses are fetched).
    """
    options = dict(options or {})
    tool_arguments = [name for name in inspect.signature(BrowseTool).parameters if name not in ("page_store", "cache",
                                                                                                  "summarizer")]
    check_options("browse_options", options, ["page_store", "summarizer", "cache", *tool_arguments])
    # checked here: a timeout of text or below 0 would fail every page, and a live of "no" is not true
    problems = [limit_problem("timeout_s", options.get("timeout_s", 10.0), None, MAX_SECONDS),
                limit_problem("extract_timeout_s", options.get("extract_timeout_s", EXTRACT_TIMEOUT_S), None,
                              MAX_SECONDS),
                limit_problem("max_bytes", options.get("max_bytes", 1), 1),
                limit_problem("max_redirects", options.get("max_redirects", 0), 0),
                limit_problem("max_chars", options.get("max_chars", 1), 1),
                type_problem("live", options.get("live"), "true or false", bool),
                type_problem("private_hosts", options.get("private_hosts"), "true or false", bool),
                type_problem("cache", options.get("cache"), "a path, or true or false", bool, ToolCache, *PATH_TYPES),
                type_problem("page_store", options.get("page_store"), "a folder, or a dict of url to file", dict,
                             *PATH_TYPES),
                type_problem("summarizer", options.get("summarizer"), 'a dict {"base_url", "model"}', dict)]
    if any(problems):
        raise ValueError("browse_options: " + "; ".join(p for p in problems if p))
    store = options.pop("page_store", None)
    summarizer = options.pop("summarizer", None)
    cache = resolve_cache(options.pop("cache", True))
    try:
        summarizer = Summarizer(**summarizer) if summarizer else None
    except (TypeError, ValueError) as exc:  # a key it does not take, none of its two, a value of the wrong type
        raise ValueError(f"browse_options: summarizer: {exc}") from None
    tool = BrowseTool(PageStore(store) if store is not None else None, summarizer=summarizer, cache=cache, **options)
    return lambda: tool
