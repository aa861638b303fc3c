"""`RemoteEnv`: an environment served by `arpo serve`, as a `gymnasium.Env`.

    env = RemoteEnv("http://127.0.0.1:8000", "ARPO-Math-v0", token_file="token.txt", max_tool_calls=3)
    env = gym.make("ARPO-Math-v0", server_url="http://10.0.0.5:8000,http://10.0.0.6:8000")   # the same, spread

A remote step returns what a local step returns. `fork`, `snapshot` and `restore` run on the server: a fork is a new
session there, in the same state, live interpreter included. The client keeps a mirror of what the rollout engine
reads between steps (the transcript, the counters, the budgets), so reading it costs no request. Every request has a
deadline: a server that is gone is a `WireError` within ``timeout_s``, never a hang.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any, Sequence

import gymnasium as gym

from arpo_env.datasets.task import Task
from arpo_env.episode import EpisodeState
from arpo_env.remote.wire import WireError, read_token
from arpo_env.rewards import RewardParts
from arpo_env.spaces import UnicodeText


class RemoteEnv(gym.Env[str, str]):
    """A session of an env on an `arpo serve` server (see the module docstring).

    Args:
        url: The server (``http://host:port``); several, separated by commas, spread sessions across them.
        env_id: The env served there.
        token: The server's token; else read from `token_file` or ``$ARPO_SERVE_TOKEN``.
        token_file: A file holding the token.
        timeout_s: The deadline of every request (a tool call runs within it).
        **env_kwargs: The env's keyword arguments a client may give (tasks and budgets: dataset, tasks,
            max_tool_calls, max_turns, max_chars, tools, strict_think, tool_bonus); the server sets the rest.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, url: str, env_id: str = "ARPO-Math-v0", token: str | None = None,
                 token_file: str | os.PathLike | None = None, timeout_s: float = 120.0, render_mode: str | None = None,
                 **env_kwargs: Any) -> None:
        import httpx

        self.url = _pick(url).rstrip("/")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs)
        self.timeout_s = float(timeout_s)
        self.render_mode = render_mode
        self._token = read_token(token, token_file)
        self._link = _Link(httpx.Client(base_url=self.url, timeout=httpx.Timeout(self.timeout_s, connect=10.0),
                                        headers={"Authorization": f"Bearer {self._token}"}))
        self.session: str | None = None
        reply = self._request("POST", "/sessions", {"env_id": env_id, "kwargs": self.env_kwargs})
        self._adopt(reply)

    def _adopt(self, reply: dict[str, Any]) -> None:
        facts = reply["env"]
        self.session = reply["session"]
        self.max_tool_calls = facts["max_tool_calls"]
        self.max_turns = facts["max_turns"]
        self.max_chars = facts["max_chars"]
        self.stop_strings = list(facts["stop_strings"])
        self.tool_names = list(facts["tools"])
        self.num_tasks = facts["num_tasks"]
        self.system_prompt = facts["system_prompt"]
        self._tasks: list[Any] | None = None
        self._prompt: list[dict[str, str]] = []
        self.observation_space = UnicodeText(max_length=max(self.max_chars, 100_000))
        self.action_space = UnicodeText(max_length=self.max_chars)
        self.state: EpisodeState | None = None
        """The mirror of the server's episode state that the rollout engine reads (the transcript, the counters)."""

    @property
    def tasks(self) -> list[Any]:
        """The remote env's tasks (`arpo_env.datasets.task.Task`), fetched once."""
        if self._tasks is None:
            from arpo_env.datasets.task import Task

            self._tasks = [Task.from_dict(t) for t in self._request("GET", f"/sessions/{self._id()}/tasks",
                                                                    None)["tasks"]]
        return self._tasks

    # Gymnasium API ----------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        reply = self._request("POST", f"/sessions/{self._id()}/reset", {"seed": seed, "options": options})
        self.state = EpisodeState(Task.from_dict(reply["info"]["task"]))
        self._prompt = list(reply["info"].get("messages") or [])
        return reply["observation"], reply["info"]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if isinstance(action, (bytes, bytearray)):
            action = bytes(action).decode("utf-8", errors="replace")
        if not isinstance(action, str):
            raise TypeError(f"an action is the text the model generated (str or UTF-8 bytes), not "
                            f"{type(action).__name__}")
        reply = self._request("POST", f"/sessions/{self._id()}/step", {"action": action})
        info, state = reply["info"], self.state
        if state is not None:  # as the server's env wrote it: the action, then the observation, if any
            state.segments += [("action", action)] + ([("observation", reply["observation"])]
                                                      if reply["observation"] else [])
            state.tool_calls = dict(info["tool_calls_by_tool"])
            state.unavailable_calls, state.refused_calls = info["unavailable_calls"], info["refused_calls"]
            state.turns, state.done = info["turns"], bool(reply["terminated"] or reply["truncated"])
        return reply["observation"], reply["reward"], reply["terminated"], reply["truncated"], info

    def render(self) -> str:
        return self.system_prompt + "\n" + (self.state.completion if self.state else "")

    def close(self) -> None:
        """End the session: its sandbox is reaped on the server. Closing twice, or after the server is gone, is
        quiet."""
        if self.session is not None:
            try:
                self._http.delete(f"/sessions/{self.session}", timeout=10.0)
            except Exception:  # noqa: BLE001 - a server already gone has nothing left to close
                pass
            self.session = None
            self._link.release()
        super().close()

    @property
    def _http(self) -> Any:
        return self._link.client

    # Forkable state ---------------------------------------------------------------------------------------------
    def fork(self) -> "RemoteEnv":
        """A new session on the same server in this one's state (forked there)."""
        reply = self._request("POST", f"/sessions/{self._id()}/fork", {})
        child = self._sibling(reply["session"])
        child.state = self.state.copy() if self.state else None
        return child

    def snapshot(self) -> str:
        """The state as the server's signed string: `restore` takes it on this server or another with the same
        token."""
        return self._request("POST", f"/sessions/{self._id()}/snapshot", {})["snapshot"]

    def restore(self, snapshot: str) -> None:
        reply = self._request("POST", "/sessions/restore", {"env_id": self.env_id, "kwargs": self.env_kwargs,
                                                            "snapshot": snapshot})
        old = self.session
        self._adopt(reply)
        state = reply["state"]
        self.state = EpisodeState.from_dict(state) if state else None
        if self.state is not None:
            from arpo_env import prompts

            self._prompt = [{"role": "system", "content": self.system_prompt},
                            {"role": "user", "content": prompts.user_turn(self.state.task.question)}]
        if old is not None:
            try:
                self._http.delete(f"/sessions/{old}", timeout=10.0)
            except Exception:  # noqa: BLE001
                pass

    def score(self) -> RewardParts:
        """The reward of the transcript as it stands, as the server's env scored it."""
        parts = self._request("POST", f"/sessions/{self._id()}/score", {})
        return RewardParts(**{k: v for k, v in parts.items() if k != "correct"})  # `correct` is derived

    @property
    def messages(self) -> list[dict[str, str]]:
        """The episode as chat messages: system, user and the assistant's side (as `ToolEnv.messages`)."""
        return [*self._prompt, {"role": "assistant", "content": self.state.completion if self.state else ""}]

    # Inside -----------------------------------------------------------------------------------------------------
    def _id(self) -> str:
        if self.session is None:
            raise gym.error.ClosedEnvironmentError("the remote session is closed")
        return self.session

    def _sibling(self, session: str) -> "RemoteEnv":
        """A fork: another session over the same connection pool (a new HTTP client cost more than the fork)."""
        child = object.__new__(type(self))
        child.__dict__.update(self.__dict__)
        child._link.acquire()
        child.session = session
        child._prompt = list(self._prompt)
        child._np_random = None
        return child

    def _request(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        try:
            response = self._http.request(method, path, json=body) if body is not None else self._http.request(
                method, path)
        except httpx.TimeoutException:
            raise WireError(f"{self.url} did not answer within {self.timeout_s:g} s ({method} {path})") from None
        except httpx.TransportError as exc:
            raise WireError(f"{self.url} cannot be reached ({type(exc).__name__}: {exc}); is arpo serve running "
                            "there?") from None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text[:300]
            if response.status_code == 409 and "reset" in str(detail):
                raise gym.error.ResetNeeded(str(detail))
            if response.status_code == 400:
                raise ValueError(f"{self.url}: {detail}")
            raise WireError(f"{self.url} answered {response.status_code}: {detail}")
        return response.json()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a RemoteEnv is a live session; pickle env.snapshot() and restore it into another RemoteEnv")


class _Link:
    """The HTTP client a session and its forks share (thread-safe), closed with the last of them."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._users = 1
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.client.close()


_NEXT: dict[str, itertools.count] = {}
_NEXT_LOCK = threading.Lock()


def _pick(urls: str | Sequence[str]) -> str:
    """One of several servers, in turn for each new env of the process (sessions spread across them)."""
    if isinstance(urls, str):
        urls = [u.strip() for u in urls.split(",") if u.strip()]
    urls = list(urls)
    if not urls:
        raise ValueError("server_url names no server")
    key = ",".join(urls)
    with _NEXT_LOCK:
        counter = _NEXT.setdefault(key, itertools.count())
        return urls[next(counter) % len(urls)]
