"""`arpo serve` as real processes on 127.0.0.1: OpenEnv's own client resets and steps an arpo env; `RemoteEnv` passes
check_env, forks and restores across servers; 64 concurrent sessions with forks complete; the token, the caps and bad
requests get their status; idle sessions, SIGTERM and a sandbox crash leave the right processes; a killed server is a
clear error; a rollout over remote envs makes the trees a local one makes; ARPOTrainer trains over two servers."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import wait_until

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import arpo_env  # noqa: E402,F401
from arpo_env.remote.client import RemoteEnv  # noqa: E402
from arpo_env.remote.wire import WireError  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
TOKEN = secrets.token_urlsafe(24)
TASK = {"question": "What is 6 * 7?", "answer": "42"}


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (read from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":
                parents[int(entry)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


class Server:
    def __init__(self, *flags: str, token: str = TOKEN) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "ARPO_SERVE_TOKEN": token, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen([sys.executable, "-m", "arpo_algo.cli", "serve", "--port", str(self.port),
                                         "--env_ids", "ARPO-Math-v0", *flags], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        import httpx

        def up() -> bool:
            try:
                return httpx.get(self.url + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return self.process.poll() is not None

        assert wait_until(up, 60) and self.process.poll() is None, self.process.communicate()[1][-2000:]

    def get(self, path: str, token: str | None = TOKEN) -> object:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.url + path, headers=headers, timeout=30)

    def post(self, path: str, body=None, token: str | None = TOKEN, **kw):
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(self.url + path, json=body, headers=headers, timeout=60, **kw)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def token_in_env(monkeypatch):
    monkeypatch.setenv("ARPO_SERVE_TOKEN", TOKEN)


def test_openenvs_own_client_resets_and_steps_an_arpo_env(server):
    from openenv.core.generic_client import GenericEnvClient

    # OpenEnv's client sends no headers of its own: the token rides in the URL as HTTP Basic's password
    with GenericEnvClient(base_url=f"http://arpo:{TOKEN}@127.0.0.1:{server.port}").sync() as client:
        result = client.reset(seed=0)
        assert "Put the final answer in <answer>" in result.observation["text"] and result.done is False
        result = client.step({"action": "<python>print(6 * 7)</python>"})
        assert result.observation["text"] == "\n<result>\n42\n</result>\n" and result.reward == 0.0
        state = client.state()
        assert state["step_count"] == 1 and "print(6 * 7)" in state["completion"]
    schema = server.get("/schema").json()
    assert schema["action"]["required"] == ["action"]
    import asyncio

    from websockets.asyncio.client import connect

    async def hostile() -> list[dict]:
        async with connect(f"ws://127.0.0.1:{server.port}/ws",
                           additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            replies = []
            for message in (b"\x00\xff binary", "{not json", json.dumps({"type": "jump"}),
                            json.dumps({"type": "step", "data": {"action": "hi"}})):
                await ws.send(message)
                replies.append(json.loads(await ws.recv()))
            return replies

    replies = asyncio.run(hostile())
    assert [r["type"] for r in replies] == ["error"] * 4
    assert "JSON text frames" in replies[0]["data"]["message"] and "unknown message type" in \
        replies[2]["data"]["message"] and "reset" in replies[3]["data"]["message"]  # a step before reset
    with pytest.raises(ConnectionError, match="403"):  # without the token the handshake is refused
        with GenericEnvClient(base_url=f"http://127.0.0.1:{server.port}").sync() as client:
            client.reset()


def test_remote_env_passes_check_env_forks_and_a_snapshot_restores_on_another_server(server):
    from gymnasium.utils.env_checker import check_env

    env = gym.make("ARPO-Math-v0", server_url=server.url, max_tool_calls=4)
    assert isinstance(env, RemoteEnv)
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=0, options=TASK)
    assert info["task"]["answer"] == "42" and info["messages"][0]["role"] == "system"
    assert env.step("<python>x = 6 * 7\nprint(x)</python>")[0] == "\n<result>\n42\n</result>\n"
    branch = env.fork()  # a new session there, its interpreter a live fork
    assert branch.step("<python>print(x + 1)</python>")[0] == "\n<result>\n43\n</result>\n"
    assert env.state.budget_used == 1 and branch.state.budget_used == 2
    obs, reward, terminated, truncated, info = env.step("<answer>\\boxed{42}</answer>")
    assert terminated and reward == 1.0 and info["reward_parts"]["correct"]
    snap = branch.snapshot()
    other = Server()  # another server with the same token: the interpreter is rebuilt by replay
    try:
        elsewhere = RemoteEnv(other.url, "ARPO-Math-v0", max_tool_calls=4)
        elsewhere.restore(snap)
        assert elsewhere.state.completion == branch.state.completion
        assert elsewhere.step("<python>print(x * 2)</python>")[0] == "\n<result>\n84\n</result>\n"
        assert elsewhere.score().as_dict()["format_ok"] is False  # no answer yet
        elsewhere.close()
    finally:
        other.stop()
    forged = snap[:-2] + ("00" if not snap.endswith("00") else "11")
    with pytest.raises(ValueError, match="signature does not match"):
        RemoteEnv(server.url, "ARPO-Math-v0").restore(forged)
    for e in (env, branch):
        e.close()


def test_remote_envs_work_under_make_vec(server):
    vec = gym.make_vec("ARPO-Math-v0", num_envs=2, vectorization_mode="sync", server_url=server.url)
    obs, info = vec.reset(seed=0)
    assert len(obs) == 2
    obs, reward, terminated, truncated, info = vec.step(("<python>print(1 + 1)</python>",
                                                          "<python>print(2 + 2)</python>"))
    assert obs[0] == "\n<result>\n2\n</result>\n" and obs[1] == "\n<result>\n4\n</result>\n"
    vec.close()


def test_the_token_the_caps_and_bad_requests_get_their_status(tmp_path):
    server = Server("--max_sessions", "2", "--max_request_mb", "0.01")
    try:
        assert server.get("/metadata", token=None).status_code == 401
        assert server.get("/metadata", token="x" * 24).status_code == 401
        assert server.post("/sessions", {}, token=None).status_code == 401
        assert server.get("/health", token=None).json() == {"status": "healthy"}  # says nothing else
        first = server.post("/sessions", {"env_id": "ARPO-Math-v0"})
        second = server.post("/sessions", {})
        assert first.status_code == second.status_code == 200
        full = server.post("/sessions", {})
        assert full.status_code == 429 and "its cap" in full.json()["detail"]
        sid = first.json()["session"]
        big = server.post(f"/sessions/{sid}/step", {"action": "x" * 20_000})
        assert big.status_code == 413
        import httpx

        chunked = httpx.post(f"{server.url}/sessions/{sid}/step", content=iter([b'{"action": "hi"}']),
                             headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        assert chunked.status_code == 411
        missing = server.post("/sessions/nope/step", {"action": "hi"})
        assert missing.status_code == 404 and "no such session" in missing.json()["detail"]
        early = server.post(f"/sessions/{sid}/step", {"action": "hi"})
        assert early.status_code == 409 and "reset" in early.json()["detail"]
        malformed = server.post(f"/sessions/{sid}/step", {"actions": 5})
        assert malformed.status_code == 422 and "action" in malformed.json()["detail"]

        assert httpx.delete(f"{server.url}/sessions/{second.json()['session']}",
                            headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        refused = server.post("/sessions", {"kwargs": {"data_dir": "/etc"}})
        assert refused.status_code == 403 and "the server sets these" in refused.json()["detail"]
        refused = server.post("/sessions", {"kwargs": {"dataset": "../../secrets.jsonl"}})
        assert refused.status_code == 403
        unknown = server.post("/sessions", {"env_id": "ARPO-QA-v0"})
        assert unknown.status_code == 404 and "serves ARPO-Math-v0" in unknown.json()["detail"]
    finally:
        server.stop()
    no_token = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "serve"], capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "ARPO_SERVE_TOKEN"} | {
                                  "PYTHONPATH": str(ROOT)}, timeout=120)
    assert no_token.returncode == 2 and "no token" in no_token.stderr
    flags = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "serve", "--help"], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120).stdout
    assert "--token_file" in flags and "--token " not in flags  # the token itself is never a flag
    assert "default 127.0.0.1: this machine only" in flags


def test_an_idle_session_is_closed_and_its_sandbox_reaped():
    server = Server("--idle_timeout_s", "2")
    try:
        shared = warm_up(server)
        env = RemoteEnv(server.url, "ARPO-Math-v0")
        env.reset(seed=0)
        env.step("<python>x = 1</python>")
        sandbox = descendants(server.process.pid) - shared
        assert sandbox, "the session's interpreter runs under the server"
        # the client vanishes without closing: the session times out and its interpreter goes
        assert wait_until(lambda: server.get("/metadata").json()["sessions"] == 0, 30)
        assert wait_until(lambda: not alive(sandbox), 30), f"left running: {alive(sandbox)}"
        with pytest.raises(WireError, match="no such session"):
            env.step("<python>print(x)</python>")
    finally:
        server.stop()


def warm_up(server: Server) -> set[int]:
    """The processes a server keeps for all its sessions (the interpreter's template, which forks start from, and
    the scoring workers), started by a first session and left when it closes."""
    env = RemoteEnv(server.url, "ARPO-Math-v0")
    env.reset(seed=0)
    env.step("<python>pass</python>")
    env.close()
    return descendants(server.process.pid)


def test_sigterm_closes_every_session_and_reaps_every_sandbox():
    server = Server()
    shared = warm_up(server)
    envs = [RemoteEnv(server.url, "ARPO-Math-v0") for _ in range(3)]
    for env in envs:
        env.reset(seed=0)
        env.step("<python>y = 2</python>")
    below = descendants(server.process.pid)
    assert len(below - shared) >= 3  # an interpreter each
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once shut down
    assert wait_until(lambda: not alive(below), 20), f"left running: {alive(below)}"


def test_a_killed_server_is_a_clear_error_within_the_deadline_not_a_hang():
    server = Server()
    env = RemoteEnv(server.url, "ARPO-Math-v0", timeout_s=10)
    env.reset(seed=0)
    server.process.kill()
    server.process.wait(10)
    start = time.monotonic()
    with pytest.raises(WireError, match="cannot be reached|did not answer"):
        env.step("<python>print(1)</python>")
    assert time.monotonic() - start < 15
    env.close()  # quiet: nothing is left to close


def test_a_sandbox_crash_in_one_session_leaves_the_others_untouched(server):
    a, b = RemoteEnv(server.url, "ARPO-Math-v0"), RemoteEnv(server.url, "ARPO-Math-v0")
    for env in (a, b):
        env.reset(seed=0)
        env.step("<python>z = 7</python>")
    a.step("<python>secret = 'only in a'</python>")
    assert "NameError" in b.step("<python>print(secret)</python>")[0]  # one session cannot see another's
    crashed = a.step("<python>import os\nos._exit(1)</python>")[0]
    assert "<result>" in crashed  # the model is told; the session goes on
    assert b.step("<python>print(z)</python>")[0] == "\n<result>\n7\n</result>\n"
    for env in (a, b):
        env.close()


def test_64_concurrent_sessions_with_forks_complete():
    server = Server("--max_sessions", "130")
    errors: list[BaseException] = []
    results: list[tuple[str, str]] = []

    def one(i: int) -> None:
        try:
            env = RemoteEnv(server.url, "ARPO-Math-v0", max_tool_calls=4)
            env.reset(seed=i)
            env.step(f"<python>n = {i}</python>")
            branch = env.fork()
            results.append((branch.step("<python>print(n * 2)</python>")[0],
                            env.step("<python>print(n + 1)</python>")[0]))
            branch.close()
            env.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors[:3]
        assert sorted(results) == sorted((f"\n<result>\n{2 * i}\n</result>\n", f"\n<result>\n{i + 1}\n</result>\n")
                                         for i in range(64))
        assert server.get("/metadata").json()["sessions"] == 0
    finally:
        server.stop()


def test_a_rollout_over_remote_envs_makes_the_trees_a_local_one_makes(agent, tokenizer, server):
    from tiny_agent import TASK as SCRIPTED

    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.generation.hf_generator import HFGenerator
    from arpo_algo.rollout.scheduler import ARPORollout

    cfg = RolloutConfig(num_generations=4, num_global=2, alpha=1.0, beta=0.0, max_new_tokens=24,
                        max_completion_tokens=400, temperature=0.3, seed=1)
    kwargs = {"sandbox_options": {"timeout_s": 5}, "max_tool_calls": 4}
    (local,) = ARPORollout(HFGenerator(agent, tokenizer), lambda: gym.make("ARPO-Math-v0", **kwargs).unwrapped,
                           cfg).run([SCRIPTED])
    remote_server = Server("--env_kwargs", json.dumps({"sandbox_options": {"timeout_s": 5}}))
    try:
        (remote,) = ARPORollout(HFGenerator(agent, tokenizer), lambda: gym.make(
            "ARPO-Math-v0", server_url=remote_server.url, max_tool_calls=4), cfg).run([SCRIPTED])
    finally:
        remote_server.stop()
    assert [(n.parent, n.kind) for n in remote.nodes] == [(n.parent, n.kind) for n in local.nodes]
    assert [t.completion_ids for t in remote.trajectories] == [t.completion_ids for t in local.trajectories]
    assert [t.reward for t in remote.trajectories] == [t.reward for t in local.trajectories]
    assert sum(t.tool_calls for t in remote.trajectories) > 0


def test_arpo_trainer_trains_two_steps_on_remote_envs_spread_over_two_servers(undecided, tokenizer, tmp_path):
    import copy
    import math

    from datasets import Dataset
    from tiny_agent import TASK as SCRIPTED

    from arpo_algo.training.config import ARPOConfig
    from arpo_algo.training.trainer import ARPOTrainer

    servers = [Server(), Server()]
    try:
        urls = ",".join(s.url for s in servers)
        args = ARPOConfig(output_dir=str(tmp_path / "run"), num_generations=4, num_global=2, branch_alpha=1.0,
                          branch_beta=0.0, per_device_train_batch_size=4, max_steps=2, max_new_tokens_per_turn=24,
                          max_completion_length=400, temperature=1.0, learning_rate=1e-3, logging_steps=1,
                          report_to="none", save_strategy="no", use_cpu=True, seed=0, gradient_checkpointing=False,
                          gradient_accumulation_steps=1, env_id="ARPO-Math-v0",
                          env_kwargs={"server_url": urls, "max_tool_calls": 4})
        rows = Dataset.from_list([{"prompt": [{"role": "user", "content": SCRIPTED["question"]}], **SCRIPTED}] * 4)
        trainer = ARPOTrainer(copy.deepcopy(undecided), args=args, train_dataset=rows, processing_class=tokenizer)
        trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h]
        assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
        assert all(h["arpo/tool_calls_per_trajectory"] > 0 for h in logs)
        made = [s.get("/metadata").json()["sessions_made"] for s in servers]
        assert all(m > 0 for m in made), made  # both servers held sessions
        assert all(s.get("/metadata").json()["sessions"] == 0 for s in servers)  # every one closed
    finally:
        for s in servers:
            s.stop()


def test_arpo_eval_and_arpo_rollout_run_their_envs_on_a_server(agent, tokenizer, data_dir, tmp_path):
    model_dir = tmp_path / "tiny"
    agent.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    server = Server("--env_kwargs", json.dumps({"data_dir": str(data_dir / "eval")}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        common = ["--model", str(model_dir), "--benchmarks", "gsm8k", "--limit", "2", "--max_new_tokens", "32"]
        local = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "eval", *common, "--data_dir",
                                str(data_dir / "eval"), "--out", str(tmp_path / "local")], capture_output=True,
                               text=True, timeout=600, env=env)
        remote = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "eval", *common, "--server_url", server.url,
                                 "--out", str(tmp_path / "remote")], capture_output=True, text=True, timeout=600,
                                env=env)
        assert local.returncode == 0 and remote.returncode == 0, remote.stderr[-3000:]

        def samples(folder: str) -> list[tuple]:
            rows = [json.loads(line) for line in (tmp_path / folder / "samples.jsonl").read_text().splitlines()]
            return [(r["question"], r["gold"], r["transcript"], r["score"], r["tool_calls"]) for r in rows]

        assert samples("remote") == samples("local") and len(samples("local")) == 2
        out = tmp_path / "trees.jsonl"
        rollout = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "rollout", "--model", str(model_dir),
                                  "--server_url", server.url, "--dataset", "arithmetic:4:3", "--tasks", "2", "-M", "2",
                                  "-N", "1", "--max_new_tokens", "16", "--max_completion_tokens", "64", "--out",
                                  str(out)], capture_output=True, text=True, timeout=600, env=env)
        assert rollout.returncode == 0, rollout.stderr[-3000:]
        assert len(out.read_text().splitlines()) == 2
        assert server.get("/metadata").json()["sessions"] == 0
    finally:
        server.stop()
