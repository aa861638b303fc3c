"""The ``<search>`` tool and its backends: local BM25 (default, offline), live DuckDuckGo (``ddgs``), recorded replay.

Results come back as numbered entries (title, snippet, url when known). Every failure — a timeout, a rate limit,
an empty result, a missing recording — is an observation (``search failed: …``), never an exception in the env.

* ``local``: BM25 (``bm25s``) over a JSONL corpus of ``{"id", "title", "text", "url"?}`` (``.jsonl`` or
  ``.jsonl.gz``). The index is built once and cached on disk next to the corpus (or under ``$ARPO_CACHE_DIR`` when
  that folder is read-only). The default corpus ships in the package: 8,373 real web snippets recorded while the
  ARPO authors trained on their QA questions, split into passages.
* ``ddgs``: live web search through the ``ddgs`` package, with a timeout, retries with exponential backoff and a
  minimum interval between requests (shared by all tools in the process).
* ``recorded``: exact replay of a ``{query: results}`` JSON file (such as the release's ``search_cache.json``, whose
  results are ``Page i: snippet`` lines), falling back to another backend for unrecorded queries.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import re
import threading
import time
import unicodedata
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from arpo_env.scoring.qa_metrics import CJK
from arpo_env.tools.cache import ToolCache, resolve_cache
from arpo_env.tools.protocol import PATH_TYPES, StatelessTool, ToolOutput, check_options, limit_problem, type_problem

DEFAULT_CORPUS = "search_corpus.jsonl.gz"


@dataclass(frozen=True)
class SearchHit:
    title: str
    snippet: str
    url: str | None = None


class SearchError(RuntimeError):
    """A search that produced nothing usable; the message is shown to the model."""


class SearchBackend(Protocol):
    name: str

    def search(self, query: str, top_k: int) -> list[SearchHit]: ...

    def cache_id(self) -> str: ...


# --------------------------------------------------------------------------------------------------------------------
# local: BM25 over a corpus file
# --------------------------------------------------------------------------------------------------------------------
_CJK_RUN = re.compile(f"[{CJK}]{{2,}}")
INDEX_FORMAT = "cjk-bigrams-nfkc"
"""What the on-disk index was built with, in its stamp: an index of another format is built again."""


def index_terms(text: str) -> str:
    """`text` as BM25 reads it: each run of Chinese, Japanese or Korean characters written as its overlapping pairs
    (``瓦萨号`` is ``瓦萨 萨号``), since those languages put no spaces between words. bm25s's tokenizer took a whole
    run (a sentence) for one word, so that no query but that sentence could find it. Unicode's compatibility forms
    (NFKC) first, as QA's F1 reads answers: full-width letters and digits, as Chinese text writes them, are the ASCII
    ones (a query for ``２０２３年`` or ``Ｍｏｕｎｔ Ｆｕｊｉ`` found nothing), ligatures their letters (``ﬁrst``), and
    an accent written as a combining mark is one letter with it (``Hernández`` was the words ``herna`` and ``ndez``)."""
    text = unicodedata.normalize("NFKC", text)
    return _CJK_RUN.sub(lambda run: " " + " ".join(run[0][i:i + 2] for i in range(len(run[0]) - 1)) + " ", text)


def default_corpus() -> Path:
    return Path(str(resources.files("arpo_env") / "data" / DEFAULT_CORPUS))


def read_corpus(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The documents of a JSONL corpus (gzipped when it ends in .gz); a `ValueError` naming the line for one that is
    not a JSON object with a ``text`` field, or for a corpus of no document."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    docs, n = [], 0
    try:
        with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}: line {n} is not JSON ({exc})") from None
                if not isinstance(doc, dict) or "text" not in doc:
                    raise ValueError(f"{path}: document {len(docs)} (line {n}) has no 'text' field (expected id, "
                                     "title, text, url)")
                docs.append(doc)
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # not gzip, cut short, not UTF-8
        raise ValueError(f"search corpus {path} cannot be read after line {n} ({type(exc).__name__}: {exc}); a "
                         "corpus is JSON lines, UTF-8, gzipped when its name ends in .gz") from None
    if not docs:
        raise ValueError(f"search corpus {path} holds no document")
    return docs


class LocalSearch:
    """BM25 over a JSONL corpus; the index is built at first use and cached on disk."""

    name = "local"
    _shared: dict[str, "LocalSearch"] = {}
    _shared_lock = threading.Lock()

    def __init__(self, corpus: str | os.PathLike | None = None) -> None:
        self.corpus = Path(corpus) if corpus else default_corpus()
        if not self.corpus.is_file():
            raise FileNotFoundError(f"search corpus {self.corpus} does not exist")
        stat = self.corpus.stat()
        self.fingerprint = f"{self.corpus.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{INDEX_FORMAT}"
        # read now (the default corpus in 30 ms): a corpus that cannot serve is the env's error, not a failed search
        # at every call of a run that goes on
        self._docs: list[dict[str, Any]] = read_corpus(self.corpus)
        self._retriever: Any = None
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, corpus: str | os.PathLike | None = None) -> "LocalSearch":
        """One loaded index per corpus per process, however many envs use it."""
        key = str(Path(corpus).resolve()) if corpus else "<default>"
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls(corpus)
            return cls._shared[key]

    def cache_id(self) -> str:
        return f"local:{self.fingerprint}"

    def index_dir(self) -> Path:
        beside = self.corpus.with_name(self.corpus.name + ".bm25s")
        if os.access(self.corpus.parent, os.W_OK) or beside.is_dir():
            return beside
        digest = hashlib.sha256(self.fingerprint.encode()).hexdigest()[:16]
        base = os.environ.get("ARPO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "arpo")
        return Path(base) / "bm25s" / digest

    def _load(self) -> tuple[list[dict[str, Any]], Any]:
        with self._lock:
            if self._retriever is None:
                import bm25s

                docs = self._docs
                folder = self.index_dir()
                retriever, unreadable = None, False
                if self.index_built:
                    try:
                        retriever = bm25s.BM25.load(str(folder), show_progress=False)
                    except Exception as exc:  # noqa: BLE001 - an index cut short or of another bm25s: build it again
                        warnings.warn(f"the search index {folder} cannot be read ({type(exc).__name__}: {exc}); "
                                      "building it again", RuntimeWarning, stacklevel=2)
                        unreadable = True
                if retriever is None:
                    retriever = bm25s.BM25()
                    texts = [index_terms(f"{d.get('title', '')} {d['text']}") for d in docs]
                    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
                    self._save(retriever, folder, replace=unreadable)
                self._retriever = retriever
            return self._docs, self._retriever

    def _save(self, retriever: Any, folder: Path, replace: bool = False) -> None:
        """Write the index to `folder` whole or not at all: into a folder of its own, stamped, then renamed into
        place, so that processes building it at once (the ranks of a run) or a kill during the write never leave a
        stamped index that is cut short. An index another process put there meanwhile stands, unless `replace` (it
        could not be read). An index that cannot be written is kept in memory (with a warning)."""
        import shutil
        import uuid

        def unique(kind: str) -> Path:
            return folder.with_name(f".{folder.name}.{kind}.{os.getpid()}.{uuid.uuid4().hex[:8]}")

        fresh = unique("new")
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            fresh.mkdir()  # the umask's permissions, as the folder had: other users of an install read it
        except OSError as exc:
            warnings.warn(f"the search index cannot be written to {folder} ({exc}); it is kept in memory, and built "
                          "again in the next process (set ARPO_CACHE_DIR to a folder that can be written)",
                          RuntimeWarning, stacklevel=3)
            return
        try:
            if self.index_built and not replace:
                return  # another process built it meanwhile
            retriever.save(str(fresh), show_progress=False)
            (fresh / "source.txt").write_text(self.fingerprint)
            if folder.exists():  # a stale or broken index: set aside, then removed
                stale = unique("stale")
                os.replace(folder, stale)
                shutil.rmtree(stale, ignore_errors=True)
            os.replace(fresh, folder)
        except OSError as exc:  # another process put its index in place first, and that one stands; or a full disk
            if not self.index_built:
                warnings.warn(f"the search index cannot be written to {folder} ({exc}); it is kept in memory",
                              RuntimeWarning, stacklevel=3)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)

    @property
    def index_built(self) -> bool:
        stamp = self.index_dir() / "source.txt"
        try:
            return stamp.read_text() == self.fingerprint
        except OSError:
            return False

    def search(self, query: str, top_k: int) -> list[SearchHit]:
        import bm25s

        docs, retriever = self._load()
        tokens = bm25s.tokenize([index_terms(query)], stopwords="en", show_progress=False)
        if not any(len(t) for t in tokens.ids):
            return []
        ids, scores = retriever.retrieve(tokens, k=min(top_k, len(docs)), show_progress=False)
        return [SearchHit(docs[i].get("title", ""), docs[i]["text"], docs[i].get("url"))
                for i, s in zip(ids[0], scores[0]) if s > 0]


# --------------------------------------------------------------------------------------------------------------------
# ddgs: live web search
# --------------------------------------------------------------------------------------------------------------------
_NO_DDGS = "search='ddgs' needs the live extra: pip install 'arpo[live]' (the ddgs package)"


class DDGSSearch:
    """DuckDuckGo (and friends) through ``ddgs``, with timeouts, retries with backoff and a rate limit."""

    name = "ddgs"
    _gate = threading.Lock()
    _last = 0.0

    def __init__(self, timeout_s: float = 10.0, retries: int = 3, backoff_s: float = 1.0,
                 min_interval_s: float = 1.0, region: str = "us-en", backend: str = "auto") -> None:
        if importlib.util.find_spec("ddgs") is None:  # else every search would fail, and the run go on
            raise RuntimeError(_NO_DDGS)
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.min_interval_s, self.region, self.backend = min_interval_s, region, backend

    def cache_id(self) -> str:
        return f"ddgs:{self.region}:{self.backend}"

    def _wait_turn(self) -> None:
        with DDGSSearch._gate:
            delay = DDGSSearch._last + self.min_interval_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            DDGSSearch._last = time.monotonic()

    def search(self, query: str, top_k: int) -> list[SearchHit]:
        try:
            from ddgs import DDGS
        except ImportError as exc:
            raise SearchError(_NO_DDGS) from exc
        last_error: Exception | None = None
        for attempt in range(self.retries):
            self._wait_turn()
            try:
                rows = DDGS(timeout=int(self.timeout_s)).text(query, region=self.region, max_results=top_k,
                                                              backend=self.backend)
                return [SearchHit(_text(r.get("title")), _text(r.get("body")), _url(r.get("href"))) for r in rows or []]
            except Exception as exc:  # noqa: BLE001 - ddgs raises its own exception types for every network fault
                last_error = exc
                if "no results" in str(exc).lower():
                    return []
                time.sleep(self.backoff_s * 2**attempt)
        kind = "rate limited" if "ratelimit" in type(last_error).__name__.lower() else "unreachable"
        raise SearchError(f"web search {kind} after {self.retries} tries ({type(last_error).__name__}: {last_error})")


# --------------------------------------------------------------------------------------------------------------------
# recorded: replay a query -> results file
# --------------------------------------------------------------------------------------------------------------------
_PAGE = re.compile(r"^\s*Page\s+\d+\s*:\s*", re.M)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _url(value: Any) -> str | None:
    return str(value) if value else None


def _recorded_hit(entry: Any) -> SearchHit:
    """One recorded result: an object's title, snippet (or text, or body) and url, a null field empty; an entry that
    is no object, its text."""
    if not isinstance(entry, dict):
        return SearchHit("", _text(entry))
    snippet = next((entry[k] for k in ("snippet", "text", "body") if entry.get(k) is not None), "")
    return SearchHit(_text(entry.get("title")), _text(snippet), _url(entry.get("url", entry.get("href"))))


def parse_recorded(value: Any) -> list[SearchHit]:
    """A recorded result: a list of dicts, or text of ``Page i: snippet`` lines (the release's format)."""
    if isinstance(value, list):
        return [_recorded_hit(v) for v in value]
    parts = [p.strip() for p in _PAGE.split(str(value)) if p.strip()]
    return [SearchHit("", p) for p in parts]


_RECORDINGS: "OrderedDict[tuple[Any, ...], tuple[str, dict[str, Any], dict[str, Any]]]" = OrderedDict()
_RECORDINGS_KEPT = 4
_RECORDINGS_LOCK = threading.Lock()


def _recording(path: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A recording's digest, its records and its records by words (`RecordedSearch`), read once per file and version
    in this process and shared by every env that replays it (they only read them). Each env read its own: every
    ``gym.make`` and every root of a rollout (64 a step for 8 tasks of 8 global samples) parsed the file again and kept
    a copy, 0.7 s and 210 MB for a recording of 100 MB. A file is the same version while its inode, size, modification
    and change times are (an edit is read at the next env)."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise FileNotFoundError(f"search recording {path} cannot be read ({exc})") from None
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    with _RECORDINGS_LOCK:  # one reads it; the others wait for that one
        if key in _RECORDINGS:
            _RECORDINGS.move_to_end(key)
            return _RECORDINGS[key]
        data = path.read_bytes()
        try:
            records = json.loads(data.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"search recording {path} is not JSON in UTF-8 ({exc})") from None
        if not isinstance(records, dict):
            raise ValueError(f"search recording {path} is a JSON {type(records).__name__}, not an object of "
                             "query → results (as the release's search_cache.json)")
        by_words: dict[str, Any] = {}
        for query, value in records.items():  # an exact key first; else the first key with the same words
            by_words.setdefault(" ".join(query.split()), value)
        found = _RECORDINGS[key] = (hashlib.sha256(data).hexdigest()[:16], records, by_words)
        while len(_RECORDINGS) > _RECORDINGS_KEPT:
            _RECORDINGS.popitem(last=False)
        return found


class RecordedSearch:
    """Exact replay of recorded queries; unrecorded ones go to `fallback` (or fail when there is none).

    A query matches a record whose key is the same text up to whitespace: `SearchTool` collapses the model's runs of
    spaces before it asks, and recordings keep them as they were written (``"… headquarters  location"``).

    The cache id holds a digest of the recording's bytes: a tool cache keeps what an earlier recording answered
    under that recording's id, so an edited or replaced file is read, not the results it used to give."""

    name = "recorded"

    def __init__(self, path: str | os.PathLike, fallback: SearchBackend | None = None) -> None:
        self.path = Path(path)
        self.digest, self.records, self._by_words = _recording(self.path)
        self.fallback = fallback

    def cache_id(self) -> str:
        return f"recorded:{self.path.resolve()}:{self.digest}:{self.fallback.cache_id() if self.fallback else ''}"

    def search(self, query: str, top_k: int) -> list[SearchHit]:
        record = self.records.get(query, self._by_words.get(" ".join(query.split())))
        if record is not None:
            return parse_recorded(record)[:top_k]
        if self.fallback is None:
            raise SearchError("this query was not recorded and no fallback backend is configured")
        return self.fallback.search(query, top_k)


# --------------------------------------------------------------------------------------------------------------------
# The tool
# --------------------------------------------------------------------------------------------------------------------
def format_hits(hits: list[SearchHit], max_snippet_chars: int = 600) -> str:
    lines = []
    for i, hit in enumerate(hits, 1):
        snippet = hit.snippet if len(hit.snippet) <= max_snippet_chars else hit.snippet[:max_snippet_chars] + "…"
        head = f"{i}. {hit.title}".rstrip() if hit.title else f"{i}."
        lines.append(f"{head} {snippet}".strip() if not hit.title else f"{head}\n{snippet}")
        if hit.url:
            lines.append(f"   {hit.url}")
    return "\n".join(lines)


class SearchTool(StatelessTool):
    """The ``<search>`` tool over one backend; stateless, so forking is free (it returns itself)."""

    name = "search"
    tag = "search"

    def __init__(self, backend: SearchBackend, top_k: int = 5, cache: ToolCache | None = None,
                 max_query_chars: int = 500) -> None:
        self.backend, self.top_k, self.cache, self.max_query_chars = backend, top_k, cache, max_query_chars

    def call(self, query: str) -> ToolOutput:
        start = time.perf_counter()
        query = " ".join(query.split())
        extra: dict[str, Any] = {"backend": self.backend.name}
        if not query:
            return ToolOutput("search failed: the query is empty", failed=True, error="empty query")
        if len(query) > self.max_query_chars:
            return ToolOutput(f"search failed: the query is longer than {self.max_query_chars} characters",
                              failed=True, error="query too long")
        key = ToolCache.key(self.backend.cache_id(), "search", query, self.top_k)
        text = self.cache.get(key) if self.cache else None
        if text is not None:
            extra["cache"] = "hit"
        else:
            extra["cache"] = "miss" if self.cache else "off"
            try:
                hits = self.backend.search(query, self.top_k)
            except Exception as exc:  # noqa: BLE001 - any backend failure is an observation
                message = str(exc) if isinstance(exc, SearchError) else f"{type(exc).__name__}: {exc}"
                return ToolOutput(f"search failed: {message}", failed=True, error=message,
                                  latency_s=time.perf_counter() - start, extra=extra)
            if not hits:
                return ToolOutput(f"search failed: no results for {query!r}", failed=True, error="no results",
                                  latency_s=time.perf_counter() - start, extra=extra)
            text = format_hits(hits)
            if self.cache:
                self.cache.put(key, text)
        if self.cache:
            extra.update(self.cache.stats())
        return ToolOutput(text, latency_s=time.perf_counter() - start, extra=extra)



BACKENDS = ("local", "ddgs", "recorded")
"""The search backends by name (`make_backend`)."""
MAX_TOP_K = 100
"""The most results a search returns (``top_k``): a page of them is already past what an observation holds."""


def search_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """A search backend as one string, as ``arpo eval --search`` takes it: ``recorded:PATH[:local|ddgs]`` is the
    recorded backend with its ``recording`` (and ``fallback``) options; any other name is itself, with none."""
    if not isinstance(spec, str):  # None or a number: a clear error
        raise ValueError(f"search must be a backend's name (local, ddgs, recorded, recorded:PATH[:local|ddgs]), not "
                         f"{spec!r}")
    name, _, recording = spec.partition(":")
    if name != "recorded" or not recording:
        return spec, {}
    path, _, fallback = recording.rpartition(":") if recording.endswith((":local", ":ddgs")) else (recording, "", "")
    return name, {"recording": path, **({"fallback": fallback} if fallback else {})}


def make_backend(name: str, options: dict[str, Any]) -> SearchBackend:
    if name == "local":
        return LocalSearch.shared(options.get("corpus"))
    if name == "ddgs":
        return DDGSSearch(**options.get("ddgs", {}))
    if name == "recorded":
        if not options.get("recording"):
            raise ValueError("search='recorded' needs search_options={'recording': 'path/to/search_cache.json'}")
        fallback = options.get("fallback")
        return RecordedSearch(options["recording"], make_backend(fallback, options) if fallback else None)
    raise ValueError(f"unknown search backend {name!r}: use {', '.join(map(repr, BACKENDS[:-1]))} or {BACKENDS[-1]!r} "
                     "(or 'recorded:PATH[:local|ddgs]')")


def search_tool_factory(name: str = "local", options: dict[str, Any] | None = None) -> Callable[[], SearchTool]:
    """A factory of ``<search>`` tools sharing one backend and one cache.

    `options`: ``top_k`` (5), ``cache`` (a path, True for the default file, False for none; default: on for live
    and recorded backends, off for local BM25, which is faster than the cache), ``corpus`` (local), ``recording`` and
    ``fallback`` (recorded), ``ddgs`` (keyword arguments of `DDGSSearch`). `name` may carry the recording, as
    ``arpo eval --search`` does: ``recorded:PATH[:local|ddgs]`` (`search_spec`).
    """
    name, given = search_spec("local" if name is None else name)  # None, as gym's arguments go: the default
    options = {**(options or {}), **given}
    check_options("search_options", options, ("top_k", "cache", "corpus", "recording", "fallback", "ddgs"))
    top_k = options.get("top_k", 5)  # a whole number of at least 1, checked once here rather than at every search
    problems = [limit_problem("top_k", top_k, 1, MAX_TOP_K),
                type_problem("cache", options.get("cache"), "a path, or true or false", bool, ToolCache, *PATH_TYPES),
                type_problem("corpus", options.get("corpus"), "a path", *PATH_TYPES),
                type_problem("recording", options.get("recording"), "a path", *PATH_TYPES),
                type_problem("fallback", options.get("fallback"), "a backend's name", str),
                type_problem("ddgs", options.get("ddgs"), "a dict of DDGSSearch's arguments", Mapping)]
    if any(problems):
        raise ValueError("search_options: " + "; ".join(p for p in problems if p))
    backend = make_backend(name, options)
    cache = resolve_cache(options.get("cache", name != "local"))
    tool = SearchTool(backend, top_k, cache)
    return lambda: tool
