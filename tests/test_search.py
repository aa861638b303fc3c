"""<search>: BM25 over the shipped corpus, recorded replay, the shared cache, and failures as observations."""

from __future__ import annotations

import json
import os
import re

import gymnasium as gym
import pytest

import arpo_env  # noqa: F401
from arpo_env.datasets.loaders import load_tasks
from arpo_env.tools.cache import ToolCache
from arpo_env.tools.search import (
    LocalSearch,
    RecordedSearch,
    SearchTool,
    default_corpus,
    index_terms,
    parse_recorded,
    read_corpus,
)


def test_shipped_corpus_answers_a_question_it_covers():
    env = gym.make("ARPO-QA-v0", search_options={"cache": False})
    env.reset(options={"question": "Amy Smart made her debut in what made-for-television film?",
                       "answer": "Her Costly Affair"})
    obs, reward, term, trunc, info = env.step("<search>Amy Smart film debut made-for-television</search>")
    assert "Her Costly Affair" in obs and obs.lstrip().startswith("<result>\n1.")
    assert info["tool"] == "search" and not info["tool_failed"]
    obs, reward, term, *_ = env.step("<answer>\\boxed{Her Costly Affair}</answer>")
    assert term and reward == 1.0
    env.close()


def test_default_questions_are_covered_by_the_corpus():
    backend = LocalSearch.shared()
    found = 0
    tasks = load_tasks("default_qa", kind="qa")[:20]
    for task in tasks:
        hits = backend.search(task.question, 10)
        found += any(task.answer.lower() in h.snippet.lower() for h in hits)
    assert found >= len(tasks) // 3  # BM25 on the raw question finds the answer passage for many of them


def test_index_is_built_once_and_loaded_from_disk(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    docs = [{"id": str(i), "title": f"Doc {i}", "text": text} for i, text in enumerate(
        ["The Eiffel Tower is in Paris.", "Mount Fuji is the highest mountain in Japan.",
         "The Nile is a river in Africa."])]
    corpus.write_text("\n".join(json.dumps(d) for d in docs))
    first = LocalSearch(corpus)
    assert not first.index_built
    assert first.search("highest mountain Japan", 2)[0].snippet.startswith("Mount Fuji")
    stamp = first.index_dir() / "source.txt"
    mtime = stamp.stat().st_mtime_ns
    second = LocalSearch(corpus)
    assert second.index_built and second.search("river Africa", 1)[0].title == "Doc 2"
    assert stamp.stat().st_mtime_ns == mtime  # loaded, not rebuilt
    assert first.index_dir().parent == tmp_path  # next to the corpus


def test_chinese_is_found_by_its_words_not_only_by_whole_sentences(tmp_path):
    """Chinese puts no spaces between words: bm25s took each sentence of a Chinese corpus for one word, and found it
    only for that very sentence. Runs of CJK characters are indexed (and asked) as overlapping pairs."""
    corpus = tmp_path / "corpus.jsonl"
    docs = [{"id": "0", "title": "瓦萨号", "text": "瓦萨号是一艘瑞典战舰，建于1626年至1628年之间。"},
            {"id": "1", "title": "长江", "text": "长江是亚洲最长的河流，流经中国。"},
            {"id": "2", "title": "Mount Fuji", "text": "Mount Fuji is the highest mountain in Japan."}]
    corpus.write_text("\n".join(json.dumps(d, ensure_ascii=False) for d in docs))
    search = LocalSearch(corpus)
    assert [hit.title for hit in search.search("瑞典战舰", 3)] == ["瓦萨号"]
    assert search.search("亚洲最长的河流是哪条", 1)[0].title == "长江"
    assert search.search("highest mountain Japan", 1)[0].title == "Mount Fuji"  # other languages as before
    assert index_terms("长江 is 亚洲最长") == " 长江  is  亚洲 洲最 最长 "


def test_full_width_letters_ligatures_and_combining_accents_are_the_letters_they_stand_for(tmp_path):
    """Chinese text writes digits and Latin letters full width (``２０２３年``, ``ｉＰｈｏｎｅ``): such a query found
    nothing; nor did ``Hernández`` find a page that writes its accent as a combining mark. Both sides are NFKC."""
    corpus = tmp_path / "corpus.jsonl"
    docs = [{"id": "0", "title": "Mount Fuji", "text": "Mount Fuji is the highest mountain in Japan."},
            {"id": "1", "title": "长江", "text": "长江是亚洲最长的河流，2023年流经中国。"},
            {"id": "2", "title": "Juan", "text": "Juan Herna\u0301ndez won the ﬁrst prize."},
            {"id": "3", "title": "Other", "text": "Nothing of note here at all."}]
    corpus.write_text("\n".join(json.dumps(d, ensure_ascii=False) for d in docs))
    search = LocalSearch(corpus)
    assert search.search("Ｍｏｕｎｔ Ｆｕｊｉ", 1)[0].title == "Mount Fuji"
    assert search.search("２０２３", 1)[0].title == "长江"
    assert search.search("Hernández", 1)[0].title == "Juan" and search.search("first prize", 1)[0].title == "Juan"


def test_an_index_of_another_format_is_built_again(tmp_path):
    """An index stamped before CJK pairs (its stamp has no format) is built again, not read as this format."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "0", "title": "长江", "text": "长江是亚洲最长的河流。"}))
    first = LocalSearch(corpus)
    first.search("河流", 1)
    stamp = first.index_dir() / "source.txt"
    stat = corpus.stat()  # the stamp of an index built before CJK pairs: the corpus's path, size and time alone
    stamp.write_text(f"{corpus.resolve()}:{stat.st_size}:{stat.st_mtime_ns}")
    again = LocalSearch(corpus)
    assert not again.index_built and again.search("最长的河流", 1)[0].title == "长江" and again.index_built


def test_an_index_cut_short_is_built_again_and_one_that_cannot_be_written_stays_in_memory(tmp_path, monkeypatch):
    """A stamped index whose arrays were cut short (a write killed, or processes building it at once into one folder)
    failed every search for good ("search failed: ValueError: EOF …"). Now it is built again, written whole under
    another name and renamed into place; where it cannot be written it is kept in memory."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": str(i), "title": f"Doc {i}", "text": t}) for i, t in enumerate(
        ["The Eiffel Tower is in Paris.", "Mount Fuji is the highest mountain in Japan."])))
    LocalSearch(corpus).search("Paris", 1)
    folder = LocalSearch(corpus).index_dir()
    for array in folder.glob("*.npy"):
        array.write_bytes(array.read_bytes()[:40])
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        assert LocalSearch(corpus).search("highest mountain", 1)[0].title == "Doc 1"
    assert LocalSearch(corpus).index_built and sorted(p.name for p in tmp_path.iterdir()) == [
        "corpus.jsonl", "corpus.jsonl.bm25s"]  # no folder of a build left behind
    again = LocalSearch(corpus)
    assert again.search("Eiffel", 1)[0].title == "Doc 0" and (folder / "source.txt").is_file()

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setattr(LocalSearch, "index_dir", lambda self: blocked / "index")
    with pytest.warns(RuntimeWarning, match="kept in memory"):
        assert LocalSearch(corpus).search("Eiffel", 1)[0].title == "Doc 0"


def test_recorded_replay_and_fallback(data_dir):
    path = data_dir / "search" / "search_cache.json"
    records = json.loads(path.read_text())
    query = next(iter(records))
    replay = RecordedSearch(path)
    hits = replay.search(query, 3)
    assert len(hits) == 3 and hits[0].snippet in records[query]
    tool = SearchTool(replay)
    out = tool.call("a query nobody recorded")
    assert out.failed and out.text.startswith("search failed:") and "not recorded" in out.text
    with_fallback = SearchTool(RecordedSearch(path, fallback=LocalSearch.shared()))
    assert not with_fallback.call("Amy Smart debut").failed


def test_recorded_replay_matches_up_to_whitespace(data_dir):
    """The release's recording keeps its queries as the model wrote them, double spaces included ("Wolverine-Hoosier
    Athletic Conference headquarters  location"), and `SearchTool` collapses the model's spaces before it asks: the
    very query that was recorded was "not recorded"."""
    path = data_dir / "search" / "search_cache.json"
    records = json.loads(path.read_text())
    query = "Wolverine-Hoosier Athletic Conference headquarters  location"
    assert query in records
    out = SearchTool(RecordedSearch(path)).call(query)
    assert not out.failed, out.text
    assert parse_recorded(records[query])[0].snippet[:200] in out.text
    spaced = "  Wolverine-Hoosier Athletic Conference\nheadquarters location "
    assert not SearchTool(RecordedSearch(path)).call(spaced).failed


def test_a_recording_is_read_once_and_shared_by_every_env_that_replays_it(data_dir, tmp_path):
    """Every env parsed the recording again and kept a copy of its own (each ``gym.make``, each root of a rollout):
    0.7 s and 210 MB an env for a recording of 100 MB. Envs now share one reading of each version of the file."""
    import gymnasium as gym

    path = tmp_path / "search_cache.json"
    path.write_bytes((data_dir / "search" / "search_cache.json").read_bytes())
    options = {"recording": str(path), "cache": False}
    envs = [gym.make("ARPO-QA-v0", search="recorded", search_options=options) for _ in range(2)]
    try:
        first, second = (e.unwrapped.tool_factories["search"]().backend for e in envs)
        assert first.records is second.records and first.digest == second.digest
    finally:
        for e in envs:
            e.close()
    path.write_text(json.dumps({"who wrote Hamlet": "Page 1: Shakespeare"}))  # another version: read anew
    assert RecordedSearch(path).search("who wrote Hamlet", 1)[0].snippet == "Shakespeare"


def test_an_edited_recording_is_read_not_the_cache_of_the_old_one(tmp_path):
    """The tool cache (on by default for recordings) keyed a recording by its path alone: a corrected or replaced
    file kept answering what the old one said, in every later run."""
    recording, cache = tmp_path / "search_cache.json", ToolCache(tmp_path / "cache.sqlite")
    recording.write_text(json.dumps({"who wrote Hamlet": "Page 1: Marlowe"}))
    assert SearchTool(RecordedSearch(recording), cache=cache).call("who wrote Hamlet").text == "1. Marlowe"
    recording.write_text(json.dumps({"who wrote Hamlet": "Page 1: Shakespeare"}))
    assert SearchTool(RecordedSearch(recording), cache=cache).call("who wrote Hamlet").text == "1. Shakespeare"
    again = SearchTool(RecordedSearch(recording), cache=cache).call("who wrote Hamlet")
    assert again.text == "1. Shakespeare" and again.extra["cache"] == "hit"  # the same file is still cached


def test_parse_recorded_pages():
    hits = parse_recorded("Page 1: first snippet\nPage 2: second one …")
    assert [h.snippet for h in hits] == ["first snippet", "second one …"]


def test_recorded_entries_with_nulls_or_bare_text_are_read():
    """A recorded entry with a null snippet or title was "search failed: TypeError: object of type 'NoneType' has no
    len()", and an entry that is text, not an object, an AttributeError: the model read a failure for a result."""
    hits = parse_recorded([{"title": None, "snippet": None, "text": "Fuji is 3,776 m high.", "url": None},
                           "Fuji is in Japan.", {"title": 7, "body": "seven"}])
    assert [(h.title, h.snippet, h.url) for h in hits] == [("", "Fuji is 3,776 m high.", None),
                                                           ("", "Fuji is in Japan.", None), ("7", "seven", None)]


def test_the_env_takes_a_recording_as_arpo_eval_names_it(data_dir):
    """``arpo eval --search recorded:PATH:local`` names a recording in one string; ``gym.make(…, search=
    "recorded:PATH")`` was "unknown search backend", which did not say where the path goes."""
    recording = data_dir / "search" / "search_cache.json"
    query = next(iter(json.loads(recording.read_text())))
    env = gym.make("ARPO-QA-v0", search=f"recorded:{recording}:local")
    env.reset(seed=0)
    assert "search failed" not in env.step(f"<search>{query}</search>")[0]
    assert "search failed" not in env.step("<search>an unrecorded query about Paris</search>")[0]  # the fallback
    env.close()
    with pytest.raises(ValueError, match=re.escape("unknown search backend 'bing': use 'local', 'ddgs' or 'recorded' "
                                                   "(or 'recorded:PATH[:local|ddgs]')")):
        gym.make("ARPO-QA-v0", search="bing")


class CountingBackend:
    """A real backend (BM25 over the shipped corpus) that counts the searches it actually runs."""

    name = "counting"

    def __init__(self):
        self.inner, self.calls = LocalSearch.shared(), 0

    def cache_id(self):
        return "counting:" + self.inner.cache_id()

    def search(self, query, top_k):
        self.calls += 1
        return self.inner.search(query, top_k)


def test_second_identical_search_is_a_cache_hit(tmp_path):
    backend = CountingBackend()
    tool = SearchTool(backend, cache=ToolCache(tmp_path / "cache.sqlite"))
    a, b = tool.call("Campfire Tales  director"), tool.call("Campfire Tales director")
    assert a.text == b.text and backend.calls == 1
    assert (a.extra["cache"], b.extra["cache"]) == ("miss", "hit")
    other_process_view = SearchTool(backend, cache=ToolCache(tmp_path / "cache.sqlite"))
    assert other_process_view.call("Campfire Tales director").extra["cache"] == "hit" and backend.calls == 1


def test_the_cache_keeps_to_its_bound_oldest_first(tmp_path, monkeypatch):
    """The cache grew without bound (every page browsed in every run, for ever); it keeps `max_mb` of values, and a
    cache written before that (no sizes) is measured and bounded when it is opened."""
    import sqlite3

    from arpo_env.tools import cache as cache_module

    value = "x" * 998  # 1,000 bytes as JSON
    bounded = ToolCache(tmp_path / "c.sqlite", max_mb=0.05)
    for i in range(cache_module.CHECK_EVERY):
        bounded.put(ToolCache.key(i), value)
    assert bounded.evicted == cache_module.CHECK_EVERY - 45 and bounded.size_bytes() == 45_000  # to 90% of 50 kB
    assert bounded.get(ToolCache.key(0)) is None and bounded.get(ToolCache.key(cache_module.CHECK_EVERY - 1)) == value
    for i in range(cache_module.CHECK_EVERY, cache_module.CHECK_EVERY + 20):
        bounded.put(ToolCache.key(i), value)
    assert ToolCache(tmp_path / "c.sqlite", max_mb=0.05).size_bytes() == 45_000  # opening it bounds it again
    assert ToolCache(tmp_path / "c.sqlite", max_mb=1).size_bytes() == 45_000  # and a wider bound removes nothing

    old = sqlite3.connect(tmp_path / "old.sqlite")  # a cache as arpo wrote it before it had a bound
    old.execute("CREATE TABLE results (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)")
    old.executemany("INSERT INTO results VALUES (?, ?, ?)", [(str(i), '"' + value + '"', i) for i in range(100)])
    old.commit()
    old.close()
    opened = ToolCache(tmp_path / "old.sqlite", max_mb=0.05)
    assert opened.size_bytes() == 45_000 and opened.get("99") == value and opened.get("0") is None

    monkeypatch.setenv("ARPO_TOOL_CACHE_MB", "0.02")
    assert ToolCache(tmp_path / "c.sqlite").size_bytes() == 18_000
    monkeypatch.setenv("ARPO_TOOL_CACHE_MB", "lots")
    with pytest.warns(RuntimeWarning, match="ARPO_TOOL_CACHE_MB must be a positive number"):
        assert ToolCache(tmp_path / "c.sqlite").max_bytes == cache_module.DEFAULT_MAX_MB * 1e6
    for wrong in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="max_mb must be a positive number"):
            ToolCache(tmp_path / "c.sqlite", max_mb=wrong)


def test_cache_hits_and_misses_reach_info(tmp_path):
    env = gym.make("ARPO-QA-v0", search_options={"cache": str(tmp_path / "c.sqlite")})
    env.reset(options={"question": "q", "answer": "a"})
    env.step("<search>Vienna Ottoman siege</search>")
    *_, info = env.step("<search>Vienna Ottoman siege</search>")
    assert info["tool_extra"]["cache"] == "hit" and info["tool_extra"]["cache_hits"] >= 1
    env.close()


@pytest.mark.parametrize("query, message", [("", "empty"), ("the of and", "no results"), ("x" * 600, "longer")])
def test_bad_queries_are_observations(query, message):
    env = gym.make("ARPO-QA-v0", search_options={"cache": False})
    env.reset(options={"question": "q", "answer": "a"})
    obs, reward, term, trunc, info = env.step(f"<search>{query}</search>")
    assert "search failed" in obs and message in obs and not (term or trunc)
    env.close()


def test_corpus_format_is_checked(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "title": "no text"}\n')
    with pytest.raises(ValueError, match="no 'text' field"):
        read_corpus(bad)
    assert len(read_corpus(default_corpus())) > 8000


def test_a_corpus_that_cannot_serve_is_refused_when_the_env_is_made(tmp_path):
    """An empty corpus, a line that is not JSON, a file that is not gzip: the env was made, and every search of the
    run failed ("search failed: ValueError: max() arg is an empty sequence"), the model trained on a dead tool."""
    import gzip

    cut = gzip.compress(b'{"text": "Paris is the capital of France."}\n' * 100)[:-20]
    for name, content, words in [("empty.jsonl", b"\n", "holds no document"),
                                 ("lines.jsonl", b'{"text": "a"}\nnot json\n', "line 2 is not JSON"),
                                 ("words.jsonl", b'"some text"\n', "document 0 (line 1) has no 'text' field"),
                                 ("plain.jsonl.gz", b'{"text": "a"}\n', "cannot be read after line 0 (BadGzipFile"),
                                 ("cut.jsonl.gz", cut, "(EOFError: Compressed file ended"),
                                 ("latin.jsonl", '{"text": "café"}\n'.encode("latin-1"), "(UnicodeDecodeError")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=re.escape(words)):
            gym.make("ARPO-QA-v0", search_options={"corpus": str(tmp_path / name), "cache": False})


@pytest.mark.parametrize("kwargs", [{"search": "ddgs"},
                                    {"search": "recorded", "search_options": {"recording": "x", "fallback": "ddgs"}}])
def test_live_search_without_its_package_is_refused_when_the_env_is_made(kwargs, monkeypatch, tmp_path):
    """Without the ddgs package every search failed with a message in the transcript, and the run went on, training
    on failed searches."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ddgs" else find_spec(name, *a))
    if "search_options" in kwargs:
        (tmp_path / "x").write_text("{}")
        kwargs["search_options"]["recording"] = str(tmp_path / "x")
    with pytest.raises(RuntimeError, match=r"search='ddgs' needs the live extra: pip install 'arpo\[live\]'"):
        gym.make("ARPO-QA-v0", **kwargs)


@pytest.mark.live
@pytest.mark.skipif(os.environ.get("ARPO_LIVE_TESTS") != "1", reason="live web search: set ARPO_LIVE_TESTS=1")
def test_ddgs_live(tmp_path):
    pytest.importorskip("ddgs")
    env = gym.make("ARPO-QA-v0", search="ddgs", search_options={"cache": str(tmp_path / "c.sqlite")})
    env.reset(options={"question": "q", "answer": "a"})
    obs, *_ , info = env.step("<search>capital of Australia</search>")
    assert "Canberra" in obs or info["tool_failed"]  # a rate limit is a readable failure, not a crash


def test_a_recording_that_is_not_one_is_a_clear_error_naming_it(tmp_path):
    """A recording that is not JSON was json's "Expecting value: line 1 column 1 (char 0)", naming no file; a JSON
    list was an AttributeError traceback."""
    for name, content, words in [("text.json", b"not json", "is not JSON in UTF-8 (Expecting value"),
                                 ("list.json", b"[1, 2]", "is a JSON list, not an object of query"),
                                 ("latin.json", '{"café": "x"}'.encode("latin-1"),
                                  "is not JSON in UTF-8 ('utf-8' codec")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=re.escape(f"search recording {tmp_path / name} {words}")):
            gym.make("ARPO-QA-v0", search="recorded", search_options={"recording": str(tmp_path / name)})


def test_a_misspelt_option_is_named_not_ignored():
    """search_options={"topk": 3} was ignored, silently (five results a search); browse_options={"timeout": 3} was
    BrowseTool's TypeError, wrapped by gym with every keyword argument of the env."""
    for kwargs, words in [({"search_options": {"topk": 3}}, "search_options: unknown topk (did you mean top_k?); the "
                                                             "options are top_k, cache, corpus,"),
                          ({"browse_options": {"timeout": 3}}, "browse_options: unknown timeout (did you mean "
                                                               "timeout_s?); the options are page_store, summarizer,")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            gym.make("ARPO-DeepSearch-v0", **kwargs)


@pytest.mark.parametrize("kwargs, words", [
    # every search failed (-2), found nothing (0), or took text and fractions for numbers
    ({"search_options": {"top_k": -2}}, "search_options: top_k must be a whole number of at least 1 and at most 100, "
                                        "not -2"),
    ({"search_options": {"top_k": "3", "corpus": 5}}, "search_options: top_k must be a whole number of at least 1 and "
                                                      "at most 100, not '3'; corpus must be a path, not int '5'"),
    ({"search_options": {"cache": 5}}, "cache must be a path, or true or false, not int '5'"),  # gym's TypeError
    ({"search_options": {"ddgs": "fast"}}, "ddgs must be a dict of DDGSSearch's arguments, not str 'fast'"),
    # every page failed (a timeout of text or below 0), or "no" was true
    ({"browse_options": {"timeout_s": "10"}}, "browse_options: timeout_s must be a number of seconds above 0 and at "
                                              "most 100,000,000, not '10'"),
    ({"browse_options": {"max_chars": 0, "live": "no"}}, "browse_options: max_chars must be a whole number of at least "
                                                         "1 and at most 1,099,511,627,776, not 0; live must be true or "
                                                         "false, not str 'no'"),
    ({"browse_options": {"summarizer": {"url": "http://127.0.0.1:9/v1"}}}, "browse_options: summarizer: "),
    # every page's summary failed, silently
    ({"browse_options": {"summarizer": {"base_url": "http://127.0.0.1:9", "model": "m", "max_tokens": "512"}}},
     "browse_options: summarizer: max_tokens must be a whole number of at least 1 and at most 1,099,511,627,776, not "
     "'512'"),
    ({"browse_options": {"summarizer": {"base_url": "http://127.0.0.1:9", "model": 5, "timeout_s": -1}}},
     "browse_options: summarizer: model must be a model's name, not int '5'; timeout_s must be a number of seconds "
     "above 0"),
])
def test_an_option_of_the_wrong_type_is_named_when_the_env_is_made(kwargs, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        gym.make("ARPO-DeepSearch-v0", **kwargs)
