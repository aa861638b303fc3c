"""<browse> against a real HTTP server on 127.0.0.1: extraction, failures as observations, and the cache."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest

import arpo_env  # noqa: F401
from arpo_env.tools import browse
from arpo_env.tools.browse import BrowseTool, PageStore, browse_tool_factory
from arpo_env.tools.cache import ToolCache

ARTICLE = """<!doctype html><html><head><title>The Vasa ship</title>
<script>window.tracking = function () { console.log("TRACKING-SCRIPT"); };</script>
<style>.ad { color: red }</style></head>
<body>
<nav><ul><li><a href="/">Home</a></li><li><a href="/news">News</a></li><li><a href="/shop">SHOP-NAV-LINK</a></li></ul></nav>
<div class="ad" id="banner-ad">BUY-CHEAP-WATCHES advertisement, click here now!</div>
<main><article>
<h1>The Vasa ship</h1>
<p>The Vasa is a Swedish warship built between 1626 and 1628. The ship sank after sailing about 1,300 metres
into her maiden voyage on 10 August 1628, in the harbour of Stockholm.</p>
<p>She was salvaged in 1961 with a largely intact hull and is now displayed in the Vasa Museum, which is
visited by more than a million people every year.</p>
<p>The ship was armed with 64 bronze cannons and was built on the orders of King Gustavus Adolphus as part of
the military expansion he initiated in a war with Poland-Lithuania.</p>
</article></main>
<aside class="sidebar">SIDEBAR-PROMO: subscribe to our newsletter for weekly deals</aside>
<footer>Copyright FOOTER-TEXT 2024. All rights reserved.</footer>
<script>tracking();</script>
</body></html>"""

PARAGRAPHS = ("<html><body><h1>Results</h1>" + "".join(f"<p>PARA-{i} of the results</p>" for i in range(60_000))
              + "</body></html>").encode()
"""1.9 MB that trafilatura takes 10 s over here (its time grows with about the square of the paragraphs: 40,000 take
it 4.6 s, 80,000 18 s), ten times the bound the tests give it."""


GBK_PAGE = ('<html><head><meta charset="gb2312"><title>瓦萨号</title></head><body><article><h1>瓦萨号战舰</h1>'
            "<p>瓦萨号是一艘瑞典战舰，建于1626年至1628年之间。这艘船在首航中航行约1300米后沉没。</p>"
            "<p>它在1961年被打捞上来，现在陈列在瓦萨博物馆，每年有超过一百万人参观。</p></article></body></html>")
LATIN_PAGE = ('<html><head><meta http-equiv="Content-Type" content="text/html; charset=iso-8859-1"></head><body>'
              "<article><h1>Café Müller</h1><p>Das Café Müller ist ein Tanzstück von Pina Bausch aus dem Jahr 1978, "
              "über Erinnerung, Sehnsucht und Einsamkeit – „ein Klassiker“.</p></article></body></html>")


SOURCE = "def smaller(a, b):\n    if a < b:\n        return a  # the <smaller> one\n    return b\n"
MARKDOWN = '# The Vasa\n\n<p align="center">A <b>Swedish</b> warship</p>\n\nShe sank on 10 August 1628.\n'
API_JSON = ('{"query": {"pages": [{"title": "Vasa (ship)", "extract": "<p>The <b>Vasa</b> is a Swedish warship '
            'built between 1626 and 1628.</p>"}]}}')
XHTML = ('<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Strict//EN" '
         '"http://www.w3.org/TR/xhtml1/DTD/xhtml1-strict.dtd">\n<html xmlns="http://www.w3.org/1999/xhtml"><head>'
         '<title>Vasa</title></head><body><p>The Vasa sank in the harbour of Stockholm in 1628.</p></body></html>')


def _gzip_of_zeros(size: int) -> bytes:
    """`size` zero bytes gzipped, a MiB at a time (never all in memory)."""
    import zlib

    deflate, block = zlib.compressobj(9, zlib.DEFLATED, 31), bytes(1 << 20)
    return b"".join([*(deflate.compress(block) for _ in range(size >> 20)), deflate.flush()])


class Handler(BaseHTTPRequestHandler):
    hits: Counter = Counter()

    def log_message(self, *args):  # keep test output clean
        pass

    def _send(self, status, body, ctype="text/html; charset=utf-8", headers=()):
        self.send_response(status)
        if ctype is not None:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        Handler.hits[self.path] += 1
        if self.path in ("/article", "/cached"):
            self._send(200, ARTICLE.encode())
        elif self.path == "/paragraphs":
            self._send(200, PARAGRAPHS)
        elif self.path == "/slow":
            time.sleep(3)
            self._send(200, ARTICLE.encode())
        elif self.path == "/error":
            self._send(500, b"<html><body>Internal Server Error</body></html>")
        elif self.path == "/binary":
            self._send(200, bytes(range(256)) * 100, ctype="application/octet-stream")
        elif self.path == "/huge":
            chunk = ("<p>" + "filler text " * 80 + "</p>\n").encode()
            body = chunk * (20_000_000 // len(chunk))
            self._send(200, body)
        elif self.path == "/loop-a":
            self._send(302, b"", headers=[("Location", "/loop-b")])
        elif self.path == "/loop-b":
            self._send(302, b"", headers=[("Location", "/loop-a")])
        elif self.path == "/gbk":  # the charset only in the page, as many Chinese sites serve it
            self._send(200, GBK_PAGE.encode("gbk"), ctype="text/html")
        elif self.path == "/latin":
            self._send(200, LATIN_PAGE.encode("cp1252"), ctype="text/html")
        elif self.path == "/source.py":
            self._send(200, SOURCE.encode(), ctype="text/plain; charset=utf-8")
        elif self.path == "/readme.md":
            self._send(200, MARKDOWN.encode(), ctype="text/markdown")
        elif self.path == "/api.json":
            self._send(200, API_JSON.encode(), ctype="application/json")
        elif self.path == "/untyped.py":
            self._send(200, SOURCE.encode(), ctype=None)
        elif self.path in ("/gzip", "/x-gzip", "/gzip-gzip"):  # the article, compressed as servers do
            import gzip

            codings = {"/gzip": ["gzip"], "/x-gzip": ["x-gzip"], "/gzip-gzip": ["gzip", "gzip"]}[self.path]
            body = ARTICLE.encode()
            for _ in codings:
                body = gzip.compress(body)
            self._send(200, body, headers=[("Content-Encoding", ", ".join(codings))])
        elif self.path == "/gzip-members":  # two gzip members one after another, as appending to a .gz makes
            import gzip

            half = ARTICLE.index("<p>She was salvaged")
            body = gzip.compress(ARTICLE[:half].encode()) + gzip.compress(ARTICLE[half:].encode())
            self._send(200, body, headers=[("Content-Encoding", "gzip")])
        elif self.path in ("/deflate", "/raw-deflate"):  # HTTP's deflate with zlib's header, and without it
            import zlib

            deflate = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS if self.path == "/deflate" else -15)
            self._send(200, deflate.compress(ARTICLE.encode()) + deflate.flush(), headers=[("Content-Encoding",
                                                                                            "deflate")])
        elif self.path == "/bomb":  # 256 MiB of zeros gzipped twice: 500 bytes on the wire
            import gzip

            self._send(200, gzip.compress(_gzip_of_zeros(256 << 20)), headers=[("Content-Encoding", "gzip, gzip")])
        elif self.path == "/brotli":  # a coding the request did not ask for
            self._send(200, b"\x1b\x03\x00\xf8\xa5", headers=[("Content-Encoding", "br")])
        elif self.path.startswith("/charset-"):  # a label that names a codec of Python's that no page is in
            self._send(200, (ARTICLE + "<!-- © 2024 -->").encode(),
                       ctype=f"text/html; charset={self.path[len('/charset-'):]}")
        elif self.path == "/moved":
            self._send(301, b"", headers=[("Location", "/article")])
        else:
            self._send(404, b"<html><body>Not found</body></html>")


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def env(tmp_path):
    e = gym.make("ARPO-DeepSearch-v0", browse_options={"timeout_s": 1.0, "max_bytes": 5_000_000,
                                                       "extract_timeout_s": 1.0, "private_hosts": True,
                                                       "cache": str(tmp_path / "cache.sqlite")})
    e.reset(options={"question": "When did the Vasa sink?", "answer": "1628"})
    yield e
    e.close()


@pytest.mark.slow
def test_article_text_without_boilerplate(env, server):
    obs, reward, term, trunc, info = env.step(f"<browse>{server}/article</browse>")
    assert "sank after sailing about 1,300 metres" in obs and "64 bronze cannons" in obs
    for junk in ("TRACKING-SCRIPT", "BUY-CHEAP-WATCHES", "SHOP-NAV-LINK", "SIDEBAR-PROMO", "FOOTER-TEXT"):
        assert junk not in obs
    assert not info["tool_failed"] and info["tool"] == "browse"


@pytest.mark.parametrize("path, message", [
    ("/slow", "timed out"),
    ("/error", "HTTP 500"),
    ("/binary", "not a text page"),
    ("/huge", "larger than 5 MB"),
    ("/loop-a", "redirect loop"),
    ("/missing", "HTTP 404"),
])
@pytest.mark.slow
def test_failures_are_observations_and_the_episode_goes_on(env, server, path, message):
    obs, reward, term, trunc, info = env.step(f"<browse>{server}{path}</browse>")
    assert obs.startswith("\n<result>\nbrowse failed:") and message in obs, obs
    assert info["tool_failed"] and not (term or trunc)
    obs, *_ = env.step(f"<browse>{server}/moved</browse>")  # a redirect that lands
    assert "Vasa Museum" in obs


@pytest.mark.slow
def test_a_page_that_extraction_would_take_minutes_over_is_read_as_plain_text_in_time(env, server):
    obs, reward, term, trunc, info = env.step(f"<browse>{server}/paragraphs</browse>")
    assert "could not be extracted within 1 s; this is all of its text" in obs, obs[:300]
    assert "Results" in obs and "PARA-0 of" in obs and "PARA-1 of" in obs and "[page truncated:" in obs
    assert not info["tool_failed"] and not (term or trunc)
    obs, *_ = env.step(f"<browse>{server}/article</browse>")  # its worker was replaced: the next page is as ever
    assert "64 bronze cannons" in obs and "SIDEBAR-PROMO" not in obs and "could not be extracted" not in obs


@pytest.mark.slow
def test_a_plain_text_stand_in_is_not_cached_and_the_overrun_is_not_waited_out_again(server, tmp_path, monkeypatch):
    from collections import OrderedDict

    from arpo_env.scoring import worker_pool
    from arpo_env.tools import browse

    calls = []
    real_call = worker_pool.WorkerPool.call

    def counting_call(self, op, *args, **kwargs):
        calls.append(op)
        return real_call(self, op, *args, **kwargs)

    monkeypatch.setattr(worker_pool.WorkerPool, "call", counting_call)
    monkeypatch.setattr(browse, "_OVERRAN", OrderedDict())  # what earlier tests' overruns left is not this test's
    tool = BrowseTool(cache=ToolCache(tmp_path / "c.sqlite"), extract_timeout_s=1.0, private_hosts=True)
    first = tool.call(f"{server}/paragraphs")
    assert "could not be extracted within 1 s" in first.text and first.extra["extraction"] == "plain"
    assert calls == ["arpo_env.tools.browse:main_text"]
    # Not from the cache (an overrun may be the machine's load: the next run tries again), but read as plain text
    # at once: this process remembers that the page overran its bound.
    second = tool.call(f"{server}/paragraphs")
    assert second.extra["cache"] == "miss" and second.extra["extraction"] == "plain" and second.text == first.text
    assert calls == ["arpo_env.tools.browse:main_text"]
    # A larger bound than the one it overran tries the main text again.
    patient = BrowseTool(cache=ToolCache(tmp_path / "c.sqlite"), extract_timeout_s=1.5, private_hosts=True)
    assert "within 1.5 s" in patient.call(f"{server}/paragraphs").text and calls == ["arpo_env.tools.browse:main_text"] * 2
    article = tool.call(f"{server}/article")
    assert article.extra["extraction"] == "main" and tool.call(f"{server}/article").extra["cache"] == "hit"


@pytest.mark.slow
def test_a_page_waits_for_a_busy_page_worker_no_longer_than_its_bound(monkeypatch):
    # Every page worker busy with slow pages (18 s each here, bounded at 4 s): another page does not queue behind
    # them past its own bound; it is read as plain text, and not remembered as a page that overran.
    from collections import OrderedDict

    from conftest import wait_until

    from arpo_env.scoring import worker_pool
    from arpo_env.tools import browse

    monkeypatch.setattr(browse, "_OVERRAN", OrderedDict())
    slow = "<html><body>" + "".join(f"<p>PARA-{i} of the results</p>" for i in range(80_000)) + "</body></html>"
    page_pool = worker_pool.pool("page")
    browse.extract_text(ARTICLE, "http://example.org/warm", 30.0)  # the workers have started
    busy = [threading.Thread(target=browse.extract_text, args=(slow, f"http://example.org/slow/{i}", 4.0))
            for i in range(page_pool.size)]
    for thread in busy:
        thread.start()
    try:
        assert wait_until(lambda: page_pool.idle.qsize() == 0)
        text, how = browse.extract_text(ARTICLE, "http://example.org/vasa", 0.5)
        assert how == "plain" and "64 bronze cannons" in text and "SIDEBAR-PROMO" in text  # all of its text
    finally:
        for thread in busy:
            thread.join()
    assert len(browse._OVERRAN) == page_pool.size  # the slow pages, not the article
    text, how = browse.extract_text(ARTICLE, "http://example.org/vasa", 5.0)
    assert how == "main" and "SIDEBAR-PROMO" not in text


def test_a_dead_page_worker_is_replaced(server):
    import os
    import signal

    from arpo_env.scoring.worker_pool import pool

    tool = BrowseTool(private_hosts=True)
    assert "Vasa Museum" in tool.call(f"{server}/article").text
    workers = list(pool("page").workers)
    assert workers
    for worker in workers:
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()
    out = tool.call(f"{server}/moved")
    assert not out.failed and "Vasa Museum" in out.text and "could not be extracted" not in out.text


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "0.0.0.0:{port}",
                                  "2130706433:{port}", "[::ffff:127.0.0.1]:{port}", "169.254.169.254", "10.0.0.1",
                                  # IPv6 forms that carry 127.0.0.1 or the metadata service: compatible, NAT64, 6to4
                                  "[::127.0.0.1]:{port}", "[64:ff9b::7f00:1]:{port}", "[64:ff9b::a9fe:a9fe]",
                                  "[2002:7f00:1::]:{port}"])
def test_local_and_private_addresses_are_refused_by_default(server, host):
    # The URL is the model's: 127.0.0.1:8000 may be a vLLM server, 169.254.169.254 a cloud's metadata service.
    port = server.rsplit(":", 1)[1]
    before = sum(Handler.hits.values())
    out = BrowseTool(cache=None).call(f"http://{host.format(port=port)}/article")
    assert out.failed and "is not a public address" in out.text and "browsing local and private networks is off" \
        in out.text, out.text
    assert sum(Handler.hits.values()) == before  # nothing reached the server


def test_a_name_that_rebinds_to_a_private_address_gets_nowhere(server, monkeypatch):
    # DNS rebinding: the name resolves to a public address when it is checked and to a local one when the connection
    # is made. The connection now goes to the addresses that were checked, resolved once more and checked again.
    import socket

    port = int(server.rsplit(":", 1)[1])
    real, lookups = socket.getaddrinfo, []

    def rebinding(host, *args, **kwargs):
        if host != "rebinding.example":
            return real(host, *args, **kwargs)
        lookups.append(host)
        address = "93.184.216.34" if len(lookups) == 1 else "127.0.0.1"  # public first, then the machine itself
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    before = sum(Handler.hits.values())
    out = BrowseTool(cache=None).call(f"http://rebinding.example:{port}/article")
    assert out.failed and "rebinding.example is not a public address (127.0.0.1)" in out.text, out.text
    assert len(lookups) == 2 and sum(Handler.hits.values()) == before  # nothing reached the server


def test_a_private_address_is_refused_as_an_observation_and_the_episode_goes_on(server):
    env = gym.make("ARPO-DeepSearch-v0", browse_options={"cache": False})
    env.reset(options={"question": "When did the Vasa sink?", "answer": "1628"})
    try:
        obs, reward, term, trunc, info = env.step(f"<browse>{server}/article</browse>")
        assert "browse failed:" in obs and "not a public address" in obs and info["tool_failed"]
        assert not (term or trunc)
        obs, *_ = env.step("<browse>http://no-such-host.invalid/page</browse>")  # left to httpx (or a proxy)
        assert "browse failed: ConnectError" in obs
    finally:
        env.close()


def test_not_a_url(env):
    obs, *_ , info = env.step("<browse>file:///etc/passwd</browse>")
    assert "not an http(s) URL" in obs and info["tool_failed"]


def test_second_browse_is_served_from_the_cache(server, tmp_path):
    tool = browse_tool_factory({"cache": str(tmp_path / "c.sqlite"), "private_hosts": True})()
    before = Handler.hits["/cached"]
    first, second = tool.call(f"{server}/cached"), tool.call(f"{server}/cached")
    assert first.text == second.text and "Vasa" in first.text
    assert Handler.hits["/cached"] - before == 1
    assert first.extra["cache"] == "miss" and second.extra["cache"] == "hit" and second.extra["cache_hits"] == 1
    # Another process-level handle on the same file sees the entry too (the cache is shared).
    again = BrowseTool(cache=ToolCache(tmp_path / "c.sqlite"), private_hosts=True).call(f"{server}/cached")
    assert again.extra["cache"] == "hit" and Handler.hits["/cached"] - before == 1


def test_a_private_page_in_the_cache_is_not_served_to_a_tool_that_refuses_private_addresses(server, tmp_path):
    """The cache outlives the run and is shared: a page of 127.0.0.1 (an intranet's) read by a run that allowed
    private hosts was served from it to a run that refuses them, past the address check."""
    cache = str(tmp_path / "c.sqlite")
    allowed = browse_tool_factory({"cache": cache, "private_hosts": True})()
    assert not allowed.call(f"{server}/article").failed
    refused = browse_tool_factory({"cache": cache})().call(f"{server}/article")
    assert refused.failed and "is not a public address" in refused.text and refused.extra["cache"] == "miss"
    assert allowed.call(f"{server}/article").extra["cache"] == "hit"


def summarizer_endpoint(replies):
    from chat_server import serve_replies

    chat = serve_replies(replies, model="condenser")
    return chat, f"http://127.0.0.1:{chat.server_address[1]}"


def test_a_summarizer_condenses_the_pages_main_text_at_an_endpoint_given_with_or_without_v1(server, tmp_path):
    """browse_options={"summarizer": …} was never run by a test. It posted to BASE/chat/completions, so the endpoint
    given as the judge's and `arpo eval`'s are (http://host:port, without /v1) was a 404 at every page."""
    chat, base = summarizer_endpoint(["The Vasa sank in 1628 on its maiden voyage."] * 2)
    try:
        for url in (base, base + "/v1/"):
            tool = browse_tool_factory({"summarizer": {"base_url": url, "model": "condenser"}, "private_hosts": True,
                                        "cache": False})()
            out = tool.call(f"{server}/article")
            assert (out.text, out.failed) == ("The Vasa sank in 1628 on its maiden voyage.", False)
            assert "sank after sailing about 1,300 metres" in chat.prompts[-1]  # the main text is what it condenses
            assert "TRACKING-SCRIPT" not in chat.prompts[-1]
    finally:
        chat.shutdown()


def test_a_summarizer_that_fails_costs_a_warning_and_its_raw_page_is_not_cached_as_the_summary(server, tmp_path):
    """A summarizer that failed (its server down, a wrong model name) left the page's own text, silently, and that
    text was cached under the summarizer's key: every later run read the raw page as the summary, from the cache."""
    chat, base = summarizer_endpoint([400, "The Vasa sank in 1628."])
    tool = browse_tool_factory({"summarizer": {"base_url": base, "model": "condenser"}, "private_hosts": True,
                                "cache": str(tmp_path / "c.sqlite")})()
    try:
        with pytest.warns(RuntimeWarning, match=r"browse: the summarizer at .* failed \(.*answered 400.*\); pages are "
                                                r"given as their own text"):
            first = tool.call(f"{server}/article")
        assert "sank after sailing about 1,300 metres" in first.text and not first.failed  # the page still helps
        assert "answered 400" in first.extra["summarizer_error"]
        second, third = tool.call(f"{server}/article"), tool.call(f"{server}/article")
        assert second.text == third.text == "The Vasa sank in 1628."
        assert (second.extra["cache"], third.extra["cache"]) == ("miss", "hit")
    finally:
        chat.shutdown()


@pytest.mark.slow
def test_a_summarizer_that_is_down_is_not_asked_again_at_every_page(server):
    """As the judge: once its endpoint could not be reached, a summarizer is passed over for `down_s` seconds, so that
    one that is down costs its retries once, not at every page an episode browses."""
    chat, base = summarizer_endpoint([503, "The Vasa sank in 1628."])
    tool = browse_tool_factory({"summarizer": {"base_url": base, "model": "condenser", "retries": 0, "down_s": 0.5},
                                "private_hosts": True, "cache": False})()
    try:
        with pytest.warns(RuntimeWarning, match="answered 503"):
            assert "Vasa Museum" in tool.call(f"{server}/article").text
        second = tool.call(f"{server}/article")
        assert "Vasa Museum" in second.text and "could not be reached a moment ago" in second.extra["summarizer_error"]
        assert len(chat.prompts) == 1  # not asked
        time.sleep(0.6)
        assert tool.call(f"{server}/article").text == "The Vasa sank in 1628."
    finally:
        chat.shutdown()


@pytest.mark.slow
def test_a_summarizer_without_a_model_named_asks_the_one_its_endpoint_serves_and_caches_under_it(server, tmp_path):
    """As the judge: a summarizer without its "model" was refused ("model must be named"). Its endpoint is asked
    which model it serves; while it cannot say (down), the page's own text is given and nothing is cached or served
    from the cache (the page cached without a summarizer is not this summarizer's summary)."""
    import socket

    from chat_server import serve_replies

    with socket.socket() as probe:  # a port nothing listens on, yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cache = str(tmp_path / "c.sqlite")
    assert not browse_tool_factory({"cache": cache, "private_hosts": True})().call(f"{server}/article").failed
    tool = browse_tool_factory({"summarizer": {"base_url": f"http://127.0.0.1:{port}", "retries": 0, "down_s": 0.3},
                                "private_hosts": True, "cache": cache})()
    with pytest.warns(RuntimeWarning, match="the summarizer at .* failed"):
        down = tool.call(f"{server}/article")
    assert "sank after sailing about 1,300 metres" in down.text and not down.failed
    assert down.extra["cache"] == "off" and "summarizer_error" in down.extra
    chat = serve_replies(["The Vasa sank in 1628."], model="condenser", port=port)
    try:
        time.sleep(0.4)  # past down_s
        first, second = tool.call(f"{server}/article"), tool.call(f"{server}/article")
        assert first.text == second.text == "The Vasa sank in 1628."
        assert (first.extra["cache"], second.extra["cache"]) == ("miss", "hit") and len(chat.prompts) == 1
        named = browse_tool_factory({"summarizer": {"base_url": f"http://127.0.0.1:{port}", "model": "condenser"},
                                     "private_hosts": True, "cache": cache})()
        assert named.call(f"{server}/article").extra["cache"] == "hit"  # the same summarizer, named or asked
    finally:
        chat.shutdown()


def test_a_page_store_copy_and_the_live_page_at_its_url_are_cached_apart(server, tmp_path):
    """The cache outlives the run and is shared by every run on the machine: a page store's copy of a page (an
    offline snapshot, a test's stand-in) was cached under the page's URL alone, and so served to live runs as the
    page, from the cache; a live page cached first was served in place of the store's copy, and an old copy in
    place of a newer one."""
    def copy(words):
        (tmp_path / "copy.html").write_text(f"<html><body><p>{words} " * 5 + "</p></body></html>")

    copy("An offline copy of the page about the ship.")
    (tmp_path / "index.json").write_text(f'{{"{server}/article": "copy.html"}}')
    options = {"cache": str(tmp_path / "c.sqlite"), "private_hosts": True}
    stored = browse_tool_factory({**options, "page_store": str(tmp_path)})()
    live = browse_tool_factory(options)()
    assert "An offline copy" in stored.call(f"{server}/article").text
    assert "Gustavus Adolphus" in live.call(f"{server}/article").text
    again = stored.call(f"{server}/article")
    assert "An offline copy" in again.text and again.extra["cache"] == "hit"
    copy("A newer copy, of another length.")
    newer = stored.call(f"{server}/article")
    assert "A newer copy" in newer.text and newer.extra["cache"] == "miss"


def test_a_cache_that_cannot_be_used_costs_a_warning_not_the_env(server, tmp_path):
    """A cache file that is not a database (a file of another program, one cut short) or whose folder cannot be made:
    making the env raised sqlite3.DatabaseError or an OSError. Now the tools run without the cache."""
    garbage = tmp_path / "c.sqlite"
    garbage.write_bytes(b"not a database " * 100)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for cache in (garbage, blocked / "c.sqlite"):
        with pytest.warns(RuntimeWarning, match="cannot be used.*tools run without it"):
            env = gym.make("ARPO-DeepSearch-v0", browse_options={"cache": str(cache), "private_hosts": True})
        env.reset(seed=0)
        first = env.unwrapped.tools["browse"].call(f"{server}/cached")
        second = env.unwrapped.tools["browse"].call(f"{server}/cached")
        assert "Vasa" in first.text and second.text == first.text and second.extra["cache"] == "miss"
        env.close()
    assert garbage.read_bytes() == b"not a database " * 100  # left as it was


def test_pages_are_read_in_the_charset_they_declare(server, tmp_path):
    """A page whose charset is only in its HTML (``<meta charset="gb2312">``, an ``http-equiv`` Content-Type) was
    read as UTF-8: a Chinese page came back as U+FFFD alone, and "Café" as "Caf\ufffd"."""
    tool = BrowseTool(cache=None, private_hosts=True)
    chinese = tool.call(f"{server}/gbk")
    assert "瓦萨号是一艘瑞典战舰" in chinese.text and "\ufffd" not in chinese.text
    german = tool.call(f"{server}/latin")
    assert "Das Café Müller ist ein Tanzstück" in german.text and "„ein Klassiker“" in german.text
    (tmp_path / "vasa.html").write_bytes(GBK_PAGE.encode("gbk"))
    (tmp_path / "index.json").write_text('{"https://example.cn/vasa": "vasa.html"}')
    assert "瓦萨博物馆" in BrowseTool(PageStore(tmp_path), live=False).call("https://example.cn/vasa").text


@pytest.mark.parametrize("label", ["punycode", "hex", "idna", "undefined"])
def test_a_charset_that_names_a_codec_no_page_is_in_is_passed_over(server, label):
    """``charset=punycode`` decoded a page with Python's punycode codec, whose time grows with the square of the page
    (0.4 s for 40 KB, so minutes for a page under the size cap) and which fails at a byte that is not ASCII (the
    page's ``©``); the others failed it too (``hex`` is not a text encoding). Like a label a browser does not know,
    it is passed over: the page is UTF-8."""
    out = BrowseTool(cache=None, private_hosts=True).call(f"{server}/charset-{label}")
    assert not out.failed and "maiden voyage on 10 August 1628" in out.text, out.text
    page = (ARTICLE + "<!-- © 2024 -->").encode()
    assert browse.decode_page(page, label) == page.decode("utf-8")  # punycode's was the page with its own letters


def test_text_that_is_not_html_is_read_as_it_is(server):
    """A plain-text page with a ``<`` in it (``if a < b:``), a Markdown file with inline HTML, an API's JSON: the
    first two went to trafilatura as HTML, which found no text in them ("browse failed: the page has no readable
    text"), and JSON and Markdown were refused as "not a text page". Text that is not HTML is the model's as it is,
    and so is a page whose server names no type and that does not start as markup does."""
    tool = BrowseTool(cache=None, private_hosts=True)
    for path, text in [("/source.py", SOURCE), ("/readme.md", MARKDOWN), ("/api.json", API_JSON),
                       ("/untyped.py", SOURCE)]:
        out = tool.call(f"{server}{path}")
        assert not out.failed and out.text == text.strip(), (path, out.text)
        assert out.extra["extraction"] == "main"
    assert "Gustavus Adolphus" in tool.call(f"{server}/article").text  # HTML is still read for its main text
    for ctype in ("image/png", "application/octet-stream", "application/pdf", "audio/mpeg"):
        assert not browse.is_text_type(ctype)
    for ctype in ("text/csv", "application/ld+json", "application/atom+xml", "application/javascript"):
        assert browse.is_text_type(ctype)


def test_an_xhtml_page_that_overruns_is_read_as_plain_text_not_as_nothing():
    """lxml refuses a str that opens with an XML declaration, so the plain-text stand-in of an XHTML page (what the
    model reads when extraction overruns) was empty: "browse failed: the page has no readable text"."""
    for page in (XHTML, "\ufeff" + XHTML, "  \n" + XHTML):
        assert browse.plain_text(page) == "The Vasa sank in the harbour of Stockholm in 1628."


@pytest.mark.parametrize("written, meant", [
    ('"https://x.org/a"', "https://x.org/a"), (" <https://x.org/a> ", "https://x.org/a"),
    ("`'https://x.org'`", "https://x.org"), ("en.wikipedia.org/wiki/Vasa", "https://en.wikipedia.org/wiki/Vasa"),
    ("en.wikipedia.org", "https://en.wikipedia.org"),
    ("arxiv.org/abs/2507.19849", "https://arxiv.org/abs/2507.19849"), ("www.bbc.co.uk", "https://www.bbc.co.uk"),
    ("data.csv", "data.csv"), ("x.org", "x.org"), ("Vasa ship", "Vasa ship"), ("ftp://x.org", "ftp://x.org"),
    ("127.0.0.1:8000", "127.0.0.1:8000"), ('"', '"'), ("", ""),
])
def test_the_url_a_model_means(written, meant):
    """Quotes, angle brackets and backticks around a URL, and a bare host (as an address bar takes it), were "not an
    http(s) URL"; a name that may be a file's is left as written."""
    assert browse.written_url(written) == meant


def test_a_quoted_url_is_browsed(server):
    out = BrowseTool(cache=None, private_hosts=True).call(f' "{server}/article" ')
    assert not out.failed and "Gustavus Adolphus" in out.text


def test_offline_page_store(tmp_path):
    (tmp_path / "vasa.html").write_text(ARTICLE)
    (tmp_path / "index.json").write_text('{"https://example.org/vasa": "vasa.html"}')
    tool = BrowseTool(PageStore(tmp_path), live=False)
    assert "Gustavus Adolphus" in tool.call("https://example.org/vasa").text
    for written in ("https://example.org/vasa#History", "https://example.org/vasa/", "https://example.org/vasa/#x"):
        assert "Gustavus Adolphus" in tool.call(written).text, written  # a fragment was "not in the page store"
    missing = tool.call("https://example.org/other")
    assert missing.failed and "live browsing is off" in missing.text
    lost = BrowseTool(PageStore({"https://example.org/lost": str(tmp_path / "lost.html")}), live=False)
    out = lost.call("https://example.org/lost")  # was FileNotFoundError with the host's path, for the model to read
    assert out.failed and "the page store lists this page but has no file for it" in out.text
    assert str(tmp_path) not in out.text
    for content, words in [('{"https://example.org/vasa": ', "is not JSON in UTF-8 (Expecting value"),
                           ('["vasa.html"]', "is a JSON list, not an object of url → file name"),
                           # each was "browse failed: TypeError: unsupported operand type(s) for /: 'PosixPath' and …"
                           # at its page, in every episode that browsed it
                           ('{"https://example.org/vasa": "vasa.html", "https://example.org/a": 5, '
                            '"https://example.org/b": ["vasa.html"], "https://example.org/c": ""}',
                            "holds 3 entries that are not url → file name: 'https://example.org/a': 5, "
                            "'https://example.org/b': ['vasa.html'], 'https://example.org/c': ''")]:
        (tmp_path / "index.json").write_text(content)  # was json's message naming no file; an AttributeError later
        with pytest.raises(ValueError, match=f"page store index {tmp_path / 'index.json'} {re.escape(words)}"):
            gym.make("ARPO-DeepSearch-v0", browse_options={"page_store": str(tmp_path)})


@pytest.mark.parametrize("private_hosts", [True, False])
@pytest.mark.slow
def test_a_server_that_trickles_its_headers_is_cut_off_at_the_deadline(monkeypatch, private_hosts):
    """httpx's timeouts bound each read: a server sending its headers a line every 0.3 s held a 1 s fetch until it
    was done (here 6 s; a server that never ends held it for ever). The fetch now hangs up at its deadline."""
    import socket

    from arpo_env.tools import browse

    if not private_hosts:  # the public-only transport, with 127.0.0.1 counted public for once
        monkeypatch.setattr(browse, "_is_public", lambda address: True)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sent = []

    def trickle():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n")
                for i in range(20):
                    conn.sendall(f"X-Line-{i}: 1\r\n".encode())
                    sent.append(i)
                    time.sleep(0.3)
                conn.sendall(f"Content-Length: {len(ARTICLE.encode())}\r\n\r\n".encode() + ARTICLE.encode())
            except OSError:  # the client hung up
                pass

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    out = BrowseTool(cache=None, timeout_s=1.0, private_hosts=private_hosts).call(f"http://127.0.0.1:{port}/x")
    assert out.failed and out.text == "browse failed: timed out after 1 s", out.text
    thread.join()
    listener.close()
    assert len(sent) < 20  # the client hung up long before the server was done


def test_long_pages_are_truncated_visibly(server):
    tool = BrowseTool(max_chars=200, private_hosts=True)
    out = tool.call(f"{server}/article")
    assert "[page truncated:" in out.text and len(out.text) < 300


@pytest.mark.parametrize("path", ["/gzip", "/x-gzip", "/gzip-gzip", "/gzip-members", "/deflate", "/raw-deflate"])
def test_a_compressed_page_is_read(server, path):
    """Every coding a server may use, and a gzip body of two members (httpx read the first alone)."""
    out = BrowseTool(private_hosts=True).call(f"{server}{path}")
    assert not out.failed and "maiden voyage on 10 August 1628" in out.text, out.text
    assert "She was salvaged in 1961" in out.text


def test_a_coded_body_is_read_whatever_the_sizes_of_its_chunks():
    """A stream is told by its first two bytes (raw deflate or zlib's, the next gzip member or padding), and a chunk
    may hold one byte: deciding at the first chunk took a raw deflate stream that came a byte at a time for zlib's,
    and failed it."""
    import gzip
    import zlib

    page = b"".join(b"<p>Paragraph %d</p>" % i for i in range(3000))
    raw = zlib.compressobj(6, zlib.DEFLATED, -15)
    bodies = {"gzip": [gzip.compress(page), gzip.compress(page[:5000]) + gzip.compress(page[5000:]) + bytes(100)],
              "deflate": [raw.compress(page) + raw.flush(), zlib.compress(page), zlib.compress(page) + b"padding"]}
    for coding, forms in bodies.items():
        for body in forms:
            for size in (1, 2, 3, 4096):
                chunks = iter([body[i:i + size] for i in range(0, len(body), size)])
                assert b"".join(browse._inflated(chunks, coding)) == page, (coding, size)
    with pytest.raises(browse.BrowseError, match="gzip body is corrupt"):
        list(browse._inflated(iter([b"<html>not gzip</html>"]), "gzip"))


def test_a_decompression_bomb_is_stopped_at_the_size_cap_without_inflating_it(server):
    """A page of 500 bytes gzipped twice is 256 MiB of zeros: httpx inflated each network chunk whole, each coding
    multiplying again (2.1 GB in the env's process for a 1 GiB bomb of 1.8 KB). Now the page is read a bounded piece
    at a time, so the size cap stops it with only a few pieces in memory (traced by tracemalloc: zlib's output is
    Python's bytes)."""
    import tracemalloc

    tool = BrowseTool(private_hosts=True, max_bytes=5_000_000)
    tracemalloc.start()
    try:
        out = tool.call(f"{server}/bomb")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.failed and "larger than 5 MB" in out.text, out.text
    assert peak < 32 << 20, f"{peak / 2**20:.0f} MiB held at the peak"
    out = BrowseTool(private_hosts=True).call(f"{server}/brotli")
    assert out.failed and "content encoding 'br' is not supported" in out.text, out.text
