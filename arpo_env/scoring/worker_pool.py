"""Hostile input with a bound: functions of model answers and of web pages run in worker processes that are killed
when they overrun.

A model's answer is hostile input for a scorer. ``\\boxed{9^{9^{9^{9}}}}`` makes sympy compute a power with more
digits than atoms in the universe; the big-integer arithmetic holds Python's interpreter lock, so no thread can
interrupt it, and math-verify's own timeout is a ``SIGALRM`` that only works in the main thread (the rollout engine
steps its environments in a thread pool). A web page is hostile input for an extractor: trafilatura's time grows
about with the square of a page's paragraphs (80,000 short ones, 1.3 MB, take it 18 s; 150,000 close to a minute).
So the expensive part of scoring — parsing and comparing with math-verify — and of reading a page — trafilatura —
run here, in small pools of worker processes (``python -m arpo_env.scoring.worker_pool <kind>``, one pool per kind: a
slow page never holds up scoring) that talk JSON lines over pipes. A call that does not answer within its bound has its
worker killed (the whole process group) and replaced, and returns the caller's fallback; a worker that runs out of
memory (its address space is capped) or crashes is replaced the same way. A caller with a fallback of its own may also
bound its wait for a free worker (reading a page does: the wait counts against its bound); scoring waits. Any thread
or process may call; the pools start lazily, and their workers exit when their parent does.

Settings: ``ARPO_SCORE_TIMEOUT`` (seconds per scoring call, default 5), ``ARPO_SCORE_WORKERS`` (workers per pool,
default 2), ``ARPO_SCORE_MEMORY_MB`` (address-space cap of a worker, default 4096). The bound on reading a page is
the browse tool's ``extract_timeout_s``.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

DEFAULT_TIMEOUT_S = 5.0
STARTUP_TIMEOUT_S = 120.0
"""Starting a worker imports sympy and math-verify (seconds on a busy machine); that is not the call's time."""


def default_timeout() -> float:
    """The bound on one call: ``ARPO_SCORE_TIMEOUT`` seconds (read at each call), 5 by default."""
    return float(os.environ.get("ARPO_SCORE_TIMEOUT", DEFAULT_TIMEOUT_S))


class BoundExceeded(Exception):
    """The call ran past its bound, or its worker died; the worker has been replaced. `bound_s`: the bound the call
    ran under."""

    bound_s: float | None = None


class NoWorkerFree(BoundExceeded):
    """Every worker of the pool stayed busy for the whole wait the caller allowed (`WorkerPool.call`'s `wait_s`):
    the call did not run."""


def _spawn(kind: str) -> subprocess.Popen:
    """Start a worker from the spawner thread. The worker asks the kernel to kill it when its parent *thread* ends
    (PR_SET_PDEATHSIG is per thread): started from a rollout's short-lived pool thread, it would die with that
    thread and the next call would find a broken pipe. The spawner lives as long as the process."""
    done = threading.Event()
    box: dict[str, Any] = {}
    _spawn_requests().put((kind, done, box))
    done.wait()
    if "error" in box:
        raise box["error"]
    return box["proc"]


_SPAWNER: queue.Queue | None = None
_SPAWNER_PID = 0
_SPAWNER_LOCK = threading.Lock()


def _spawn_requests() -> queue.Queue:
    global _SPAWNER, _SPAWNER_PID
    with _SPAWNER_LOCK:
        if _SPAWNER is None or _SPAWNER_PID != os.getpid():
            _SPAWNER, _SPAWNER_PID = queue.Queue(), os.getpid()
            threading.Thread(target=_spawner_loop, args=(_SPAWNER,), name="arpo-score-spawner", daemon=True).start()
        return _SPAWNER


def _spawner_loop(requests: queue.Queue) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    while True:
        kind, done, box = requests.get()
        try:
            box["proc"] = subprocess.Popen([sys.executable, "-m", __name__, kind], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                           start_new_session=True)
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        done.set()


class _Worker:
    def __init__(self, kind: str) -> None:
        self.proc = _spawn(kind)
        self.buffer = b""
        if self._read_line(STARTUP_TIMEOUT_S) != {"ready": True}:
            self.kill()
            raise RuntimeError(f"the {kind} worker did not start")

    def call(self, op: str, args: list[Any], timeout_s: float) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"op": op, "args": args}) + "\n").encode())
        self.proc.stdin.flush()
        reply = self._read_line(timeout_s)
        if reply is None:
            raise BoundExceeded(f"{op} did not finish within {timeout_s:g} s")
        if "error" in reply:
            raise BoundExceeded(f"{op} failed in the worker: {reply['error']}")
        return reply["value"]

    def _read_line(self, timeout_s: float) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        chunks = [self.buffer]
        while b"\n" not in chunks[-1]:  # a page's text is megabytes: the search is over each new chunk only
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.buffer = b"".join(chunks)
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:  # the worker died (memory cap, crash)
                self.buffer = b"".join(chunks)
                return None
            chunks.append(chunk)
        line, self.buffer = b"".join(chunks).split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass


def _bounded(exc: BoundExceeded, bound_s: float) -> BoundExceeded:
    exc.bound_s = bound_s
    return exc


class WorkerPool:
    """A few workers of one kind (``score``: math-verify; ``page``: trafilatura) shared by every thread of this
    process."""

    def __init__(self, size: int | None = None, kind: str = "score") -> None:
        if kind not in PRELOAD:
            raise ValueError(f"no worker kind {kind!r}; the kinds are {sorted(PRELOAD)}")
        self.kind = kind
        self.size = size or int(os.environ.get("ARPO_SCORE_WORKERS", "2"))
        self.idle: queue.LifoQueue[_Worker | None] = queue.LifoQueue()
        for _ in range(self.size):
            self.idle.put(None)  # a slot; its worker starts on first use
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.workers: set[_Worker] = set()
        self.prestarted = False

    def call(self, op: str, *args: Any, timeout_s: float | None = None, wait_s: float | None = None) -> Any:
        """Run `op` (a function named ``module:function``, imported in the worker) on JSON-able `args`; BoundExceeded
        past `timeout_s`. With `wait_s`, it waits at most that long for a free worker (NoWorkerFree past it) and the
        wait is taken off `timeout_s`, so a caller with a fallback of its own (reading a page) has its answer within
        `timeout_s` and does not queue behind slow calls; without, it waits for a worker as long as it takes (scoring: a
        correct answer must not be scored wrong because others were slow)."""
        timeout_s = default_timeout() if timeout_s is None else timeout_s
        began = time.monotonic()
        try:
            worker = self.idle.get(timeout=wait_s)
        except queue.Empty:
            raise NoWorkerFree(f"no {self.kind} worker was free within {wait_s:g} s") from None
        if wait_s is not None:
            timeout_s -= time.monotonic() - began
            if timeout_s < 0.05:  # no time left to run: the worker is not killed for it
                self.idle.put(worker)
                raise NoWorkerFree(f"no {self.kind} worker was free in time")
        try:
            for attempt in range(2):
                if worker is None:
                    worker = _Worker(self.kind)
                    with self.lock:
                        self.workers.add(worker)
                try:
                    return worker.call(op, list(args), timeout_s)
                except OSError as exc:  # it died between calls (killed, out of memory): once more, on a new one
                    self._discard(worker)
                    worker = None
                    if attempt:
                        raise _bounded(BoundExceeded(f"the {self.kind} worker died: {exc}"), timeout_s) from exc
                except (BoundExceeded, ValueError) as exc:
                    self._discard(worker)
                    worker = None
                    raise _bounded(exc if isinstance(exc, BoundExceeded) else BoundExceeded(str(exc)), timeout_s
                                   ) from exc
        finally:
            self.idle.put(worker)

    def prestart(self) -> None:
        """Start the workers not started yet in the background, and return at once: a worker's start imports its
        libraries (sympy and math-verify for scoring: a second on a warm disk, several on a machine's first run),
        which then overlaps the rollout instead of holding up the first answers. A call that comes first takes a
        free slot or waits for a worker, as always; a worker that fails to start leaves its slot to start again at
        the next call."""
        with self.lock:
            if self.prestarted:
                return
            self.prestarted = True
        for _ in range(self.size):
            threading.Thread(target=self._start_one, name=f"arpo-{self.kind}-prestart", daemon=True).start()

    def _start_one(self) -> None:
        worker = self.idle.get()
        try:
            if worker is None:
                worker = _Worker(self.kind)
                with self.lock:
                    self.workers.add(worker)
        except Exception:  # noqa: BLE001 - the next call on this slot starts it again and says why
            worker = None
        finally:
            self.idle.put(worker)

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self.lock:
            self.workers.discard(worker)

    def close(self) -> None:
        with self.lock:
            workers, self.workers = list(self.workers), set()
        for worker in workers:
            worker.kill()


_POOLS: dict[str, WorkerPool] = {}
_POOL_LOCK = threading.Lock()


def pool(kind: str = "score") -> WorkerPool:
    """This process's pool of `kind` (a forked child gets its own: pipes are not shared across processes)."""
    with _POOL_LOCK:
        found = _POOLS.get(kind)
        if found is None or found.pid != os.getpid():
            found = _POOLS[kind] = WorkerPool(kind=kind)
        return found


def prestart(kind: str = "score") -> None:
    """Start this process's `kind` workers in the background (`WorkerPool.prestart`), returning at once."""
    pool(kind).prestart()


@atexit.register
def _close_pools() -> None:
    for found in list(_POOLS.values()):
        if found.pid == os.getpid():
            found.close()


# ----------------------------------------------------------------------------------------------------------------------
# The worker side
# ----------------------------------------------------------------------------------------------------------------------
PRELOAD = {"score": ("arpo_env.scoring.math_equivalence", "math_verify"),
           "page": ("arpo_env.tools.browse", "trafilatura")}
"""The kinds of worker, and what each imports before it says it is ready, so that a call's bound does not pay for it
(the last name is also the logger it silences). Module names, not imports: the pool imports none of its callers."""


def _target(name: str, found: dict[str, Any]) -> Any:
    """The function a call names as ``module:function``, imported once per worker."""
    if name not in found:
        import importlib

        module, _, function = name.partition(":")
        found[name] = getattr(importlib.import_module(module), function)
    return found[name]


def _serve(kind: str) -> None:
    import resource

    try:  # die with the parent, even in the middle of a computation
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    cap = int(os.environ.get("ARPO_SCORE_MEMORY_MB", "4096")) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    import importlib
    import logging

    for name in PRELOAD[kind]:
        importlib.import_module(name)
    logging.getLogger(PRELOAD[kind][-1]).setLevel(logging.CRITICAL)
    targets: dict[str, Any] = {}
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = {"value": _target(request["op"], targets)(*request["args"])}
        except MemoryError:
            reply = {"error": "MemoryError"}
        except Exception as exc:  # noqa: BLE001 - a scorer's exception is an answer, not the worker's end
            reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve(sys.argv[1] if len(sys.argv) > 1 else "score")
