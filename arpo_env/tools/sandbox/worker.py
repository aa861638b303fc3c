"""A worker: one live interpreter that runs cells, with its output capped and its time bounded, and forks itself."""

from __future__ import annotations

import _random
import ast
import codecs
import errno
import io
import linecache
import math
import operator
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from channel import (
    _CHDIR,
    _COMPILE,
    _EVAL,
    _EXEC,
    _GETCWD,
    _MONOTONIC,
    _PERF_COUNTER,
    _RANDOM,
    _REALPATH,
    _SELECT,
    _STACK,
    _TRACEBACK,
    recv_message,
    send_message,
)
from containment import CellTimeout, Guard, interrupt_threads
from fork_copy import moved_path, remap_shared, reopen_files, stat_fields

_HERE = os.path.dirname(os.path.abspath(__file__))
"""The sandbox's own folder: a traceback shows a cell's frames, not the worker's."""


# --------------------------------------------------------------------------------------------------------------------
# Running cells
# --------------------------------------------------------------------------------------------------------------------
class CappedWriter(io.TextIOBase):
    """A text stream that keeps `cap` characters, its first three quarters and its last quarter, and counts the rest
    (output floods cost nothing): a loop's first lines and what the cell printed last (its result, mostly) are both
    read, with a line in between that says how much was left out. Like the standard streams it is UTF-8 and has a
    binary `buffer` (``sys.stdout.buffer.write(b"...")``), whose bytes are decoded into the same text."""

    def __init__(self, cap: int) -> None:
        self.cap = max(0, cap)
        self.tail = self.cap // 4
        self.parts: list[str] = []  # the head
        self.kept = 0
        self.end: list[str] = []  # the most recent writes past the head, trimmed to `tail` now and then
        self.end_len = 0
        self.written = 0
        self.buffer = _BytesInto(self)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "replace"

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        n = len(s)
        self.written += n
        room = self.cap - self.tail - self.kept
        if room > 0:
            self.parts.append(s[:room])
            self.kept += min(room, n)
            s = s[room:]
        if s and self.tail:
            s = s[-self.tail:]
            self.end.append(s)
            self.end_len += len(s)
            if self.end_len > 2 * self.tail:  # amortised: a million short prints cost a million appends
                last = "".join(self.end)[-self.tail:]
                self.end, self.end_len = [last], len(last)
        return n

    @property
    def dropped(self) -> int:
        return self.written - self.kept - min(self.end_len, self.tail)

    def getvalue(self) -> str:
        end = "".join(self.end)[-self.tail:] if self.tail else ""
        skipped = f"\n[output truncated: {self.dropped:,} characters not shown]\n" if self.dropped else ""
        return "".join(self.parts) + skipped + end + self.buffer.pending()


class _BytesInto(io.RawIOBase):
    """The binary side of a `CappedWriter`: bytes decoded as UTF-8 (a character split between writes is joined;
    invalid bytes become U+FFFD) into its text."""

    def __init__(self, text: CappedWriter) -> None:
        self.text = text
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        data = bytes(memoryview(b))  # bytes, bytearray, memoryview; anything else is the TypeError it is elsewhere
        self.text.write(self.decoder.decode(data))
        return len(data)

    def pending(self) -> str:
        return self.decoder.decode(b"", final=True) if self.decoder.getstate()[0] else ""


class _CellTimers:
    """SIGALRM and SIGPROF, with their timers (``ITIMER_REAL``, which ``signal.alarm`` sets too, and ``ITIMER_PROF``),
    are the worker's clocks for a cell's wall and CPU time. A cell may use them as a program does, for timeouts of
    its own (``signal.signal(SIGALRM, handler); signal.alarm(5)``, common in models' code): `signal.signal`,
    `~signal.getsignal`, `~signal.alarm`, `~signal.setitimer` and `~signal.getitimer` are replaced by versions that
    keep the cell's handler and timer beside the worker's limit, and the one kernel timer is set to whichever comes
    first. Before, the cell's handler replaced the worker's: every later cell's time limit ran the model's handler
    (a handler that returned turned the wall-clock limit off), and ``signal.alarm(0)`` turned it off too.

    A cell's timers end with the cell, as before. A cell that takes the C module's own functions (``_signal``) gets
    past this; then the host's deadline stops the cell (the worker is replaced)."""

    def __init__(self, on_limit: Any) -> None:
        self.on_limit = on_limit
        self.signals = {signal.ITIMER_REAL: signal.SIGALRM, signal.ITIMER_PROF: signal.SIGPROF}
        self.clocks = {signal.ITIMER_REAL: time.monotonic, signal.ITIMER_PROF: time.process_time}
        self.limits: dict[int, float | None] = {which: None for which in self.signals}
        self.timers: dict[int, tuple[float, float] | None] = {which: None for which in self.signals}  # due, interval
        self.handlers: dict[int, Any] = {signum: signal.SIG_DFL for signum in self.signals.values()}
        self.real = {name: getattr(signal, name) for name in ("signal", "getsignal", "alarm", "setitimer", "getitimer")}
        for signum in self.signals.values():
            self.real["signal"](signum, self.fire)
        signal.signal, signal.getsignal, signal.alarm = self.signal, self.getsignal, self.alarm  # type: ignore
        signal.setitimer, signal.getitimer = self.setitimer, self.getitimer  # type: ignore[assignment]

    # The worker's side --------------------------------------------------------------------------------------------
    def limit(self, which: int, seconds: float) -> None:
        self.limits[which] = self.clocks[which]() + seconds
        self.arm(which)

    def stop(self) -> None:
        for which in self.signals:
            self.limits[which] = self.timers[which] = None
            self.real["setitimer"](which, 0)

    def arm(self, which: int) -> None:
        """Set the kernel's timer to the first of the limit and the cell's own timer."""
        timer = self.timers[which]
        due = [t for t in (self.limits[which], timer[0] if timer else None) if t is not None]
        if not due:
            self.real["setitimer"](which, 0)
            return
        self.real["setitimer"](which, max(min(due) - self.clocks[which](), 1e-6))

    def fire(self, signum: int, frame: Any) -> None:
        which = next(w for w, s in self.signals.items() if s == signum)
        now = self.clocks[which]()
        limit = self.limits[which]
        if limit is not None and now >= limit - 1e-4:
            self.limits[which] = None
            self.arm(which)
            self.on_limit(signum, frame)  # raises CellTimeout while a cell runs
            return
        timer = self.timers[which]
        if timer is None or now < timer[0] - 1e-4:  # early (a clock's rounding), or a timer since cancelled
            self.arm(which)
            return
        due, interval = timer
        self.timers[which] = (due + interval * max(1, math.ceil((now - due) / interval)), interval) if interval \
            else None
        self.arm(which)
        handler = self.handlers[signum]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:  # what the signal does to a process with no handler: it ends it
            os._exit(128 + signum)

    # The cell's side: the signal module's functions, as documented --------------------------------------------------
    def signal(self, signalnum: int, handler: Any) -> Any:
        if signalnum not in self.handlers:
            return self.real["signal"](signalnum, handler)
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("signal only works in main thread of the main interpreter")
        if not callable(handler) and handler not in (signal.SIG_DFL, signal.SIG_IGN):
            raise TypeError("signal handler must be signal.SIG_IGN, signal.SIG_DFL, or a callable object")
        old, self.handlers[signalnum] = self.handlers[signalnum], handler
        return old

    def getsignal(self, signalnum: int) -> Any:
        return self.handlers[signalnum] if signalnum in self.handlers else self.real["getsignal"](signalnum)

    def alarm(self, seconds: int) -> int:
        left = self.getitimer(signal.ITIMER_REAL)[0]
        self.setitimer(signal.ITIMER_REAL, operator.index(seconds))
        whole = int(left)  # rounded as the C library's alarm() does: never 0 while one was set
        return whole + (left - whole >= 0.5 or (whole == 0 and left > 0))

    def setitimer(self, which: int, seconds: float, interval: float = 0.0) -> tuple[float, float]:
        if which not in self.timers:
            return self.real["setitimer"](which, seconds, interval)
        if seconds < 0 or interval < 0:
            raise signal.ItimerError(errno.EINVAL, "Invalid argument")
        old = self.getitimer(which)
        self.timers[which] = (self.clocks[which]() + seconds, float(interval)) if seconds > 0 else None
        self.arm(which)
        return old

    def getitimer(self, which: int) -> tuple[float, float]:
        if which not in self.timers:
            return self.real["getitimer"](which)
        timer = self.timers[which]
        return (max(timer[0] - self.clocks[which](), 1e-6), timer[1]) if timer else (0.0, 0.0)


class Worker:
    """One persistent interpreter: a namespace, a channel to the host, and the cell runner."""

    def __init__(self, sock: socket.socket, guard: Guard) -> None:
        self.sock = sock
        self.guard = guard
        self.namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
        self.cells = 0
        self.in_cell = False
        self.limits: dict = {}
        """The limits the host sent with its last cell (a cell's CPU time bounds its threads between cells too)."""
        self.stopped = 0
        """Threads interrupted while no cell ran, not yet reported (the next cell's output says so)."""
        self._forget_threads()
        threading.excepthook = self._thread_error
        self.timers = _CellTimers(self._on_timer)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large file is an OSError in the cell, not death

    def _on_timer(self, signum: int, _frame: object) -> None:
        if self.in_cell:
            self.in_cell = False  # one interrupt per cell: the other timer must not fire inside the handler
            kind = "wall-clock" if signum == signal.SIGALRM else "CPU"
            running = self._running(0.02)  # the threads that run end with the cell's time; waiting ones stay
            interrupt_threads(self.guard, running)
            deadline = _MONOTONIC() + 0.5
            for thread in threading.enumerate():  # their tracebacks go to the cell's output
                if thread.ident in running:
                    thread.join(max(0.0, deadline - _MONOTONIC()))
            raise CellTimeout(f"the cell exceeded its {kind} time limit and was interrupted")

    # Threads the cells started ------------------------------------------------------------------------------------
    # A cell's threads (`threading`'s or raw `_thread` ones) may outlive it, as in a notebook, but not its limits. While
    # no cell runs, each thread's own CPU clock is read every 0.2 s: one that has run without a pause for one cell's CPU
    # time is interrupted, and if it runs on for `kill_grace_s` more CPU seconds the worker exits with a last word
    # saying why. A thread that waits (an idle pool's) uses no CPU: it is never interrupted, and a pause clears a
    # thread's account.
    def _thread_clocks(self) -> dict[int, float]:
        """The CPU seconds of each thread the cells started: every Python thread but this one, `threading`'s and
        raw `_thread.start_new_thread` ones alike (only the interpreter's own table lists the latter)."""
        clocks = {}
        me = threading.get_ident()
        for ident in sys._current_frames():
            if ident == me:
                continue
            try:
                clocks[ident] = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except (OSError, ValueError, OverflowError):  # it has just ended
                pass
        return clocks

    def _running(self, pause: float) -> set[int]:
        """The threads whose clocks advance over `pause` seconds (those a cell's time-out interrupts)."""
        before = self._thread_clocks()
        time.sleep(pause)
        after = self._thread_clocks()
        return {i for i in after if after[i] - before.get(i, after[i]) > pause / 20}

    def _thread_error(self, args: threading.ExceptHookArgs) -> None:
        """A cell's thread ended with an exception: its short traceback goes to the stderr of the cell under way (to
        nowhere between cells), as a notebook shows it."""
        if args.exc_type is SystemExit or args.exc_value is None:
            return
        name = args.thread.name if args.thread is not None else "a thread"
        print(f"Exception in thread {name}:\n{self._traceback(args.exc_value)}", file=sys.stderr)

    def _idle(self) -> None:
        """No cell runs from now on: the threads' clocks count from here."""
        self.seen: dict[int, float] | None = self._thread_clocks()

    def _account(self) -> set[int]:
        """Add what each thread ran since the last reading to its account; returns those that ran. A thread that did
        not run (it waits) is cleared: its account and any interrupt it had."""
        now, seen = self._thread_clocks(), self.seen or {}
        ran = {i for i in now if now[i] - seen.get(i, now[i]) > 0.001}
        for i in now:
            if i in ran:
                self.ran[i] = self.ran.get(i, 0.0) + now[i] - seen[i]
            else:
                self.ran.pop(i, None)
                self.interrupted.pop(i, None)
        self.seen = now
        return ran

    def _busy(self) -> None:
        """A cell starts: the idle period's running counts, then the clocks stop counting until the cell ends."""
        if self.seen is not None:
            self._account()
            self.seen = None

    def _police(self) -> None:
        """Between cells: interrupt the threads that have run a cell's CPU time without a pause; exit, with a last
        word, if one of them runs on for `kill_grace_s` more."""
        limit, grace = self._thread_cpu_s(), float(self.limits.get("kill_grace_s", 3.0))
        for i in self._account():
            if i in self.interrupted and self.ran[i] - self.interrupted[i] > grace:
                why = (f"a thread started by a cell ran for {limit:g} s of CPU time while no cell ran and did not "
                       "stop when it was interrupted")
                try:
                    send_message(self.sock, {"lost": why})
                finally:
                    os._exit(1)
            if i not in self.interrupted and self.ran[i] > limit:
                interrupt_threads(self.guard, {i})
                self.interrupted[i] = self.ran[i]
                self.stopped += 1

    def _thread_cpu_s(self) -> float:
        """The CPU seconds a thread may run without a pause while no cell runs: one cell's (its CPU limit, else its
        wall-clock one)."""
        return float(self.limits.get("cpu_s") or self.limits.get("timeout_s", 10.0))

    def _forget_threads(self) -> None:
        """Start the accounts afresh (a new worker, or a fork: it has no thread but this one)."""
        self.ran: dict[int, float] = {}
        self.interrupted: dict[int, float] = {}
        self._idle()

    def _threads_live(self) -> bool:
        """Whether a thread besides this one lives, as the kernel counts them: a raw `_thread` thread the cell started
        just before it ended may not have a Python frame yet, and `threading` never lists it."""
        try:
            with self.guard.trusted():
                return int(stat_fields()[17]) > 1  # num_threads
        except (TypeError, ValueError, IndexError):
            return threading.active_count() > 1 or len(sys._current_frames()) > 1

    def _next_message(self) -> tuple[dict, list[int]]:
        """Wait for the host's next message; while cells' threads live, read their clocks every 0.2 s."""
        while self._threads_live() and not _SELECT([self.sock], [], [], 0.2)[0]:
            self._police()
        return recv_message(self.sock)

    # The main loop --------------------------------------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            try:
                msg, fds = self._next_message()
            except (EOFError, OSError, ValueError):
                os._exit(0)  # the host went away: nothing to serve
            op = msg.get("op")
            if op == "exec":
                send_message(self.sock, self.run_cell(msg["code"], msg))
            elif op == "replay":
                errors = 0
                for code in msg["cells"]:
                    errors += self.run_cell(code, msg)["error"] is not None
                send_message(self.sock, {"ok": True, "errors": errors})
            elif op == "fork":
                self.fork(msg["workdir"], fds[0])
            elif op == "ping":
                send_message(self.sock, {"ok": True, "pid": os.getpid(), "cells": self.cells,
                                         "files": self.guard.files})
            else:
                send_message(self.sock, {"ok": False, "error": f"unknown op {op!r}"})

    def fork(self, workdir: str, fd: int) -> None:
        # `random` reseeds its global generator in every forked child: the copy gets the parent's state back, so its
        # draws go on from where the parent's would (a copy of the interpreter is a copy of its random state too).
        # Through the C type's own methods on the generator taken at start: nothing a cell redefined runs here.
        state = _random.Random.getstate(_RANDOM)
        with self.guard.trusted():
            pid = os.fork()
        if pid == 0:  # the child: same variables, its own channel and working directory
            _random.Random.setstate(_RANDOM, state)
            self.sock.close()
            old, new = self.guard.root, _REALPATH(workdir)
            with self.guard.trusted():
                self.sock = socket.socket(fileno=fd)
                try:
                    cwd = _GETCWD()
                except OSError:  # the cell removed its current folder
                    cwd = old
                try:
                    _CHDIR(moved_path(cwd, old, new))
                except OSError:
                    _CHDIR(new)
                reopen_files(old, new)
                if self.guard.mapped:
                    remap_shared(old, new)
            self.guard.root = new
            if self.guard.quota is not None:
                self.guard.quota = self.guard.quota.moved_to(self.guard.root)
            # what named the parent's folder names the copy's: its files are there, and the parent's are outside the
            # copy's root (`tempfile` in a fork must write to the fork's own folder)
            try:
                for name in ("TMPDIR", "MPLCONFIGDIR"):
                    if isinstance(os.environ.get(name), str):
                        os.environ[name] = moved_path(os.environ[name], old, new)
                tempfile = sys.modules.get("tempfile")
                if isinstance(getattr(tempfile, "tempdir", None), str):
                    tempfile.tempdir = moved_path(tempfile.tempdir, old, new)
            except Exception:  # what a cell made of them: the copy starts all the same
                pass
            self._forget_threads()  # a fork has no thread but this one, and a CPU clock of its own
            send_message(self.sock, {"ok": True, "pid": os.getpid()})
            return
        os.close(fd)
        send_message(self.sock, {"ok": True, "pid": pid})

    # One cell -------------------------------------------------------------------------------------------------------
    def run_cell(self, code: str, opts: dict) -> dict:
        self.cells += 1
        self._busy()
        name = f"<cell {self.cells}>"
        cap = int(opts.get("max_output_chars", 4000))
        out, err = CappedWriter(cap), CappedWriter(cap)
        if self.stopped:  # the model's to know: what it started was stopped
            err.write(f"(note: {self.stopped} thread(s) started by earlier cells ran for {self._thread_cpu_s():g} s of "
                      "CPU time while no cell ran and were interrupted)\n")
            self.stopped = 0
        self.limits = opts
        value = error = None
        timed_out = False
        start = _PERF_COUNTER()
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            self.in_cell = True
            self.timers.limit(signal.ITIMER_REAL, float(opts.get("timeout_s", 10.0)))
            self.timers.limit(signal.ITIMER_PROF, float(opts.get("cpu_s") or opts.get("timeout_s", 10.0)))
            value = self._execute(code, name)
        except CellTimeout as exc:
            timed_out = True
            error = self._traceback(exc)
        except SystemExit as exc:
            error = f"SystemExit({exc.code!r}): the interpreter cannot be exited; its variables are kept"
        except BaseException as exc:  # noqa: BLE001 - everything a cell raises is the model's to read
            error = self._traceback(exc)
        finally:
            self.in_cell = False
            self.timers.stop()  # the cell's own timers end with it, as the worker's limits do
            sys.stdout, sys.stderr = old_out, old_err
            self._idle()
        return {
            "stdout": out.getvalue(),
            "stderr": err.getvalue(),
            "value": value,
            "error": error,
            "dropped": out.dropped + err.dropped,
            "timed_out": timed_out,
            "elapsed_s": _PERF_COUNTER() - start,
        }

    def _execute(self, code: str, name: str) -> str | None:
        """Run `code`; if it ends with an expression, return that value's repr (as a notebook shows it)."""
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        try:
            tree = _COMPILE(code, name, "exec", ast.PyCF_ONLY_AST)  # ast.parse, which calls builtins.compile
        except (SyntaxError, ValueError, UnicodeError) as exc:
            raise exc.with_traceback(None)  # the code never ran: no frames to show
        last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        if last is not None:
            tree.body.pop()
        _EXEC(_COMPILE(tree, name, "exec"), self.namespace)
        if last is None:
            return None
        result = _EVAL(_COMPILE(ast.Expression(last.value), name, "eval"), self.namespace)
        if result is None:
            return None
        self.namespace["_"] = result
        return _short_repr(result)

    @staticmethod
    def _traceback(exc: BaseException) -> str:
        """A traceback with the cell's own frames and the library frame that raised, the last five."""
        te = _TRACEBACK(type(exc), exc, exc.__traceback__)
        stack = [f for f in te.stack if os.path.dirname(f.filename) != _HERE]  # the cell's frames, not ours
        frames = [f for f in stack if f.filename.startswith("<cell")]
        if stack and stack[-1] not in frames and not isinstance(exc, SyntaxError):
            frames.append(stack[-1])  # where inside a library it failed
        te.stack = _STACK.from_list(frames[-5:])
        text = "".join(te.format())
        if not frames:
            text = text.replace("Traceback (most recent call last):\n", "")
        return text.rstrip()


def _short_repr(value: object, limit: int = 20000) -> str:
    """repr() that does not build a gigabyte string for a huge container."""
    if isinstance(value, (list, tuple, set, frozenset, dict)) and len(value) > 1000:
        import reprlib

        r = reprlib.Repr()
        r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdict = 100
        r.maxstring = r.maxother = 200
        text = r.repr(value) + f"  # {type(value).__name__} of {len(value)} items"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
