"""`arpo serve`: arpo's environments over HTTP and WebSocket, following OpenEnv's protocol, with fork, snapshot and
restore as endpoints (``pip install 'arpo[serve]'``).

    ARPO_SERVE_TOKEN=… arpo serve --env_ids ARPO-Math-v0 --port 8000

OpenEnv's protocol (openenv-core 0.3): ``GET /health``, ``GET /schema``, ``GET /metadata`` and a WebSocket session at
``/ws`` (``{"type": "reset" | "step" | "state" | "close", "data": …}``), so OpenEnv's own ``GenericEnvClient`` resets
and steps an arpo env; ``/envs/<id>/ws`` is the same for each env served. arpo's sessions, which `RemoteEnv` uses:

| request | does |
|---|---|
| ``POST /sessions`` ``{"env_id", "kwargs"}`` | a new session; its id and the env's facts |
| ``POST /sessions/<id>/reset`` ``{"seed", "options"}`` | ``env.reset`` |
| ``POST /sessions/<id>/step`` ``{"action"}`` | ``env.step`` |
| ``GET /sessions/<id>/state`` | where the episode stands |
| ``GET /sessions/<id>/tasks`` | the env's tasks (questions, gold answers, metadata) |
| ``POST /sessions/<id>/score`` | the reward of the transcript as it stands |
| ``POST /sessions/<id>/fork`` | a new session in the same state: transcript, counters, live interpreter |
| ``POST /sessions/<id>/snapshot`` | the state as a signed string |
| ``POST /sessions/restore`` ``{"env_id", "kwargs", "snapshot"}`` | a session from a snapshot signed by this token |
| ``DELETE /sessions/<id>`` | close it and reap its sandbox |

Every request but ``/health`` needs the token: ``Authorization: Bearer <token>`` (or HTTP Basic with the token as the
password, which is how a WebSocket URL ``ws://arpo:<token>@host/ws`` carries it). The token comes from a file
(``--token_file``) or ``$ARPO_SERVE_TOKEN``, never the command line. The server binds 127.0.0.1 unless ``--host`` says
otherwise; it caps sessions (429), request bodies (413) and a session's idle time (then it is closed).
"""


import argparse
import base64
import hmac
import json
import logging
import sys
import threading
from contextlib import asynccontextmanager
from typing import Any, Sequence

from arpo_env.remote.sessions import SessionError, SessionPool
from arpo_env.remote.wire import jsonable, read_token, sign, verify

_log = logging.getLogger("arpo_env.remote")


def authorized(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries the token (Bearer, or Basic with it as the password)."""
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return hmac.compare_digest(value.strip().encode(), token.encode())
    if scheme.lower() == "basic":
        try:
            _, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return hmac.compare_digest(password.encode(), token.encode())
    return False


def env_facts(env: Any) -> dict[str, Any]:
    """What a client mirrors of an env: its budgets, stop strings, tools and number of tasks."""
    return {"max_tool_calls": env.max_tool_calls, "max_turns": env.max_turns, "max_chars": env.max_chars,
            "stop_strings": list(env.stop_strings), "tools": list(env.tool_factories), "num_tasks": len(env.tasks),
            "system_prompt": env.system_prompt}


def make_app(pool: SessionPool, token: str, max_request_bytes: int = 8 << 20, reap_every_s: float = 5.0) -> Any:
    """The server's ASGI app over `pool` (FastAPI)."""
    from fastapi import Body, FastAPI, Request, WebSocket, WebSocketDisconnect
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    stop = threading.Event()

    def reaper() -> None:
        while not stop.wait(reap_every_s):
            for sid in pool.reap_idle():
                _log.info("closed idle session %s", sid[:6])

    @asynccontextmanager
    async def lifespan(app: Any):
        thread = threading.Thread(target=reaper, name="arpo-serve-reaper", daemon=True)
        thread.start()
        try:
            yield
        finally:  # SIGTERM, Ctrl-C: uvicorn ends the lifespan; every session closes and its sandbox is reaped
            stop.set()
            await run_in_threadpool(pool.close_all)

    app = FastAPI(title="arpo serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        if request.url.path != "/health" and not authorized(request.headers.get("authorization"), token):
            return JSONResponse({"detail": "a bearer token is required (Authorization: Bearer <token>)"}, 401,
                                headers={"WWW-Authenticate": "Bearer"})
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_request_bytes):
            return JSONResponse({"detail": f"the request body is over {max_request_bytes:,} bytes"}, 413)
        if length is None and "chunked" in request.headers.get("transfer-encoding", "").lower():
            return JSONResponse({"detail": "a request body needs its Content-Length (no chunked uploads)"}, 411)
        return await call_next(request)

    @app.exception_handler(SessionError)
    async def refused(request: Request, exc: SessionError) -> Any:
        return JSONResponse({"detail": str(exc)}, exc.status)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> Any:
        problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}"
                             for e in exc.errors())
        return JSONResponse({"detail": f"malformed request: {problems}"}, 422)

    default = next(iter(pool.env_ids))

    # OpenEnv's endpoints ------------------------------------------------------------------------------------------
    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "healthy"}

    @app.get("/metadata")
    def metadata() -> dict[str, Any]:
        return {"name": "arpo", "description": "arpo's forkable tool-use environments", "version": "0.1.0",
                "envs": list(pool.env_ids), "sessions": len(pool), "sessions_made": pool.made,
                "max_sessions": pool.max_sessions}

    @app.get("/schema")
    def schema() -> dict[str, Any]:
        text = {"type": "string"}
        return {"action": {"type": "object", "properties": {"action": {**text, "description": "what the model "
                           "generated since the last observation"}}, "required": ["action"]},
                "observation": {"type": "object", "properties": {"text": text, "info": {"type": "object"},
                                "terminated": {"type": "boolean"}, "truncated": {"type": "boolean"}}},
                "state": {"type": "object", "properties": {"episode_id": text, "step_count": {"type": "integer"},
                          "completion": text}}}

    async def openenv_session(websocket: WebSocket, env_id: str) -> None:
        if not authorized(websocket.headers.get("authorization"), token):
            await websocket.close(code=1008)  # refused at the handshake: HTTP 403
            return
        await websocket.accept()
        session_id: str | None = None
        try:
            while True:
                frame = await websocket.receive()
                if frame.get("type") == "websocket.disconnect":
                    break
                raw = frame.get("text")
                if raw is None:  # a binary frame
                    await websocket.send_text(_ws_error("messages are JSON text frames", "INVALID_JSON"))
                    continue
                if len(raw) > max_request_bytes:
                    await websocket.send_text(_ws_error(f"the message is over {max_request_bytes:,} bytes",
                                                        "MESSAGE_TOO_LARGE"))
                    continue
                try:
                    message = json.loads(raw)
                    kind, data = message.get("type"), message.get("data") or {}
                except (ValueError, AttributeError):
                    await websocket.send_text(_ws_error("a message is a JSON object with a type", "INVALID_JSON"))
                    continue
                try:
                    if kind == "close":
                        break
                    if session_id is None:
                        session_id = (await run_in_threadpool(pool.create, env_id, None)).id
                    if kind == "reset":
                        options = data.get("options")
                        obs, info = await run_in_threadpool(pool.run, session_id, "reset", seed=data.get("seed"),
                                                            options=options)
                        session = pool.get(session_id)
                        session.steps, session.episode_id = 0, data.get("episode_id")
                        reply = {"type": "observation", "data": {"observation": {"text": obs, "info": jsonable(info),
                                 "terminated": False, "truncated": False}, "reward": None, "done": False}}
                    elif kind == "step":
                        action = data.get("action", data.get("text")) if isinstance(data, dict) else data
                        obs, reward, terminated, truncated, info = await run_in_threadpool(
                            pool.run, session_id, "step", action)
                        pool.get(session_id).steps += 1
                        reply = {"type": "observation", "data": {"observation": {
                            "text": obs, "info": jsonable(info), "terminated": terminated, "truncated": truncated},
                            "reward": reward, "done": bool(terminated or truncated)}}
                    elif kind == "state":
                        session = pool.get(session_id)
                        state = session.env.state
                        reply = {"type": "state", "data": {"episode_id": session.episode_id,
                                 "step_count": session.steps, "completion": state.completion if state else ""}}
                    else:
                        reply = json.loads(_ws_error(f"unknown message type {kind!r}: reset, step, state or close",
                                                     "UNKNOWN_TYPE"))
                except SessionError as exc:
                    reply = json.loads(_ws_error(str(exc), "EXECUTION_ERROR"))
                await websocket.send_text(json.dumps(reply))
        except WebSocketDisconnect:
            pass
        finally:
            if session_id is not None:
                await run_in_threadpool(pool.close, session_id)

    @app.websocket("/ws")
    async def ws_default(websocket: WebSocket) -> None:
        await openenv_session(websocket, default)

    @app.websocket("/envs/{env_id}/ws")
    async def ws_env(websocket: WebSocket, env_id: str) -> None:
        if env_id not in pool.env_ids:
            await websocket.close(code=1008)
            return
        await openenv_session(websocket, env_id)

    # arpo's sessions --------------------------------------------------------------------------------------------------
    @app.post("/sessions")
    def create(env_id: str | None = Body(None), kwargs: dict[str, Any] | None = Body(None)) -> dict[str, Any]:
        session = pool.create(env_id, kwargs)
        return {"session": session.id, "env_id": session.env_id, "env": env_facts(session.env)}

    @app.post("/sessions/restore")
    def restore(snapshot: str = Body(...), env_id: str | None = Body(None),
                kwargs: dict[str, Any] | None = Body(None)) -> dict[str, Any]:
        try:
            value = verify(snapshot, token)
        except ValueError as exc:
            raise SessionError(400, str(exc)) from None
        session = pool.restore(env_id, kwargs, value)
        return {"session": session.id, "env_id": session.env_id, "env": env_facts(session.env),
                "state": _state(session.env)}

    @app.post("/sessions/{session_id}/reset")
    def reset(session_id: str, seed: int | None = Body(None), options: dict[str, Any] | None = Body(None)
              ) -> dict[str, Any]:
        obs, info = pool.run(session_id, "reset", seed=seed, options=options)
        return {"observation": obs, "info": jsonable(info)}

    @app.post("/sessions/{session_id}/step")
    def step(session_id: str, action: str = Body(..., embed=True)) -> dict[str, Any]:
        obs, reward, terminated, truncated, info = pool.run(session_id, "step", action)
        return {"observation": obs, "reward": reward, "terminated": terminated, "truncated": truncated,
                "info": jsonable(info)}

    @app.get("/sessions/{session_id}/state")
    def state(session_id: str) -> dict[str, Any]:
        return _state(pool.get(session_id).env)

    @app.get("/sessions/{session_id}/tasks")
    def tasks(session_id: str) -> dict[str, Any]:
        return {"tasks": [jsonable(task.as_dict()) for task in pool.get(session_id).env.tasks]}

    @app.post("/sessions/{session_id}/score")
    def score(session_id: str) -> dict[str, Any]:
        return jsonable(pool.run(session_id, "score").as_dict())

    @app.post("/sessions/{session_id}/fork")
    def fork(session_id: str) -> dict[str, Any]:
        return {"session": pool.fork(session_id).id}

    @app.post("/sessions/{session_id}/snapshot")
    def snapshot(session_id: str) -> dict[str, Any]:
        return {"snapshot": sign(jsonable(pool.run(session_id, "snapshot")), token)}

    @app.delete("/sessions/{session_id}")
    def close(session_id: str) -> dict[str, Any]:
        if not pool.close(session_id):
            raise SessionError(404, "no such session: it was closed, timed out after being idle, or never existed")
        return {"closed": session_id}

    return app


def _state(env: Any) -> dict[str, Any] | None:
    """The episode's state as `EpisodeState.to_dict` writes it (None before the first reset)."""
    return jsonable(env.state.to_dict()) if env.state is not None else None


def _ws_error(message: str, code: str) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code}})


# The command ----------------------------------------------------------------------------------------------------------
def make_parser(parser_class: type = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of ``arpo serve`` (`arpo_algo.cli.serve` gives the parser class that takes both spellings)."""
    from arpo_env.registration import ENV_IDS

    p = parser_class(prog="arpo serve", description="Serve arpo environments over HTTP and WebSocket "
                                "(OpenEnv's protocol, with fork, snapshot and restore). The token comes from "
                                "--token_file or $ARPO_SERVE_TOKEN.")
    p.add_argument("--env_ids", nargs="+", default=list(ENV_IDS), help="the environments served (default: arpo's "
                   "three; module:Id for another package's); the first is /ws's")
    p.add_argument("--env_kwargs", default="{}", help="JSON keyword arguments the server gives every env "
                   "it makes (its sandbox, data and backends: clients choose only tasks and budgets)")
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this "
                   "machine only; 0.0.0.0 reaches every interface)")
    p.add_argument("--port", type=int, default=8000, help="default 8000")
    p.add_argument("--token_file", default=None, help="a file holding the token (else $ARPO_SERVE_TOKEN)")
    p.add_argument("--max_sessions", type=int, default=64, help="sessions open at once (default 64); one more "
                   "gets 429")
    p.add_argument("--idle_timeout_s", type=float, default=600.0, help="a session unused this long is closed, "
                   "its sandbox reaped (default 600)")
    p.add_argument("--max_request_mb", type=float, default=8.0, help="the largest request body (default 8)")
    return p


def main(argv: Sequence[str] | None = None, parser_class: type = argparse.ArgumentParser) -> int:
    import gymnasium as gym

    import arpo_env  # noqa: F401 - registers the ids

    args = make_parser(parser_class).parse_args(argv)
    try:
        token = read_token(token_file=args.token_file)
        kwargs = json.loads(args.env_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError("--env_kwargs is a JSON object")
        for env_id in args.env_ids:
            gym.spec(env_id)  # a module:Id imports its module here; an unknown id fails now
        if args.max_sessions < 1 or args.idle_timeout_s <= 0 or args.max_request_mb <= 0:
            raise ValueError("--max_sessions, --idle_timeout_s and --max_request_mb must be above 0")
    except (ValueError, OSError, gym.error.Error, ModuleNotFoundError) as exc:
        print(f"arpo serve: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    try:
        import uvicorn
    except ModuleNotFoundError:
        print("arpo serve: needs the 'serve' extra (uvicorn and fastapi): pip install 'arpo[serve]'", file=sys.stderr)
        return 2
    env_ids = [gym.spec(e).id for e in args.env_ids]
    pool = SessionPool({e: kwargs for e in env_ids}, args.max_sessions, args.idle_timeout_s)
    app = make_app(pool, token, int(args.max_request_mb * (1 << 20)))
    print(f"arpo serve: {', '.join(env_ids)} on http://{args.host}:{args.port} (at most {args.max_sessions} "
          f"sessions, idle ones closed after {args.idle_timeout_s:g} s)", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                ws_max_size=int(args.max_request_mb * (1 << 20)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
