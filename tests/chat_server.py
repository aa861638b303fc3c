"""A scripted OpenAI-compatible chat endpoint on 127.0.0.1, for the judge's and ``arpo eval --backend openai``'s
tests."""

from __future__ import annotations

import json


def serve_replies(replies, model="judge-model", listed=None, port=0):
    """An OpenAI-compatible chat endpoint on 127.0.0.1 serving `model` (listed at /v1/models; a request for another
    model is answered 404, as vLLM does) that answers each chat request with the next scripted reply: a string is the
    message (cut at the request's ``max_tokens``, a word a token), an int an error status (with ``Retry-After: 0``), a
    dict the whole answer (a server's odd one). `listed`, if given, is the whole answer to /v1/models; `port`, the
    port to take (0: a free one)."""
    import http.server
    import threading

    queue = list(replies)
    asked_prompts = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, status, payload, headers=()):
            body = json.dumps(payload).encode()
            self.send_response(status)
            for name, value in (("Content-Type", "application/json"), ("Content-Length", str(len(body))), *headers):
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802
            if self.path != "/v1/models":
                return self.answer(404, {"detail": "Not Found"})
            self.answer(200, listed if listed is not None else {"object": "list", "data": [{"id": model,
                                                                                       "object": "model"}]})

        def do_POST(self):  # noqa: N802
            if self.path != "/v1/chat/completions":  # as vLLM: the API is under /v1
                return self.answer(404, {"detail": "Not Found"})
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            asked = request["model"]
            if asked != model:
                return self.answer(404, {"error": {"message": f"The model `{asked}` does not exist.", "code": 404}})
            asked_prompts.append(request["messages"][-1]["content"])
            reply = queue.pop(0)
            if isinstance(reply, int):
                return self.answer(reply, {"error": {"message": "overloaded", "code": reply}}, [("Retry-After", "0")])
            if isinstance(reply, dict):
                return self.answer(200, reply)
            words = reply.split(" ")
            self.answer(200, {"choices": [{"message": {"content": " ".join(words[:request.get("max_tokens")])}}]})

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.prompts = asked_prompts  # what each chat request asked, in order
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
