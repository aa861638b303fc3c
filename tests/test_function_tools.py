"""A user's Python functions as tools: their schemas, calls in the tag protocol, malformed calls, forks, a ToolEnv of
one's own registered under its own id, and TRL's adapter exposing the same tools."""

from __future__ import annotations

import pickle
from typing import Literal

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import arpo_env
from arpo_env import ToolEnv, register_env, tags, tool
from arpo_env.tools.functions import FunctionTool


@tool
def convert(amount: float, unit: Literal["km", "m"] = "km") -> float:
    """Convert a distance to miles.

    Args:
        amount: The distance.
        unit: Its unit, km or m.
    """
    return round(amount * (0.621371 if unit == "km" else 0.000621371), 4)


@tool
def define(term: str) -> str:
    """Look a term up in the glossary."""
    return {"ARPO": "Agentic Reinforced Policy Optimization"}.get(term, f"no entry for {term}")


def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


TASKS = [{"question": "How many miles is 10 km?", "answer": "6.2137"}]


def test_a_function_becomes_a_spec_from_its_signature_and_docstring():
    (spec,) = convert.specs
    assert spec.name == "convert" and spec.description == "Convert a distance to miles."
    assert spec.parameters == {
        "type": "object", "required": ["amount"], "additionalProperties": False,
        "properties": {"amount": {"type": "number", "description": "The distance."},
                       "unit": {"type": "string", "enum": ["km", "m"], "description": "Its unit, km or m.",
                                "default": "km"}}}
    assert convert(10) == 6.2137  # still the function
    assert tags.call_form("convert", spec.parameters) == \
        '<convert>{"amount": number, "unit": string (optional)}</convert>'
    assert tags.call_form("define", define.specs[0].parameters) == "<define>term</define>"


@pytest.mark.parametrize("function, why", [(lambda *xs: 0, "named"), (lambda x: 0, "no type annotation")])
def test_a_function_the_model_cannot_be_told_about_is_refused(function, why):
    with pytest.raises(TypeError, match=why):
        FunctionTool(function, name="f")


@pytest.mark.parametrize("name", ["answer", "result", "think", "two words", "1st", ""])
def test_names_the_protocol_cannot_carry_are_refused(name):
    with pytest.raises(ValueError, match="tag"):
        FunctionTool(divide, name=name)


def test_an_env_calls_functions_with_json_or_text_and_a_bad_call_is_an_observation():
    env = ToolEnv(TASKS, ["python", convert, define, divide], "math", max_tool_calls=20, max_turns=20)
    assert set(env.tool_factories) == {"python", "convert", "define", "divide"}
    prompt = env.system_prompt
    assert '<convert>{"amount": number, "unit": string (optional)}</convert>: Convert a distance' in prompt
    assert "<define>term</define>: Look a term up" in prompt and "<python>code</python>" in prompt
    env.reset(seed=0)
    assert env.step('<convert>{"amount": 10}</convert>')[0] == "\n<result>\n6.2137\n</result>\n"
    assert "Agentic Reinforced" in env.step("<define>ARPO</define>")[0]
    assert "Agentic Reinforced" in env.step('<define>{"term": "ARPO"}</define>')[0]
    answers = {  # each malformed call is an error the model reads, naming the form; the episode goes on
        "<convert>{amount: 10}</convert>": "are a JSON object",
        '<convert>{"amount": "ten"}</convert>': "'amount' of <convert> is number, not string",
        '<convert>{"amount": 1, "units": "km"}</convert>': "has no argument 'units'",
        "<convert>{}</convert>": "needs the argument 'amount'",
        '<convert>["a"]</convert>': "JSON object, not list",
        '<divide>{"a": 1, "b": 0}</divide>': "ZeroDivisionError: division by zero",
        '<divide>{"a": true, "b": 1}</divide>': "is integer, not boolean",
    }
    for action, said in answers.items():
        obs, reward, terminated, truncated, info = env.step(action)
        assert said in obs and info["tool_failed"] and not (terminated or truncated), (action, obs)
    assert env.step('<divide>{"a": 7, "b": 2}</divide>')[0] == "\n<result>\n3.5\n</result>\n"
    obs, reward, terminated, *_ = env.step("<answer>\\boxed{6.2137}</answer>")
    assert terminated and reward == 1.0
    env.close()


def test_a_users_tool_tags_are_opaque_and_read_by_the_format_gate():
    tool_tags = tags.protocol_tags(["convert"])
    text = '<convert>{"note": "</answer> <python>"}</convert>\n<result>\n1\n</result>\n<answer>\\boxed{1}</answer>'
    assert [s.tag for s in tags.tool_calls(text, tool_tags)] == ["convert"]
    assert tags.format_errors(text, tool_tags=tool_tags) == []
    unanswered = '<convert>{"amount": 1}</convert><answer>\\boxed{1}</answer>'
    assert tags.format_errors(unanswered, tool_tags=tool_tags) == ["a <convert> call got no <result>"]
    assert tags.format_errors('<answer>\\boxed{1}</answer><convert>{}</convert>', tool_tags=tool_tags) == \
        ["a tool call after the answer"]


def test_the_env_reads_its_own_tools_tags_in_every_rule():
    env = ToolEnv(TASKS, [convert], "math", max_tool_calls=3)
    env.reset(seed=0)
    obs = env.step('<convert>{"amount": 10')[0]  # cut off
    assert "the <convert> tag is not closed" in obs and "<convert>{" in obs
    obs = env.step('<convert>{"amount": 1}</convert><convert>{"amount": 2}</convert>')[0]
    assert "2 tool calls in one turn" in obs
    obs = env.step("<python>print(1)</python>")[0]
    assert "there is no <python> tool here" in obs and "<convert>…</convert>" in obs
    assert env.stop_strings == ["</python>", "</search>", "</browse>", "</convert>", "</answer>"]
    env.close()


def test_function_tools_fork_for_free_and_a_forked_episode_goes_its_own_way():
    env = ToolEnv(TASKS, ["python", convert], "math", max_tool_calls=5)
    env.reset(seed=0)
    env.step("<python>x = 10</python>")
    child = env.fork()
    assert child.tools["convert"] is env.tools["convert"]  # shared: a function has no state
    assert child.tools["python"] is not env.tools["python"]
    assert "6.2137" in child.step('<convert>{"amount": 10}</convert>')[0]
    assert "print" not in env.completion[len("<python>x = 10</python>"):]
    assert child.state.tool_calls == {"python": 1, "convert": 1} and env.state.tool_calls == {"python": 1}
    snap = child.snapshot()
    again = ToolEnv(TASKS, ["python", convert], "math", max_tool_calls=5)
    again.restore(snap)
    assert again.completion == child.completion and "10" in again.step("<python>print(x)</python>")[0]
    for e in (env, child, again):
        e.close()


def test_an_env_of_ones_own_registers_under_its_id_passes_check_env_and_pickles():
    register_env("Test-Glossary-v0", tasks=[{"question": "What does ARPO stand for?",
                                             "answer": "Agentic Reinforced Policy Optimization"}],
                 tools=[define, convert], reward="qa", replace=True)
    env = gym.make("Test-Glossary-v0")
    assert isinstance(env, ToolEnv)  # the env itself, as arpo's own ids
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    env.step("<define>ARPO</define>")
    copy = pickle.loads(pickle.dumps(env))  # its id, arguments (the functions, by reference) and snapshot
    assert copy.completion == env.completion
    obs, reward, terminated, *_ = copy.step("<answer>\\boxed{Agentic Reinforced Policy Optimization}</answer>")
    assert terminated and reward == 1.0
    with pytest.raises(ValueError, match="registered already"):
        register_env("Test-Glossary-v0", tools=[define])
    env.close()
    copy.close()


def test_any_arpo_env_takes_a_function_beside_its_own_tools():
    env = gym.make("ARPO-Math-v0", tools=["python", convert], max_tool_calls=3)
    env.reset(seed=0, options={"question": "How many miles is 10 km?", "answer": "6.2137"})
    assert "6.2137" in env.step('<convert>{"amount": 10}</convert>')[0]
    assert env.step("<answer>\\boxed{6.2137}</answer>")[1] == 1.0
    env.close()
    with pytest.raises(ValueError, match="two tools are called 'convert'"):
        gym.make("ARPO-Math-v0", tools=[convert, convert])
    with pytest.raises(ValueError, match="a tool of your own is a function or an MCPTools"):
        gym.make("ARPO-Math-v0", tools=["python", 5])


def test_trls_adapter_offers_a_users_tools_with_their_arguments():
    from transformers.utils import get_json_schema

    from arpo_env.integrations.trl_environment import environment_factory

    register_env("Test-Convert-v0", tasks=TASKS, tools=[convert, define], reward="math", replace=True)
    adapter = environment_factory("Test-Convert-v0")()
    names = {n for n in dir(type(adapter)) if not n.startswith("_") and n not in ("reset", "get_reward")}
    assert names == {"convert", "define", "answer"}
    schema = get_json_schema(type(adapter).convert)["function"]
    assert schema["parameters"]["required"] == ["amount"] and schema["description"] == "Convert a distance to miles."
    adapter.reset(question=TASKS[0]["question"], answer=TASKS[0]["answer"])
    assert adapter.convert(amount=10) == "6.2137"
    with pytest.raises(ValueError, match="cannot hold the text '</define>'"):  # it would end the call early
        adapter.define(term="a</define>b")
    assert adapter.define(term="{not json}") == "no entry for {not json}"  # text that looks like JSON stays text
    said = adapter.convert(amount=1, unit="m</convert>")  # "</" does not end the call: the value arrives whole
    assert said.startswith("error:") and 'is one of "km", "m", not "m</convert>"' in said
    adapter.answer(final_answer="6.2137")
    assert adapter.get_reward() == 1.0
    adapter.env.close()


def test_arpo_env_imports_without_the_mcp_sdk_loaded():
    import subprocess
    import sys

    code = "import sys, arpo_env; assert 'mcp' not in sys.modules, 'mcp imported'; print(arpo_env.MCPTools)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert arpo_env.MCPTools.__module__ == "arpo_env.tools.mcp"


def test_a_function_past_its_time_limit_is_an_observation_and_the_episode_goes_on():
    import threading

    release = threading.Event()

    @tool(timeout_s=0.2)
    def slow(seconds: float) -> str:
        """Wait."""
        release.wait(seconds)
        return "done"

    env = ToolEnv(TASKS, [slow], "math", max_tool_calls=3)
    env.reset(seed=0)
    obs, _, terminated, truncated, info = env.step('<slow>{"seconds": 30}</slow>')
    assert "slow did not return within 0.2 s" in obs and info["tool_failed"] and not (terminated or truncated)
    release.set()  # the thread it ran in finishes
    assert "done" in env.step('<slow>{"seconds": 0}</slow>')[0]
    env.close()
    with pytest.raises(ValueError, match="timeout_s must be"):
        FunctionTool(divide, timeout_s=-1)
