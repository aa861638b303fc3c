"""MCP servers as tools, with real servers: `tests/mcp_server.py` (written with the official SDK) run in a subprocess
over stdio and over streamable HTTP on 127.0.0.1, called from envs, forked each way, driven through a short ARPO
rollout and two ARPOTrainer steps; and its hostile tools (a hang, a crash mid-call, a 10 MB reply, garbage on
stdout, a flood of stderr), each an observation, with no server process left behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import wait_until
from tiny_agent import TASK

pytest.importorskip("mcp")

from arpo_env import MCPTools, ToolEnv, tool  # noqa: E402
from arpo_env.tools.mcp import MCPError  # noqa: E402

pytestmark = pytest.mark.slow

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_server.py"))]


def servers() -> list[int]:
    """The pids of the test server's stdio processes now running (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if any(a.endswith(b"mcp_server.py") for a in argv) and b"http" not in argv and state != "Z":
            found.append(int(entry))
    return found


@pytest.fixture(autouse=True)
def no_server_left():
    assert wait_until(lambda: not servers(), 10), f"servers running before the test: {servers()}"
    yield
    assert wait_until(lambda: not servers(), 15), f"servers left behind: {servers()}"


def pid_of(env) -> int:
    return int(env.step("<pid>{}</pid>")[0].split("<result>\n")[1].split("\n")[0])


def math_env(source, **kwargs):
    return gym.make("ARPO-Math-v0", tools=["python", source], **{"max_tool_calls": 20, "max_turns": 30, **kwargs})


def test_a_stdio_servers_tools_are_listed_offered_and_called_by_their_names():
    source = MCPTools(SERVER, stateless=True, include=["add", "define", "pid"])
    env = math_env(source)
    prompt = env.unwrapped.system_prompt
    assert '<add>{"a": number, "b": number}</add>: Add two numbers.' in prompt
    assert "<define>term</define>: Look a term up in the glossary." in prompt and "<hang>" not in prompt
    env.reset(seed=0, options={"question": "What is 1.5 + 2?", "answer": "3.5"})
    assert env.step('<add>{"a": 1.5, "b": 2}</add>')[0] == "\n<result>\n3.5\n</result>\n"
    assert "Agentic Reinforced Policy Optimization" in env.step("<define>ARPO</define>")[0]
    obs, _, _, _, info = env.step('<add>{"a": 1}</add>')  # read against the listed schema, before the server
    assert "needs the argument 'b'" in obs and info["tool_failed"]
    obs, reward, terminated, *_ = env.step("<answer>\\boxed{3.5}</answer>")
    assert terminated and reward == 1.0
    env.close()


def test_a_stateless_server_is_one_process_shared_by_envs_and_forks():
    source = MCPTools(SERVER, stateless=True, include=["pid", "add"])
    first, second = math_env(source), math_env(source)
    first.reset(seed=0)
    second.reset(seed=1)
    branch = first.unwrapped.fork()
    assert pid_of(first) == pid_of(second) == pid_of(branch)
    assert len(servers()) == 1
    first.close()
    second.close()
    assert pid_of(branch) in servers()  # the fork still holds it
    branch.close()  # the last user: the server stops (the fixture checks)


def test_a_stateful_servers_fork_is_refused_by_default_with_the_ways_out():
    env = math_env(MCPTools(SERVER, include=["bump"]))
    env.reset(seed=0)
    assert "5" in env.step('<bump>{"by": 5}</bump>')[0]
    with pytest.raises(MCPError, match=r"forks are refused .*stateless=True.*fork='replay'"):
        env.unwrapped.fork()
    with pytest.raises(MCPError, match="forks are refused"):
        env.unwrapped.snapshot()
    assert "6" in env.step("<bump>{}</bump>")[0]  # the env goes on, its server's state intact
    env.close()


def test_a_replayed_fork_is_a_new_server_in_the_same_state_and_a_snapshot_travels():
    source = MCPTools(SERVER, fork="replay", include=["bump", "pid"])
    env = math_env(source)
    env.reset(seed=0)
    env.step('<bump>{"by": 40}</bump>')
    parent_pid = pid_of(env)
    branch = env.unwrapped.fork()
    assert "<result>\n42\n" in branch.step('<bump>{"by": 2}</bump>')[0]  # 40 replayed in a new server, then 2
    assert "<result>\n41\n" in env.step('<bump>{"by": 1}</bump>')[0]
    assert pid_of(branch) != parent_pid and len(servers()) == 2
    snap = branch.snapshot()
    assert snap["tools"]["bump"] == {"calls": [["bump", {"by": 40}], ["pid", {}], ["bump", {"by": 2}], ["pid", {}]]}
    elsewhere = math_env(source)
    elsewhere.unwrapped.restore(snap)
    assert "<result>\n42\n" in elsewhere.step('<bump>{"by": 0}</bump>')[0]
    for e in (env, branch, elsewhere):
        e.close()


@pytest.fixture
def http_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([*SERVER, "http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False

    assert wait_until(up, 30), "the HTTP server did not start"
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(10)


def test_a_server_over_http_on_loopback_beside_a_function(http_server):
    @tool
    def double(x: float) -> float:
        """Double a number."""
        return 2 * x

    source = MCPTools(url=http_server, stateless=True, include=["add", "define"])
    env = ToolEnv([{"question": "What is 2 * (1 + 2)?", "answer": "6"}], [source, double], "math", max_tool_calls=4)
    env.reset(seed=0)
    assert env.step('<add>{"a": 1, "b": 2}</add>')[0] == "\n<result>\n3.0\n</result>\n"
    branch = env.fork()
    assert branch.tools["add"].source is source and branch.tools["double"] is env.tools["double"]
    assert branch.step('<double>{"x": 3}</double>')[0] == "\n<result>\n6\n</result>\n"
    assert "no entry for GRPO" in env.step("<define>GRPO</define>")[0]
    assert env.step("<answer>\\boxed{6}</answer>")[1] == 1.0
    env.close()
    branch.close()


def test_a_hostile_server_is_contained_and_each_fault_is_an_observation():
    source = MCPTools(SERVER, stateless=True, timeout_s=2, max_output_chars=2000)
    env = math_env(source)
    env.reset(seed=0)
    first = pid_of(env)
    faults = {"<hang>{}</hang>": "did not answer within 2 s",
              "<crash>{}</crash>": "the MCP server failed during <crash>",
              "<garbage>{}</garbage>": "did not answer within 2 s"}
    for action, said in faults.items():
        obs, _, terminated, truncated, info = env.step(action)
        assert said in obs and info["tool_failed"] and not (terminated or truncated), (action, obs)
        assert env.step('<add>{"a": 2, "b": 2}</add>')[0] == "\n<result>\n4.0\n</result>\n"  # started again
        assert len(servers()) == 1
    assert pid_of(env) != first
    env.close()
    floods = math_env(MCPTools(SERVER, stateless=True, include=["huge", "shout"], max_output_chars=2000))
    floods.reset(seed=0)
    obs = floods.step("<huge>{}</huge>")[0]  # 10 MB: cut, and says so
    assert len(obs) < 2200 and "characters not shown" in obs
    assert floods.step("<shout>{}</shout>")[0] == "\n<result>\ndone\n</result>\n"  # 5 MB of stderr, dropped
    floods.close()


def test_servers_that_cannot_start_or_list_are_one_clear_error():
    with pytest.raises(MCPError, match="could not start or reach the server"):
        math_env(MCPTools(["/nonexistent/server"]))
    with pytest.raises(MCPError, match="could not start or reach the server"):
        math_env(MCPTools([sys.executable, "-c", "print('not a server')"], start_timeout_s=10))
    with pytest.raises(MCPError, match="include names tools the server does not have: nope"):
        math_env(MCPTools(SERVER, stateless=True, include=["nope"]))
    with pytest.raises(MCPError, match="prefix="):  # "1add" cannot be written as a tag
        math_env(MCPTools(SERVER, stateless=True, include=["add"], prefix="1"))
    twice = [MCPTools(SERVER, stateless=True, include=["add"]), MCPTools(SERVER, stateless=True, include=["add"])]
    with pytest.raises(ValueError, match="two tools are called 'add'"):
        gym.make("ARPO-Math-v0", tools=twice)
    for source in twice:
        source.close()
    renamed = gym.make("ARPO-Math-v0", tools=[twice[0], MCPTools(SERVER, stateless=True, include=["add"],
                                                                    prefix="other.")])
    assert {"add", "other.add"} <= set(renamed.unwrapped.tool_factories)
    renamed.close()
    for source in [*twice, renamed.unwrapped.tool_factories["other.add"].source]:
        source.close()


SCRIPT = ['<bump>{"by": 41}</bump>', '<bump>{"by": 1}</bump>', "<answer>\\boxed{42}</answer>"]


def counter_env():
    return ToolEnv([TASK], [MCPTools(SERVER, fork="replay", include=["bump"], timeout_s=20)], "math",
                   max_tool_calls=4)


@pytest.fixture(scope="module")
def counter_agent(tokenizer):
    """A tiny Llama taught to count to 42 on the server's counter, in two calls."""
    from tiny_agent import taught_agent

    env = counter_env()
    model = taught_agent(tokenizer, env, [SCRIPT])
    env.close()
    return model


def test_a_short_arpo_rollout_branches_over_replayed_servers(counter_agent, tokenizer):
    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.generation.hf_generator import HFGenerator
    from arpo_algo.rollout.scheduler import ARPORollout

    cfg = RolloutConfig(num_generations=4, num_global=2, alpha=1.0, beta=0.0, max_new_tokens=24,
                        max_completion_tokens=300, temperature=0.3, seed=1)
    (tree,) = ARPORollout(HFGenerator(counter_agent, tokenizer), counter_env, cfg).run([TASK])
    assert len(tree.trajectories) == 4 and any(n.kind == "branch" for n in tree.nodes)
    assert tree.stats["tool_calls"] > 0
    branched = [t for t in tree.trajectories if tree.nodes[t.node].kind == "branch"]
    # a branch's second call reads 42 only if its new server was brought to 41 by the replay
    assert any(t.reward == 1.0 and "<result>\n42\n</result>" in t.completion_text for t in branched)


def test_arpo_trainer_trains_two_steps_on_an_env_with_mcp_tools(counter_agent, tokenizer, tmp_path):
    import copy
    import math

    from datasets import Dataset

    from arpo_algo.training.config import ARPOConfig
    from arpo_algo.training.trainer import ARPOTrainer

    args = ARPOConfig(output_dir=str(tmp_path / "run"), num_generations=4, num_global=2, branch_alpha=1.0,
                      branch_beta=0.0, per_device_train_batch_size=4, max_steps=2, max_new_tokens_per_turn=24,
                      max_completion_length=300, temperature=1.0, learning_rate=1e-3, logging_steps=1,
                      report_to="none", save_strategy="no", use_cpu=True, seed=0, gradient_checkpointing=False,
                      gradient_accumulation_steps=1, env_id="ARPO-Math-v0")
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": TASK["question"]}], **TASK}] * 2)
    trainer = ARPOTrainer(copy.deepcopy(counter_agent), args=args, train_dataset=rows, processing_class=tokenizer,
                          make_env=counter_env)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert all(h["arpo/tool_calls_per_trajectory"] > 0 for h in logs)


def test_arpo_rollout_takes_an_env_of_ones_own_by_module_and_id(counter_agent, tokenizer, tmp_path):
    """`arpo rollout --env module:Id`: the module registers the env the agent was taught on (an MCP server's tool)."""
    import json

    root = Path(__file__).resolve().parents[1]
    model = tmp_path / "model"
    counter_agent.save_pretrained(model)
    tokenizer.save_pretrained(model)
    (tmp_path / "counter_tools.py").write_text(f'''
import arpo_env

arpo_env.register_env("Counter-v0", tasks=[{TASK!r}], reward="math",
                      tools=[arpo_env.MCPTools({SERVER!r}, fork="replay", include=["bump"])])
''')
    out = tmp_path / "trees.jsonl"
    cmd = [sys.executable, "-m", "arpo_algo.cli", "rollout", "--model", str(model), "--env", "counter_tools:Counter-v0",
           "--env_kwargs", '{"max_tool_calls": 4}', "--tasks", "1", "-M", "4", "-N", "2", "--alpha", "1",
           "--beta", "0", "--temperature", "0.3",
           "--max_new_tokens", "24", "--max_completion_tokens", "300", "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}"})
    assert result.returncode == 0, result.stderr[-3000:]
    (tree,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(tree["trajectories"]) == 4 and any(n["kind"] == "branch" for n in tree["nodes"])
    assert any(t["reward"] == 1.0 for t in tree["trajectories"])
