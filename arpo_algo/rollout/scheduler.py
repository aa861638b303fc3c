"""Entropy-adaptive branching rollouts (ARPO) and independent rollouts (GRPO) over arpo_env environments.

ARPO, per task:

1. sample N global trajectories;
2. record each trajectory's *initial entropy* H₀: the entropy of the first k tokens of its response, summed
   (`arpo_algo.core.entropy.window_entropy`: per-token entropies of the sampling distribution normalised by ln|V|,
   summed over the window as the reference code does, so H ∈ [0, k]);
3. after every tool result, measure the entropy H of the first k generated tokens the same way; ΔH = H − H₀, and
   with probability P = clip(α + β·ΔH, 0, 1) branch Z−1 extra ways from the point right after the result — the
   environment is forked (a live copy of the interpreter, made in the tool pool before the parent's next step, while
   the branch generates) and the token prefix and its key/value cache are shared — while the task has fewer than M
   trajectories;
4. as soon as a task is certain to end with fewer than M (even if every live path branched at each tool step it has
   left, Z^r paths each, they could not make up the shortfall), top up with fresh samples, in the same batch as
   everything else; exactly M per task. Top-ups are trajectory-level samples, as in the paper's termination step:
   they do not branch.

Spare samples take the top-ups' wait off the critical path. A task keeps fresh samples under way ahead of its
top-ups while it can still fall short of M (its finished and live paths make fewer): ``min_spare_samples`` (1 by
default) under way from the start, and up to ``spare_samples`` (2) under way while it is expected to fall short (a
spare that has finished waits to be taken and is no longer under way: another may start beside it): its finished
trajectories, plus what each live path is expected to grow into, (1 + (Z−1)·p̄)^q with p̄ the mean branching
probability of the rollout's decisions so far and q the path's expected tool steps left (from the mean over
finished paths, with one more at the full budget as a prior), plus one per top-up, fall short of M by at least
one half. The expectation comes too late on its own: paths that make the same number of tool calls end together,
and only then does the mean say how many each makes, so a task whose paths branched little learned it needed a
top-up when the others were ending, and its top-up ran alone after them. Spares are not part of the tree and take no
branch budget. When the task needs a top-up it takes its spares first, in the order they started (a spare is then
already under way, or already finished), and starts a new sample only when none is left. As soon as a task cannot
need a spare any more (its finished and live paths would make M even without another branch), the spare is stopped
and its work discarded. Which spares run depends on the tree's own events and on when spares finish, and a taken
spare is exactly the fresh sample a top-up would have drawn (top-up j draws from its own stream, whenever it starts):
so spares change when top-ups run, not what trees the rollout draws. Their cost is the discarded spares' tokens and
tool calls, reported in `spares`.

H₀ belongs to each trajectory and is measured anew for every task and batch (the reference implementation kept a
table across batches). GRPO is the same machinery with N = M and no branching.

Scheduling (`ARPORollout.run`): each path is driven on its own (generate a segment, run its tool call in a thread
pool, generate again). Three kinds of backend:

* continuous batching in steps (transformers, the default): a poll runs decoding steps until some path ends; the
  paths still generating stay in the batch, a path's env step overlaps the next poll and is waited for after it,
  and the path rejoins the running batch at the poll after that (so tool calls are off the critical path, no path
  waits for another's segment, and what happens depends only on the seed, not on how long tools take);
* lock-step rounds (transformers with ``continuous=False``): every waiting path of every task joins one batch per
  round, and a round's tool calls all return before the next;
* asynchronous (vLLM: each path its own request, continuously batched): a path goes on the moment its tool result
  is back, and tool calls overlap generation.

On the transformers backend and vLLM's engine ARPO's decision is taken as soon as the segment's first k tokens are
sampled; the branches it can make have been generating since the segment started (speculative branches, kept if the
decision branches and dropped if not: `RolloutConfig.speculative_branches`), or, without speculation, join the
running batch then.

What a seed fixes: each branch decision draws from its own generator, seeded by (seed, task, path, tool step), and
each request is sampled with its own seed on the vLLM backends, so neither depends on the order of events. On the
transformers backend the whole rollout is reproducible, whatever the tools' timing (polls and rounds are
deterministic and every request samples from a stream of its own; continuous batching and lock-step rounds draw
different trees), as long as the tools answer alike (a cell that prints an object's address, the clock or fresh
entropy does not, and the path that reads it goes on differently). On vLLM, when a top-up becomes certain depends on
timing, and batch composition can change logits in the last bits, so trees can differ between runs of the same seed;
M per task holds always.
"""

from __future__ import annotations

import math
import numbers
import threading
import time
import warnings
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from arpo_algo.core.branching import (
    capacity,
    decide,
    expected_trajectories,
    speculation_pays,
    top_ups_needed,
    uniform_draw,
)
from arpo_algo.core.config import RolloutConfig, entropy_estimator
from arpo_algo.core.entropy import window_entropy
from arpo_algo.core.tree import RolloutTree, Trajectory
from arpo_algo.generation.models import prompt_ids, text_ids
from arpo_algo.generation.protocol import Generator, Path, SamplingParams, Segment
from arpo_algo.rollout.paths import PathState, Phase, TaskState
from arpo_env import tags


class ARPORollout:
    """Rollouts of `generator` on tasks of the environments `make_env()` returns.

    Args:
        generator: any `arpo_algo.generation.protocol.Generator`.
        make_env: returns a fresh (unwrapped) `arpo_env.ToolEnv`; one is made per task and forked per path.
        config: `RolloutConfig`.
    """

    algo = "arpo"

    def __init__(self, generator: Generator, make_env: Callable[[], Any], config: RolloutConfig | None = None,
                 progress: Callable[[int], None] | None = None) -> None:
        self.generator = generator
        self.make_env = make_env
        self.config = config or RolloutConfig()
        self.progress = progress
        self.generator.seed(self.config.seed)
        self.tool_calls = 0
        self.turns = 0
        self.prompt_tokens = 0
        """The tasks' prompts, one each (every sample of a task forks its prompt: encoded once on the transformers
        backend, by the prefix cache on vLLM)."""
        self.observation_tokens = {"tool results": 0, "notices": 0}
        """Tokens the environments appended to paths: tool results (branches share those before their branch point),
        and notices (a malformed turn's error, a budget's end) that answer a turn without a tool call."""
        self.notices = 0
        self.env_seconds = 0.0
        """Wall time the rollout spent in the environments instead of generating: resets, the forks of fresh paths,
        scoring and closes, and the waits for tool calls while nothing else could run (a round's concurrent calls
        count once; on an asynchronous backend, calls that overlap generation do not count)."""
        self.step_seconds = 0.0
        """The env work done in the tool pool, summed whether it overlapped generation or not: steps (tool calls
        included) and the forks made for branches."""
        self.speculative = {"started": 0, "kept": 0}
        """Speculative branches (`RolloutConfig.speculative_branches`): started, and kept by their decision (the
        tokens of the others are the generator's ``stats.speculative_tokens``)."""
        self.spares = {"started": 0, "taken": 0, "discarded": 0, "discarded_tokens": 0, "discarded_tool_calls": 0}
        """Spare samples: started, taken as top-ups, and discarded because their task did not need them, with the
        tokens the discarded ones had generated and the tool calls they had made (counted in `tool_calls` and in
        the generator's stats too: they were spent)."""
        self._new_batch()  # what the scheduler learns within a batch: `_seen`, `_deltas`
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # the tool pool of the rollout under way
        self._closing: list[Future] = []  # the envs it is closing
        self._made: list[Any] = []  # the forks it made: closed if it stops on an error

    def _new_batch(self) -> None:
        """Forget what the batch before saw: the scheduler's estimates are learned within each `run` (the first paths
        of a batch to end say more about its tasks than the last batch does), also when one engine runs several
        batches (`arpo rollout --batch-tasks`)."""
        self._seen: dict[str, float] = {"p": 0.0, "decisions": 0, "tool_steps": 0, "ended": 0}
        """What this batch has seen so far (its expected-shortfall estimate reads it): the sum of the branching
        probabilities of its decisions, and the tool steps of its finished paths."""
        self._deltas: list[float] = []
        """The ΔH of this batch's decisions so far: which branches start speculatively reads a quantile of them."""

    @contextmanager
    def _env_time(self) -> Iterator[None]:
        """Count the wall time of the block as time spent in the environments (`env_seconds`)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.env_seconds += time.perf_counter() - began

    @contextmanager
    def _pool_time(self) -> Iterator[None]:
        """Count the wall time of the block (run in the tool pool) as env work done there (`step_seconds`)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.step_seconds += time.perf_counter() - began

    # ----------------------------------------------------------------------------------------------------------------
    def run(self, tasks: Sequence[dict[str, Any] | int],
            on_tree: Callable[[int, RolloutTree], None] | None = None) -> list[RolloutTree]:
        """One tree per task. A task is an index into the env's dataset or ``{"question": …, "answer": …}``.
        `on_tree(i, tree)` is called as soon as task i's tree is complete (an interrupted run keeps its work).

        Paths are driven one by one: a path asks the generator for its next segment, then its tool call runs in a
        thread pool, then it asks again. With a lock-step generator (transformers) every poll is one batch over all
        waiting paths and the tool calls of a batch all return before the next one (so a seed fixes the trees).
        With an asynchronous one (vLLM) a path whose tool result is back is resubmitted at once, while the others
        are still generating or running tools."""
        self._new_batch()
        states = self._start_tasks(_checked_tasks(tasks))
        loop = _Loop(self.generator, self.config, len(states))
        stops = {stop for state in states for stop in getattr(state.root_env, "stop_strings", ())}
        if stops - set(loop.params.stop):  # the envs' own tools close their calls with tags of their own
            loop.params = replace(loop.params, stop=tuple(dict.fromkeys([*loop.params.stop, *sorted(stops)])))
        try:
            if hasattr(self.generator, "encode"):  # every sample of a task forks its prompt, encoded once
                self.generator.encode([state.root_path for state in states])
            for t, state in enumerate(states):
                loop.ready += [self._global(t, state) for _ in range(self._initial(self.config))]
            loop.ready += self._spare_up(states, loop.ready, loop.ready, {})
            with ThreadPoolExecutor(max_workers=self.config.max_tool_workers) as pool:
                self._pool = pool
                while loop.ready or loop.generating or loop.tools:
                    self._generate(loop, states)
                    self._collect_steps(loop, states)
                    live = loop.ready + list(loop.generating.values()) + list(loop.tools.values())
                    loop.ready += self._top_up_short_tasks(states, live)
                    loop.ready += self._spare_up(states, live, loop.ready, loop.generating)
                    self._complete_trees(loop.trees, states, on_tree)
        except BaseException:  # the generator's error, an env's, an interrupt: no env of the run is left open
            self._pool = None
            self._abandon(states, loop.generating)
            raise
        self._pool = None
        self._made = []
        trees = [tree if tree is not None else self._tree(state) for tree, state in zip(loop.trees, states)]
        for future in self._closing:  # done: the pool's exit waited for them
            if future.exception() is not None:
                warnings.warn(f"an environment failed to close: {future.exception()!r}", RuntimeWarning, stacklevel=2)
        self._closing = []
        return trees

    def _start_tasks(self, tasks: list[dict[str, Any] | int]) -> list[TaskState]:
        """Make and reset one env per task and encode its prompt. A task the env refuses closes the envs made for
        the tasks before it, and raises."""
        states: list[TaskState] = []
        for t, task in enumerate(tasks):
            env = None
            try:
                with self._env_time():
                    env = self.make_env()
                    options = {"index": int(task)} if isinstance(task, numbers.Integral) else dict(task)
                    _, info = env.reset(seed=self.config.seed + t, options=options)
                prompt = prompt_ids(self.generator.tokenizer, info["messages"])
                states.append(TaskState(info["task"], env, prompt, self.generator.new_path(prompt)))
            except BaseException:
                self._made += [env] if env is not None else []
                self._abandon(states, {})
                raise
            self.prompt_tokens += len(prompt)
        return states

    def _generate(self, loop: _Loop, states: list[TaskState]) -> None:
        """Submit the paths that are ready, poll the generator once, and start the env step of every segment it
        brought (in the tool pool); a decision's branches are ready at once."""
        ready, loop.ready = loop.ready, []
        for path in ready:
            for child in self._lagged_decision(path, states):  # the reference's timing: decided before the segment
                self._submit(child, loop.params, states, loop.generating)
            self._submit(path, loop.params, states, loop.generating)
        if not loop.generating:
            return
        events = self.generator.poll()
        cohort = []
        for key, seg in events:
            path = loop.generating.pop(key)
            loop.ready += self._on_segment(path, seg, states)
            path.stepping = True
            future = self._pool.submit(self._step, path, seg.text)
            loop.tools[future] = path
            cohort.append(future)
        if loop.stepped:
            loop.cohorts.append(cohort)
        if loop.lockstep or events:
            self.turns += 1  # a node's `turn`: the round (the poll that brought segments) it starts in

    def _collect_steps(self, loop: _Loop, states: list[TaskState]) -> None:
        """Take the env steps that are due: on a stepped backend a poll's steps overlap the next poll, then are waited
        for (reproducible); lock-step, all of them; asynchronous, those done (waiting only when nothing else can
        run). Paths that go on are ready."""
        if not loop.tools:
            return
        idle = not (loop.generating or loop.ready)  # nothing else to do: waiting is on the critical path
        if loop.stepped:
            due = [f for cohort in (loop.cohorts if idle else loop.cohorts[:-1]) for f in cohort]
            loop.cohorts = [] if idle else loop.cohorts[-1:]
            with self._env_time():
                wait(due, return_when=ALL_COMPLETED)
        else:
            if loop.lockstep or idle:
                with self._env_time():
                    wait(loop.tools, return_when=ALL_COMPLETED if loop.lockstep else FIRST_COMPLETED)
            due = [f for f in loop.tools if f.done()]  # in submission order
        for future in due:
            path = loop.tools.pop(future)
            path.stepping = False
            if self._on_step(path, future.result(), states):
                loop.ready.append(path)

    def _complete_trees(self, trees: list[RolloutTree | None], states: list[TaskState],
                        on_tree: Callable[[int, RolloutTree], None] | None) -> None:
        """Close the tree of every task with M trajectories and no live path, and hand it to `on_tree`."""
        for t, state in enumerate(states):
            if trees[t] is None and state.live == 0 and len(state.done) >= self.config.num_generations:
                trees[t] = self._tree(state)
                if on_tree:
                    on_tree(t, trees[t])

    def _tree(self, state: TaskState) -> RolloutTree:
        self._close_env(state.root_env)
        cfg = self.config
        return RolloutTree(state.task, self.algo, state.nodes, state.done,
                           {"branches": sum(n.kind == "branch" for n in state.nodes),
                            "tool_calls": sum(tr.tool_calls for tr in state.done),
                            "entropy": entropy_estimator(cfg.entropy_top_logprobs, cfg.entropy_timing)})

    def _initial(self, cfg: RolloutConfig) -> int:
        return cfg.num_global

    def _spares(self, cfg: RolloutConfig) -> int:
        """The reserve of spares per task: only a task that can fall short of M (with branching) can need one."""
        return cfg.spare_samples if self._branching() and cfg.num_global < cfg.num_generations else 0

    def _branching(self) -> bool:
        return self.config.branching

    def _step(self, path: PathState, text: str) -> tuple:
        """The path's env step, in the tool pool (after its branches' forks: jobs submitted earlier to the same
        first-in-first-out pool, so already running or done)."""
        if path.forking is not None:
            path.forking.result()
            path.forking = None
        env = path.environment()
        with self._pool_time():
            return env.step(text)

    # One path's turn ------------------------------------------------------------------------------------------------
    def _submit(self, path: PathState, params: SamplingParams, states: list[TaskState], generating: dict[int, PathState]
                ) -> None:
        """Ask for the path's next segment (shorter near its token budget or the model's context, the generator's
        `max_length`; a path at either ends truncated). Its sampling seed is its own (task, node, turn): the same on
        an asynchronous backend whatever the order."""
        cfg = self.config
        room = min(params.max_new_tokens, cfg.max_completion_tokens - len(path.completion))
        limit = getattr(self.generator, "max_length", None)
        if limit:  # the model's context: a long prompt or tool result can reach it before the token budget does
            room = min(room, limit - len(path.seq.tokens))
        if room <= 0:
            self._end_path(path, states[path.task], truncated=True)
            return
        key = id(path)
        generating[key] = path
        request = replace(params, max_new_tokens=room, seed=self._seed(path))
        if self._decides(path) and getattr(self.generator, "decides_mid_segment", False):
            path.phase = Phase.DECIDED  # decided during generation: not again when the segment is back
            speculative = self._speculate(path, states[path.task])

            def decide(entropies: list[float]) -> list[tuple[int, Path, SamplingParams]]:
                children = self._maybe_branch(path, window_entropy(entropies, cfg.entropy_k), len(path.completion),
                                              len(path.seq.tokens), states[path.task], self.turns, speculative)
                for child in children:
                    generating[id(child)] = child
                # A child's request is the one it would have made itself: the same room, its own seed.
                return [(id(child), child.seq, replace(request, seed=self._seed(child))) for child in children]

            if speculative:
                self.generator.submit(path.seq, request, key, decide,
                                      [(id(c), c.seq, replace(request, seed=self._seed(c))) for c in speculative])
            else:
                self.generator.submit(path.seq, request, key, decide)
        else:
            self.generator.submit(path.seq, request, key)

    def _seed(self, path: PathState) -> int:
        """The request seed of the path's next segment: from (seed, task, stream, segment), whatever the order."""
        entropy = [self.config.seed, path.task, path.stream, len(path.segments)]
        return int(np.random.SeedSequence(entropy).generate_state(1)[0])

    def _decides(self, path: PathState) -> bool:
        """Whether the path's next segment is one ARPO takes a branch decision on (the first after a tool result;
        never on a top-up, a trajectory-level sample)."""
        return path.phase is Phase.AFTER_TOOL and path.topup is None and self._branching()

    def _lagged_decision(self, path: PathState, states: list[TaskState]) -> list[PathState]:
        """With ``entropy_timing="lagged"`` (the reference code's timing), the decision on the segment after a tool
        result is taken before that segment, on the window of the segment before it (the one that wrote the call;
        for the first call, the first window: ΔH = 0). Its branches start with the segment."""
        if self.config.entropy_timing != "lagged" or not self._decides(path):
            return []
        path.phase = Phase.DECIDED
        return self._maybe_branch(path, path.last_h, len(path.completion), len(path.seq.tokens), states[path.task],
                                  self.turns)

    def _on_segment(self, path: PathState, seg: Segment, states: list[TaskState]) -> list[PathState]:
        """Record a generated segment; returns the branches made from it (ARPO's decision after a tool result)."""
        start = len(path.completion)
        self._record(path, seg)
        branches = []
        if path.phase is Phase.FIRST:
            path.h0 = seg.entropy
        elif self._decides(path):
            branches = self._maybe_branch(path, seg.entropy, start, len(path.seq.tokens) - len(seg.token_ids),
                                          states[path.task], self.turns + 1)
        path.last_h = seg.entropy
        path.phase = Phase.PLAIN  # until its env step says what comes next
        return branches

    def _on_step(self, path: PathState, result: tuple, states: list[TaskState]) -> bool:
        """The env's answer to the path's segment: the path ends, or takes the observation and goes on (True)."""
        obs, _reward, terminated, truncated, info = result
        if info.get("tool"):
            self.tool_calls += 1
            path.steps += 1
        if path.cancelled:  # a spare stopped while its tool ran
            self.spares["discarded_tool_calls"] += bool(info.get("tool"))
            self._close_env(path.environment())
            return False
        path.tool_steps_left = self._tool_steps_left(path.environment())
        if terminated or truncated:
            self._end_path(path, states[path.task], truncated=truncated, observation=obs,
                           parts=info.get("reward_parts"))
            return False
        ids = text_ids(self.generator.tokenizer, obs)
        limit = getattr(self.generator, "max_length", None)
        if len(path.completion) + len(ids) > self.config.max_completion_tokens or (
                limit and len(path.seq.tokens) + len(ids) > limit):
            # Past the token budget, which bounds a trajectory, tool outputs included (TRL's max_completion_length:
            # a trainer's memory is sized by it), or past the model's context, which a trainer's forward pass must
            # not exceed either (TRL drops such a result too): the path ends before it, and the result is in the
            # record, not in the tokens. A 6,000-character page made a 320-token budget 1,800.
            self._end_path(path, states[path.task], truncated=True, observation=obs)
            return False
        self.generator.extend(path.seq, ids)
        self.observation_tokens["tool results" if info.get("tool") else "notices"] += len(ids)
        self.notices += not info.get("tool")
        path.segments.append({"kind": "tool", "text": obs, "start": len(path.completion),
                           "end": len(path.completion) + len(ids)})
        path.completion += ids
        path.mask += [0] * len(ids)
        path.logprobs += [0.0] * len(ids)
        path.entropies += [None] * len(ids)
        path.phase = Phase.AFTER_TOOL if info.get("tool") is not None else Phase.PLAIN
        return True

    def _record(self, path: PathState, seg: Segment) -> None:
        start = len(path.completion)
        path.completion += seg.token_ids
        path.mask += [1] * len(seg.token_ids)
        path.logprobs += seg.logprobs
        path.entropies += list(seg.entropies) + [None] * (len(seg.token_ids) - len(seg.entropies))
        path.segments.append({"kind": "model", "text": seg.text, "start": start, "end": len(path.completion),
                           "pieces": self._pieces(seg.token_ids[:len(seg.entropies)])})

    def _pieces(self, ids: list[int]) -> list[str]:
        """The text of each measured token, decoded incrementally so that the pieces join into the decoded prefix
        (a character split over two tokens lands in the second); `arpo view` colours them by entropy."""
        tok = self.generator.tokenizer
        pieces, before = [], ""
        for i in range(1, len(ids) + 1):
            text = tok.decode(ids[:i], skip_special_tokens=False)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the token that completes it
                pieces.append("")
                continue
            pieces.append(text[len(before):])
            before = text
        return pieces

    # Branching ------------------------------------------------------------------------------------------------------
    def _speculate(self, path: PathState, state: TaskState) -> list[PathState]:
        """The branches the decision on the path's next segment can make, to start with that segment
        (`RolloutConfig.speculative_branches`): Z − 1, fewer if the task's budget is smaller (it never grows), none
        where the backend cannot or the task has its M, and none where the decision is less likely to keep them
        than `speculative_min_keep`. Its draw is known now (`_draw`), its ΔH only k tokens on: they start if the draw
        is below the P of the (1 − min_keep) quantile of the ΔH of this batch's decisions so far (ΔH = 0 before any;
        at 0.5 their median), so that at least that share of them would keep the branches if ΔH were drawn from
        those; at 0 they start whatever the draw. Not in the tree, nor counted, until the decision keeps them."""
        cfg = self.config
        if not (cfg.speculative_branches and getattr(self.generator, "speculates", False)):
            return []
        if not speculation_pays(self._draw(path), cfg.alpha, cfg.beta, self._deltas, cfg.speculative_min_keep):
            return []
        count = min(cfg.branch_factor - 1, cfg.num_generations - (len(state.done) + state.live))
        children = [self._child(path, i, len(path.completion), len(path.seq.tokens)) for i in range(max(0, count))]
        self.speculative["started"] += len(children)
        return children

    def _child(self, path: PathState, i: int, start: int, at: int) -> PathState:
        """The path's i-th branch at token `at` (completion offset `start`), before it is a node of the tree. Its
        stream is named by its parent's stream, tool step and i, so it draws alike whenever it starts."""
        stream = int(np.random.SeedSequence([path.stream, path.steps, i]).generate_state(1, np.uint64)[0])
        # The child re-generates this segment itself: it is after a tool result, but takes no decision on it.
        return PathState(path.task, -1, self.generator.fork(path.seq, at=at), None, stream=stream,
                         completion=path.completion[:start], mask=path.mask[:start], logprobs=path.logprobs[:start],
                         entropies=path.entropies[:start],
                         segments=[dict(s) for s in path.segments if s["kind"] != "model" or s["start"] < start],
                         h0=path.h0, last_h=path.last_h, phase=Phase.DECIDED, steps=path.steps,
                         tool_steps_left=path.tool_steps_left)

    def _maybe_branch(self, path: PathState, h: float | None, start: int, at: int, state: TaskState, turn: int,
                      speculative: Sequence[PathState] = ()) -> list[PathState]:
        """ARPO's decision on the segment after a tool result, whose window entropy is `h`: the branches (forks of
        the path at token `at`, completion offset `start`, or the `speculative` ones started with the segment)
        starting in round `turn`; none if the draw says so or the task has its M. Taken while the segment generates
        (transformers, vLLM's engine) or once it is back."""
        cfg = self.config
        room = cfg.num_generations - (len(state.done) + state.live)
        decision = decide(h, path.h0, self._draw(path), cfg.alpha, cfg.beta, cfg.branch_factor, room)
        if decision is None:  # an empty segment has no entropy: no decision on it
            return []
        delta, p, count = decision.delta_h, decision.p, decision.new_paths
        path.decisions.append({"step": path.steps, "token": start, "delta_h": delta, "p": p,
                               "branched": decision.branched})
        self._seen["p"] += p
        self._seen["decisions"] += 1
        if math.isfinite(delta):
            self._deltas.append(delta)
        if not decision.branched:
            return []
        children = []
        path.forking = self._pool.submit(self._forks, path.environment(), count)
        for i in range(count):
            child = speculative[i] if i < len(speculative) else self._child(path, i, start, at)
            child.node = state.new_node(path.node, start, "branch", turn, step=path.steps, delta_h=delta, p=p)
            child.turn, child.env_job = turn, (path.forking, i)
            state.live += 1
            children.append(child)
        self.speculative["kept"] += min(count, len(speculative))
        return children

    def _draw(self, path: PathState) -> float:
        """The uniform draw of the path's decision at its current tool step: it branches if the draw is below P. From
        (seed, task, stream, tool step): the same in any event order, and known before the segment it decides on."""
        return uniform_draw(self.config.seed, path.task, path.stream, path.steps)

    def _abandon(self, states: list[TaskState], generating: dict[int, PathState]) -> None:
        """Close every env of a run that stopped on an error, or on a task its env refused (the tasks' own, the one
        that refused, and all their forks: closing one twice does nothing) and drop the requests still generating.
        They were left open, each holding its sandbox's process until the process ended: a notebook or a trainer that
        goes on after the error kept them all."""
        for key in list(generating):
            try:
                self.generator.cancel(key)
            except Exception:  # noqa: BLE001 - the generator that failed: its requests go with it
                pass
        envs = {id(env): env for env in [*(state.root_env for state in states), *self._made]}
        self._made, self._closing = [], []
        for env in envs.values():
            try:
                with self._env_time():
                    env.close()
            except Exception as exc:  # noqa: BLE001 - the others are closed all the same; the run's error is raised
                warnings.warn(f"an environment failed to close: {exc!r}", RuntimeWarning, stacklevel=3)

    def _close_env(self, env: Any) -> None:
        """Close an env that is done with (its sandbox's process killed, its working directory removed) off the
        critical path: in the tool pool while the rollout runs (its time counts in `step_seconds`), else here."""
        if self._pool is not None:
            try:
                self._closing.append(self._pool.submit(self._close_env_in_pool, env))
                return
            except RuntimeError:  # the pool of a rollout that stopped on an error: shut down
                pass
        with self._env_time():
            env.close()

    def _close_env_in_pool(self, env: Any) -> None:
        with self._pool_time():
            env.close()

    def _forks(self, env: Any, count: int) -> list[Any]:
        """`count` live copies of `env`, one after another (a tool pool job; its time counts in `step_seconds`)."""
        with self._pool_time():
            forks = []
            for _ in range(count):
                forks.append(env.fork())
                self._made.append(forks[-1])
            return forks

    # Starting and ending paths --------------------------------------------------------------------------------------
    def _global(self, t: int, state: TaskState) -> PathState:
        """One of the task's N global samples."""
        node = state.new_node(None, 0, "global", self.turns)
        state.live += 1
        return self._start(t, state, node=node, stream=node)

    def _start(self, t: int, state: TaskState, **kw: Any) -> PathState:
        """A path at the start of the response: a fork of the task's prompt and of its env."""
        with self._env_time():
            env = state.root_env.fork()
        self._made.append(env)
        return PathState(t, seq=self.generator.fork(state.root_path), env=env, turn=self.turns,
                     tool_steps_left=self._tool_steps_left(env), **kw)

    def _start_topup(self, t: int, state: TaskState, spare: bool) -> PathState:
        """The task's next top-up: started ahead of need as a spare (no node, not counted), or needed now."""
        j, state.topups = state.topups, state.topups + 1
        stream = self.config.num_generations + j
        if spare:
            self.spares["started"] += 1
            return self._start(t, state, node=-1, stream=stream, topup=j, spare=True)
        node = state.new_node(None, 0, "topup", self.turns)
        state.live += 1
        return self._start(t, state, node=node, stream=stream, topup=j)

    def _top_up_short_tasks(self, states: list[TaskState], live: list[PathState]) -> list[PathState]:
        """Top-ups for every task that is certain to end with fewer than M trajectories: even if each of its live
        paths branched at every tool step it has left (`capacity`), they could not make up the shortfall. The task
        takes its spares first (in the order they started: already under way, or finished), then starts new
        samples at once, in the same batch as everything else. Returns the new samples."""
        capacities: list[list[int]] = [[] for _ in states]
        for path in live:
            if not path.spare:
                capacities[path.task].append(self._capacity(path))
        fresh = []
        for t, state in enumerate(states):
            short = top_ups_needed(self.config.num_generations, len(state.done), capacities[t])
            while short > 0 and state.spares:
                self._take(state.spares.pop(0), state)
                short -= 1
            fresh += [self._start_topup(t, state, spare=False) for _ in range(max(0, short))]
        return fresh

    def _take(self, path: PathState, state: TaskState) -> None:
        """A spare becomes the task's next top-up: a node of the tree, and counted (live, or done if it ended)."""
        path.node, path.spare = state.new_node(None, 0, "topup", path.turn), False
        self.spares["taken"] += 1
        if path.ended is None:
            state.live += 1
            return
        path.ended.node = path.node
        self._count_trajectory(path, state, path.ended)

    def _spare_up(self, states: list[TaskState], live: list[PathState], ready: list[PathState],
                  generating: dict[int, PathState]) -> list[PathState]:
        """Start spares where a task is expected to fall short, stop those it can no longer need; returns the new
        ones. A task needs at most M − (done + live) more top-ups (its finished and live paths end as at least one
        trajectory each): the spares beyond that many go (the last started first). It is expected to need M minus
        the trajectories it is expected to end with (`_expected`), rounded: spares are started up to that many, and
        up to `min_spare_samples` under way whatever the expectation, with at most `spare_samples` under way. A spare
        that has finished waits to be taken and is no longer under way: another may start in its place."""
        cfg = self.config
        by_task: list[list[PathState]] = [[] for _ in states]
        for path in live:
            if not path.spare:
                by_task[path.task].append(path)
        fresh = []
        for t, state in enumerate(states):
            limit = max(0, cfg.num_generations - len(state.done) - state.live)
            for path in state.spares[limit:]:
                self._cancel(path, ready, generating)
            del state.spares[limit:]
            expected = math.floor(cfg.num_generations - self._expected(state, by_task[t]) + 0.5)
            finished = sum(path.ended is not None for path in state.spares)
            want = min(limit, finished + self._spares(cfg), max(finished + cfg.min_spare_samples, expected))
            while len(state.spares) < want:
                state.spares.append(self._start_topup(t, state, spare=True))
                fresh.append(state.spares[-1])
        return fresh

    def _expected(self, state: TaskState, live: list[PathState]) -> float:
        """The trajectories a task is expected to end with: each finished one, and for each live path the
        (1 + (Z−1)·p)^q it grows into on average if it branches with probability p at each of q more tool steps —
        p the mean branching probability of this rollout's decisions so far (α before any), q the mean tool steps of
        its finished paths less the path's own, at most its tool budget left. The mean counts one more path that used
        the whole budget (a prior: before any path has ended, paths are expected to use it all, and the first to end
        are the short ones). A top-up counts one."""
        cfg, seen = self.config, self._seen
        mean_p = seen["p"] / seen["decisions"] if seen["decisions"] else cfg.alpha
        mean_steps = (seen["tool_steps"] + state.tool_budget) / (seen["ended"] + 1)
        paths = [(path.topup is not None, path.steps, path.tool_steps_left) for path in live]
        return expected_trajectories(len(state.done), paths, cfg.branch_factor, mean_p, mean_steps)

    def _cancel(self, path: PathState, ready: list[PathState], generating: dict[int, PathState]) -> None:
        """Stop a spare and discard its work. One whose env step is under way is closed when the step returns."""
        path.cancelled = True
        dropped = 0
        if generating.pop(id(path), None) is not None:
            dropped = self.generator.cancel(id(path))
        ready[:] = [y for y in ready if y is not path]
        self.spares["discarded"] += 1
        self.spares["discarded_tokens"] += sum(path.mask) + dropped
        self.spares["discarded_tool_calls"] += path.steps
        if path.ended is None and not path.stepping:
            self._close_env(path.environment())

    def _capacity(self, path: PathState) -> int:
        """The most trajectories a live path can still end as: Z^r with r its tool steps left (each branch point
        makes Z paths, and every one of them may branch again at each later step); 1 for a top-up or without
        branching."""
        return capacity(path.tool_steps_left, self.config.branch_factor,
                        self._branching() and path.topup is None)

    @staticmethod
    def _tool_steps_left(env: Any) -> int:
        return max(0, env.max_tool_calls - env.state.budget_used)

    def _end_path(self, path: PathState, state: TaskState, truncated: bool, observation: str = "",
                parts: dict[str, Any] | None = None) -> None:
        """Score the path's trajectory and count it done; a spare's waits until the task takes it (`_take`)."""
        env = path.environment()
        env_state = env.state
        if observation:  # the env's last word (why it truncated) is part of the record, not of the tokens
            path.segments.append({"kind": "tool", "text": observation, "start": len(path.completion),
                               "end": len(path.completion)})
        if not parts:  # the env scored it when the episode ended; else score now
            with self._env_time():
                parts = env.score().as_dict()
        trajectory = Trajectory(path.node, state.prompt_ids, path.completion, path.mask, path.logprobs, path.entropies,
                                path.segments,
                                float(parts["total"]), parts, env_state.total_tool_calls, path.decisions, truncated)
        self._close_env(env)
        if path.spare:  # not counted until taken: a spare's trajectory is the tree's only as a top-up
            path.ended = trajectory
            return
        state.live -= 1
        self._count_trajectory(path, state, trajectory)

    def _count_trajectory(self, path: PathState, state: TaskState, trajectory: Trajectory) -> None:
        """Count a trajectory of the task (the scheduler's statistics see its path's tool steps)."""
        self._seen["tool_steps"] += path.steps
        self._seen["ended"] += 1
        state.done.append(trajectory)
        if self.progress:
            self.progress(1)


class GRPORollout(ARPORollout):
    """M independent samples per task through the same machinery (the baseline)."""

    algo = "grpo"

    def _initial(self, cfg: RolloutConfig) -> int:
        return cfg.num_generations

    def _branching(self) -> bool:
        return False


class _Loop:
    """What the scheduler's loop holds between two turns: the paths ready to generate, those generating (by request
    key), the env steps under way, and on a stepped backend the steps of each poll, collected after the next one."""

    def __init__(self, generator: Generator, cfg: RolloutConfig, tasks: int) -> None:
        self.ready: list[PathState] = []
        self.generating: dict[int, PathState] = {}
        self.tools: dict[Future, PathState] = {}
        self.cohorts: list[list[Future]] = []
        self.trees: list[RolloutTree | None] = [None] * tasks
        self.params = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_p, tuple(tags.close_tags()),
                                     cfg.entropy_k, cfg.entropy_top_logprobs)
        self.lockstep = getattr(generator, "lockstep", True)
        self.stepped = getattr(generator, "stepped", False)


def _checked_tasks(tasks: Sequence[Any]) -> list[dict[str, Any] | int]:
    """The tasks as a list; anything but an index or a mapping is a ValueError naming it, before any env is made."""
    tasks = list(tasks)
    for t, task in enumerate(tasks):
        if isinstance(task, bool) or not isinstance(task, (numbers.Integral, Mapping)):
            raise ValueError(f"task {t}: a task is an index into the env's dataset or a dict {{'question', "
                             f"'answer'}}, not {type(task).__name__} {str(task)[:100]!r}")
    return tasks
