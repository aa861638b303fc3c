"""The local Python sandbox: a persistent interpreter per environment, forkable as a live process.

`LocalSandbox` is the ``<python>`` tool's embedded default. Each instance owns one worker process forked from a shared
*template* that has already imported numpy and sympy, so starting an interpreter costs a ``fork()``, not an import.
Variables live across cells; a trailing expression's value is shown; stdout and stderr are captured and capped;
tracebacks are short. `fork()` forks the worker itself: the copy has the same variables (copy-on-write, a few
milliseconds, whatever the history) and a copy of the folder, where it stands where the parent stood (its current and
temporary folders, the files a cell holds open and the memory it maps shared are the parent's, moved to the copy).
`snapshot()` is the list of executed cells; `restore()` replays it in a fresh worker, in this process or another.

What it contains (tested): runaway loops (per-cell wall-clock and CPU timers interrupt the cell and keep its state; a
cell that ignores the interrupt is killed after a grace period), memory bombs (an address-space limit: ``MemoryError``
in the cell), process bombs and subprocesses, signals to other processes, reads of other processes' ``/proc/<pid>``
entries (the host's command line and environment), network access, writes outside its own working directory (through
hard links too), device nodes (no capabilities, even under root), disk bombs (a quota on that directory,
`SandboxLimits.disk_mb`: ``ENOSPC`` in the cell), floods of output (kept up to a cap, the rest counted), crashes and
``os._exit`` (the worker is replaced by a clean one and the model is told its variables are gone), and threads a cell
starts (interrupted with the cell when its time is up; while no cell runs they may use one cell's CPU time, then they
are interrupted, and threads that go on using CPU take the worker down with them, the model told why).

What it does **not** protect against: the checks on processes, signals, files and ctypes are a CPython audit hook (PEP
578) inside the worker, which a cell can get past (by walking its frames down to the hook's state, or by replacing a
library function the hook calls); under it, the kernel's layers hold whatever the cell does: resource limits, no
capabilities, a seccomp filter against programs and memory files and, where the kernel allows, a private network
namespace and Landlock (writes only in the sandbox's folder, no file of the hidden paths read, no signal to another
process from ABI 6, no other process's files or environment through /proc). Past the hook, a cell may still fork, fill
the sandbox's folder past its disk quota (the quota is the hook's), reach the other workers' directories in that folder
(a fork's new directory is beside its parent's, so the kernel's rule is the whole folder's), read the host's command
line (``/proc/<pid>/cmdline``, which any process may read) and list the hidden folders' names; without Landlock (a
kernel before 5.13, or one that leaves it off) the hook alone keeps files and signals. Code that is built to escape
CPython or the kernel (an interpreter or kernel bug) is not contained, and reads of the files the host user can read,
past the hidden paths (`hidden_by_default`), are allowed. Use it for the mistakes and excesses of a model under
training, not for adversarial code: for that run the interpreter in a separate VM with ``sandbox="e2b"``
(`arpo_env.tools.e2b`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from importlib import resources

from arpo_env.tools.protocol import MAX_SECONDS, MAX_WHOLE, ToolOutput, elide, limit_problem, snapshot_cells
from arpo_env.tools.sandbox.channel import recv_message, send_message

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "template.py")
DEFAULT_PRELOAD = ("numpy", "sympy", "math", "fractions", "itertools", "collections", "statistics", "random", "re")


@dataclass(frozen=True)
class SandboxLimits:
    """Per-cell and per-worker limits of the local sandbox."""

    timeout_s: float = 10.0
    """Wall-clock seconds a cell may run before it is interrupted."""
    cpu_s: float | None = None
    """CPU seconds a cell may use before it is interrupted (default: `timeout_s`)."""
    memory_mb: int = 1024
    """Memory a worker may allocate beyond what the template already holds (0: no limit)."""
    max_output_chars: int = 4000
    """Characters of stdout (and, separately, stderr) kept per cell: the first three quarters and the last quarter;
    a line between them says how many were left out."""
    file_size_mb: int = 64
    """Largest file a cell may write (at most `disk_mb`)."""
    disk_mb: int = 256
    """Disk space the worker's files may take together (its working directory, which a fork copies; 0: no limit).
    Each file open for writing counts at `file_size_mb`, so with the defaults four can be open at once in an empty
    directory; past the quota, opening a file for writing fails with ``ENOSPC`` (`DiskQuotaExceeded`)."""
    max_files: int = 4096
    """Files, directories and links the working directory may hold together (0: any number). A fork copies every
    one, empty or not: 4,096 take about 0.3 s, 65,536 empty ones (what `disk_mb` alone allows) 3-4 s. Past it, making
    another fails with ``ENOSPC`` (`DiskQuotaExceeded`)."""
    hidden_paths: tuple[str, ...] = ()
    """Files and directories no cell may open or list, besides those hidden by default (`hidden_by_default`: the
    tasks' answers, the host's keys). The environments add the directory of the tasks they read."""
    max_open_files: int = 256
    kill_grace_s: float = 3.0
    """How long after `timeout_s` the host waits for an interrupted cell before it kills the worker."""

    def __post_init__(self) -> None:
        """A limit no worker can run under (a time of 0 or less, text for a number) is a `ValueError` when the env is
        made: it was made, and every cell of the run failed (``itimer_error: Invalid argument``)."""
        problems = []
        for name, low in (("timeout_s", None), ("cpu_s", None), ("kill_grace_s", 0.0), ("memory_mb", 0),
                          ("max_output_chars", 1), ("file_size_mb", 1), ("disk_mb", 0), ("max_files", 0),
                          ("max_open_files", 1)):
            value = getattr(self, name)
            if value is None and name == "cpu_s":
                continue
            problem = limit_problem(name, value, low, MAX_WHOLE if isinstance(low, int) else MAX_SECONDS)
            if problem:
                problems.append(problem)
        if problems:
            raise ValueError("sandbox_options: " + "; ".join(problems))


def hidden_by_default() -> list[str]:
    """What no cell may read, on this host: the tasks' answers and the host's keys. The package's embedded datasets,
    ``$ARPO_DATA_DIR``, the Hugging Face cache (``$HF_HOME``, by default ~/.cache/huggingface: its datasets hold
    answers, and its token), and the usual homes of credentials (~/.ssh, ~/.aws, ~/.config, ~/.netrc,
    ~/.git-credentials, ~/.kaggle). A model that explores the file system would otherwise find the answers it is
    rewarded for, or keys to write into its rollouts."""
    home = os.path.expanduser("~")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    paths = [str(resources.files("arpo_env").joinpath("data")),
             os.environ.get("HF_HOME") or os.path.join(cache, "huggingface")]
    paths += [os.environ["ARPO_DATA_DIR"]] if os.environ.get("ARPO_DATA_DIR") else []
    return paths + [os.path.join(home, name) for name in (".ssh", ".aws", ".config", ".netrc", ".git-credentials",
                                                           ".kaggle")]


def _copy_entry(src: str, dst: str) -> None:
    """Copy one entry of a working directory for a fork: a file with its data, a named pipe (which a cell may make
    with ``os.mkfifo``, and which has no data to copy) as a new pipe; anything else (a socket's name) is left out."""
    mode = os.lstat(src).st_mode
    if stat.S_ISREG(mode):
        shutil.copy2(src, dst)
    elif stat.S_ISFIFO(mode):
        os.mkfifo(dst, stat.S_IMODE(mode))


class WorkerLost(RuntimeError):
    """The worker did not answer: it crashed, exited or ignored its interrupt and was killed. `reason`: its own last
    word, when it gave one (a worker whose cells' threads it could not stop says so, then exits)."""

    def __init__(self, message: str, timed_out: bool, reason: str | None = None) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.reason = reason


# --------------------------------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------------------------------
class _Process:
    """The host's handle on one worker: its pid (and pidfd, so a reused pid is never signalled), channel and dir.

    A forked worker greets its new channel once it is up, with its pid; `greet` reads that word, at the first request
    rather than in `fork` (so the copy starts while the caller goes on). Until then its pid is None. A worker's answers
    to the forks asked of it (`post`) are read before its next request's (they say nothing its copies do not)."""

    max_unanswered = 32

    def __init__(self, pid: int | None, sock: socket.socket, workdir: str, greeting: bool = False,
                 group: int | None = None) -> None:
        self.sock, self.workdir = sock, workdir
        self.greeting = greeting
        self.group = group
        """The template's process group, which every worker is in (the kernel keeps them there: `seccomp_filter`)."""
        self.unanswered = 0
        self.pid: int | None = None
        self.pidfd: int | None = None
        self.closed = False
        if pid is not None:
            self._adopt(pid)

    def _adopt(self, pid: int) -> None:
        self.pid = pid
        try:
            self.pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            self.pidfd = None

    def greet(self, timeout: float = 30) -> None:
        """Wait for a forked worker's first word (it is up, owns its channel, and says its pid); WorkerLost if it
        never came."""
        if not self.greeting:
            return
        self.sock.settimeout(timeout)
        try:
            hello = recv_message(self.sock)[0]
        except socket.timeout as exc:
            raise WorkerLost(f"the forked interpreter did not start within {timeout:.0f} s", timed_out=True) from exc
        except (EOFError, OSError, ValueError) as exc:
            raise WorkerLost(f"the forked interpreter died at start ({exc or type(exc).__name__})",
                             timed_out=False) from exc
        self.greeting = False
        # The greeting comes from whoever holds the copy's end of the channel: a cell past the audit hook can take it
        # from the fork's message and name any process here, which `kill` would then kill. Only a process in the
        # sandbox's own group is adopted.
        pid = hello.get("pid") if isinstance(hello, dict) else None
        if not isinstance(pid, int) or self.group is not None and _process_group(pid) != self.group:
            raise WorkerLost(f"the forked interpreter's greeting named no process of the sandbox ({pid!r})",
                             timed_out=False)
        self._adopt(pid)

    def post(self, message: dict, fds: list[int] | None = None, timeout: float = 30) -> None:
        """Send a message whose answer is read before the next request's (a fork: the caller does not wait for the
        worker to have forked). At most `max_unanswered` wait: beyond, their answers are read first (a worker whose
        answers nobody reads would block on them once its channel is full)."""
        if self.unanswered >= self.max_unanswered:
            self.answered(timeout)
        self.greet()
        self.sock.settimeout(timeout)
        try:
            send_message(self.sock, message, fds)
        except socket.timeout as exc:
            raise WorkerLost(f"the interpreter took no message for {timeout:.0f} s", timed_out=True) from exc
        except OSError as exc:
            raise WorkerLost(f"the interpreter process died ({exc or type(exc).__name__})", timed_out=False) from exc
        self.unanswered += 1

    def answered(self, timeout: float = 30) -> None:
        """Wait for the answers to what was posted (the worker has forked)."""
        self.request(None, timeout)

    def request(self, message: dict | None, timeout: float, fds: list[int] | None = None) -> dict:
        self.greet()
        self.sock.settimeout(timeout)
        try:
            while self.unanswered:
                recv_message(self.sock)
                self.unanswered -= 1
            if message is None:
                return {}
            try:
                send_message(self.sock, message, fds)
            except OSError:  # it has exited: its last word, if it left one, is still in the channel
                pass
            reply = recv_message(self.sock)[0]
        except socket.timeout as exc:
            raise WorkerLost(f"no answer after {timeout:.0f} s", timed_out=True) from exc
        except (EOFError, OSError, ValueError) as exc:
            raise WorkerLost(f"the interpreter process died ({exc or type(exc).__name__})", timed_out=False) from exc
        if "lost" in reply:  # its last word before it exited, read as the answer to whatever came next
            raise WorkerLost(f"the interpreter exited: {reply['lost']}", timed_out=False, reason=str(reply["lost"]))
        return reply

    def kill(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self.pid is None:  # a copy that has not greeted yet: its channel closes below, and it exits on that
                pass
            elif self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        if self.pidfd is not None:
            os.close(self.pidfd)
        self.sock.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (OSError, ValueError, OverflowError):
        return None


_PASSED_ENV = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "PYTHONHOME", "PYTHONUTF8", "PYTHONIOENCODING",
               "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX")


def _worker_environment() -> dict[str, str]:
    """The environment the template and its workers get: what running Python and its libraries needs (the names in
    `_PASSED_ENV`, the locale's ``LC_*``), plus the names listed, comma-separated, in ``ARPO_SANDBOX_ENV``. Not the
    rest: the host's variables hold its keys (``HF_TOKEN``, ``WANDB_API_KEY``, ``E2B_API_KEY``...), and a model that
    prints ``os.environ`` would write them into its rollouts and logs."""
    extra = {name.strip() for name in os.environ.get("ARPO_SANDBOX_ENV", "").split(",") if name.strip()}
    return {name: value for name, value in os.environ.items()
            if name in _PASSED_ENV or name.startswith("LC_") or name in extra}


class _Template:
    """The process that preloads modules and forks fresh workers. One per (host process, preload list)."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        ours, theirs = socket.socketpair()
        self.root = tempfile.mkdtemp(prefix="arpo-sandbox-")
        """Every worker's working directory is made in here; the template removes it when it exits (its host gone or
        shut down), so a killed host leaves no files behind."""
        env = _worker_environment()
        env["ARPO_SANDBOX_ROOT"] = self.root
        # One thread per worker (no BLAS thread pools to lose at fork); stable hashing so replay rebuilds the same
        # set and dict orders; no bytecode files written from inside the sandbox.
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0",
                   PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "template", str(theirs.fileno()), *preload],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir(),
        )
        theirs.close()
        self.sock = ours
        self.owner = os.getpid()
        self.lock = threading.Lock()
        self.sock.settimeout(300)
        try:
            hello, _ = recv_message(self.sock)
        except (EOFError, OSError, ValueError) as exc:  # it died before its first word: say so, not "channel closed"
            self.proc.kill()
            status = self.proc.wait()
            self.sock.close()
            shutil.rmtree(self.root, ignore_errors=True)
            raise RuntimeError(f"the Python sandbox's template process ({SERVER}) did not start: {exc or 'no answer'} "
                               f"(exit status {status}); run it by hand to see why: "
                               f"{sys.executable} {SERVER} template 0 {' '.join(preload)}") from exc
        self.network = hello.get("network", "")
        self.capabilities = hello.get("capabilities", "")
        self.programs = hello.get("programs", "")

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def spawn(self, limits: SandboxLimits) -> _Process:
        workdir = tempfile.mkdtemp(prefix="worker-", dir=self.root)
        ours, theirs = socket.socketpair()
        try:
            with self.lock:
                self.sock.settimeout(60)
                hidden = [os.path.abspath(os.path.expanduser(path))
                          for path in hidden_by_default() + list(limits.hidden_paths)]
                send_message(self.sock, {"op": "spawn", "workdir": workdir,
                                         "limits": {**asdict(limits), "hidden_paths": hidden}},
                             [theirs.fileno()])
                reply, _ = recv_message(self.sock)
        finally:
            theirs.close()
        return _Process(reply["pid"], ours, workdir, group=self.proc.pid)  # its own group: os.setsid() at start

    def shutdown(self) -> None:
        if self.owner != os.getpid():  # a forked host (e.g. a vector env's worker) does not own it
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.sock.close()
        for _ in range(2):  # a worker killed with the group may still be finishing a write
            shutil.rmtree(self.root, ignore_errors=True)
            if not os.path.exists(self.root):
                break
            time.sleep(0.05)


_templates: dict[tuple[str, ...], _Template] = {}
_templates_lock = threading.Lock()
_prestarting: set[tuple[str, ...]] = set()
_prestart_lock = threading.Lock()


def _template(preload: tuple[str, ...]) -> _Template:
    with _templates_lock:
        template = _templates.get(preload)
        if template is None or not template.alive():
            template = _templates[preload] = _Template(preload)
        return template


def prestart(preload: tuple[str, ...] = DEFAULT_PRELOAD) -> None:
    """Start this process's template for `preload` in the background if it is not up, and return at once. Its start
    imports the preloaded modules (a third of a second on a warm disk, two seconds on a machine's first run): begun
    when an episode starts, it overlaps the model's first turn instead of holding up the first tool call, which
    waits for this start (not another) if it comes first. A start that fails is tried again, and reported, by the
    first call that needs the template."""
    preload = tuple(preload)
    template = _templates.get(preload)
    if template is not None and template.alive():
        return
    with _prestart_lock:
        if preload in _prestarting:
            return
        _prestarting.add(preload)

    def start() -> None:
        try:
            _template(preload)
        except Exception:  # noqa: BLE001 - the call that needs it starts it again and says why
            pass
        finally:
            with _prestart_lock:
                _prestarting.discard(preload)

    threading.Thread(target=start, name="arpo-sandbox-prestart", daemon=True).start()


def _after_fork_in_child() -> None:
    """A fork taken while another thread held these locks (a template starting) would leave them held for good in
    the child; the child has no templates of its own yet (`_Template.alive` checks the owner)."""
    global _templates_lock, _prestart_lock
    _templates_lock, _prestart_lock = threading.Lock(), threading.Lock()
    _prestarting.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def shutdown_templates() -> None:
    """Kill every template and, with it, every worker this process started (runs at exit)."""
    with _templates_lock:
        for template in _templates.values():
            template.shutdown()
        _templates.clear()


atexit.register(shutdown_templates)


def template_pids() -> list[int]:
    """Process-group ids of this process's live templates (every worker is in one of these groups)."""
    return [t.proc.pid for t in _templates.values() if t.alive()]


# --------------------------------------------------------------------------------------------------------------------
# The tool
# --------------------------------------------------------------------------------------------------------------------
class _Slot:
    """Holds the current worker so a finalizer can kill it without keeping the sandbox alive."""

    def __init__(self) -> None:
        self.process: _Process | None = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process = None


def _kill_both(slot: _Slot, spare: _Slot) -> None:
    spare.kill()
    slot.kill()


class LocalSandbox:
    """The ``<python>`` tool: a persistent, forkable interpreter in a contained local process."""

    name = "python"
    tag = "python"

    def __init__(self, limits: SandboxLimits | None = None, preload: tuple[str, ...] = DEFAULT_PRELOAD,
                 fork_ahead: bool = False) -> None:
        self.limits = limits or SandboxLimits()
        self.preload = tuple(preload)
        self.fork_ahead = fork_ahead
        """Keep a copy forked after each cell, while the caller waits on the model: a `fork` then hands it over
        already started (its first cell answers at once), at the cost of one more process per interpreter."""
        self.history: list[str] = []  # cells the current worker has run, in order: what `restore` replays
        self.restarts = 0
        self._slot = _Slot()
        self._spare = _Slot()
        self._lock = threading.RLock()  # the worker's channel: a spare is forked from a thread of its own
        self._finalizer = weakref.finalize(self, _kill_both, self._slot, self._spare)

    # Lifecycle --------------------------------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The worker's pid (None before it starts); a fresh fork's once it is up."""
        if self._slot.process is not None and self._slot.process.greeting:
            self._worker()
        return self._slot.process.pid if self._slot.process else None

    @property
    def protections(self) -> list[str]:
        """The containment layers this sandbox's interpreter runs under (it is started if it was not): the template's,
        which every worker inherits, and the kernel's rules for files, which each worker sets itself (asked of it:
        where they fail, the audit hook alone keeps the files)."""
        template = _template(self.preload)
        try:
            files = self._worker().request({"op": "ping"}, 30).get("files", "")
        except WorkerLost:  # it died since its last call: a fresh one answers, with the cells replayed
            self.restore({"cells": self.history})
            files = self._worker().request({"op": "ping"}, 30).get("files", "")
        layers = (template.network, template.capabilities, template.programs, files)
        return ["audit hook", "resource limits", "cell timers"] + [layer for layer in layers if layer]

    def start(self) -> None:
        """Start the worker now rather than at the first call."""
        self._worker()

    def prestart(self) -> None:
        """Start the template this sandbox's workers fork from in the background (`prestart`), returning at once."""
        prestart(self.preload)

    def _worker(self) -> _Process:
        process = self._slot.process
        if process is not None and process.greeting:
            try:
                process.greet()
            except WorkerLost:  # the live copy never started: rebuild its state by replay instead
                self.restore({"cells": self.history})
        if self._slot.process is None:
            self._slot.process = _template(self.preload).spawn(self.limits)
        return self._slot.process

    def close(self) -> None:
        with self._lock:
            self._spare.kill()
            self._slot.kill()
            self.history = []

    # The tool protocol ----------------------------------------------------------------------------------------------
    def call(self, query: str) -> ToolOutput:
        with self._lock:
            out = self._call(query)
        if self.fork_ahead and not out.extra.get("restarted"):  # forked while the caller waits on the model
            threading.Thread(target=self._fork_spare, args=(len(self.history),), daemon=True,
                             name="arpo-sandbox-spare").start()
        return out

    def _fork_spare(self, cells: int) -> None:
        with self._lock:
            if (self._spare.process is None and self._slot.process is not None and not self._slot.process.closed
                    and len(self.history) == cells):  # nothing ran, forked or closed since
                try:
                    self._spare.process = self._copy()
                except WorkerLost:  # the worker died: its next call says so
                    pass

    def _call(self, query: str) -> ToolOutput:
        start = time.perf_counter()
        limits = self.limits
        message = {"op": "exec", "code": query, **asdict(limits)}
        self._spare.kill()  # a copy of the state before this cell
        try:
            reply = self._worker().request(message, limits.timeout_s + limits.kill_grace_s)
        except WorkerLost as lost:
            self._replace()
            why = lost.reason or (f"it did not stop within {limits.timeout_s:g} s and was killed" if lost.timed_out
                                  else "its process crashed or exited")
            text = (f"The Python interpreter was terminated: {why}. All variables are lost; a fresh interpreter "
                    "is ready, so define again what you need.")
            return ToolOutput(text, failed=True, error="interpreter terminated", latency_s=time.perf_counter() - start,
                              extra={"restarted": True, "timed_out": lost.timed_out})
        self.history.append(query)
        error = reply["error"]
        return ToolOutput(
            _format_reply(reply, limits.max_output_chars), failed=error is not None,
            error=error.strip().splitlines()[-1] if error else None, latency_s=time.perf_counter() - start,
            extra={"timed_out": reply["timed_out"], "output_dropped": reply["dropped"]},
        )

    def _replace(self) -> None:
        self._slot.kill()
        self.history = []
        self.restarts += 1
        self._worker()

    def fork(self) -> "LocalSandbox":
        """An independent sandbox whose interpreter is a live copy of this one's (same variables and files).

        Returns once the fork is asked of this worker, without waiting for it: the worker forks and the copy starts
        on their own, and the copy's first call (or `pid`) waits for its greeting (a copy that never starts is
        rebuilt by replay then)."""
        with self._lock:
            return self._fork()

    def _fork(self) -> "LocalSandbox":
        child = LocalSandbox(self.limits, self.preload, self.fork_ahead)
        child.history = list(self.history)
        if self._slot.process is None:
            return child
        if self._spare.process is not None:  # forked ahead, after the last cell: already up (a second fork of the
            child._slot.process, self._spare.process = self._spare.process, None  # same state forks as usual)
            return child
        copy = self._copy()
        if copy is None:  # the live copy failed: rebuild by replay
            child.restore({"cells": child.history})
        else:
            child._slot.process = copy
        return child

    def _copy(self) -> "_Process | None":
        """A live copy of the worker, asked of it without waiting (it greets at its first request); None when it
        cannot be made (the disk is full, the worker is gone)."""
        parent = self._worker()
        workdir = tempfile.mkdtemp(prefix="worker-", dir=os.path.dirname(parent.workdir))  # the template's root
        try:
            shutil.copytree(parent.workdir, workdir, symlinks=True, dirs_exist_ok=True, copy_function=_copy_entry)
        except OSError:  # the host's disk is full, or a file the cell made unreadable
            shutil.rmtree(workdir, ignore_errors=True)
            return None
        ours, theirs = socket.socketpair()
        try:
            parent.post({"op": "fork", "workdir": workdir}, fds=[theirs.fileno()])
        except WorkerLost:
            ours.close()
            shutil.rmtree(workdir, ignore_errors=True)
            return None
        finally:
            theirs.close()
        return _Process(None, ours, workdir, greeting=True, group=parent.group)  # its pid: in its greeting

    def snapshot(self) -> dict:
        """A picklable value from which `restore` rebuilds this interpreter (by replaying its cells)."""
        return {"cells": list(self.history)}

    def restore(self, snapshot: dict | None) -> None:
        """Replace the interpreter with a fresh one that has run the snapshot's cells (output discarded)."""
        cells = snapshot_cells(snapshot)
        with self._lock:
            self._restore(cells)

    def _restore(self, cells: list[str]) -> None:
        self._spare.kill()
        self._slot.kill()
        self.history = []
        if not cells:
            return
        limits = self.limits
        budget = len(cells) * (limits.timeout_s + 1) + limits.kill_grace_s
        try:
            self._worker().request({"op": "replay", "cells": cells, **asdict(limits)}, timeout=budget)
        except WorkerLost:
            self._replace()  # a replayed cell killed the worker: start clean rather than half-restored
            return
        self.history = cells

    def __repr__(self) -> str:
        return f"LocalSandbox(pid={self.pid}, cells={len(self.history)})"


def _format_reply(reply: dict, max_chars: int) -> str:
    parts = [reply["stdout"].rstrip("\n"), reply["stderr"].rstrip("\n"), reply["value"] or "", reply["error"] or ""]
    text, cut = elide("\n".join(p for p in parts if p), 2 * max_chars)  # each stream says what it dropped
    reply["dropped"] += cut
    if reply["timed_out"]:
        text += "\n(the cell was interrupted; variables it had defined before that are kept)"
    return text or "(no output)"
