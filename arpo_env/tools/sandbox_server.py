"""The code that runs *inside* the local Python sandbox: the template process and its workers.

This file is executed as a script (``python sandbox_server.py template FD``) and imports nothing from ``arpo_env``:
the sandbox processes load only the standard library, the preloaded modules (numpy, sympy) and this file.

Process tree::

    host (your training / env process)
     └── template      pre-imports numpy + sympy once; a new session and process group; a child subreaper
          ├── worker   one live interpreter per env (forked from the template: milliseconds, copy-on-write)
          │    └── worker   a fork of a worker (``env.fork()``): same variables, independent from now on
          └── ...

Messages are length-prefixed JSON in both directions (never pickle: the host must not unpickle data from a process
that runs model-written code). File descriptors for new channels travel with ``SCM_RIGHTS``.

Containment, in layers (see ``arpo_env.tools.sandbox`` for what it does *not* protect against):

* an audit hook (PEP 578), armed for the whole life of the worker, refuses process creation, signals to other
  processes, sockets, ctypes/FFI calls, garbage-collector introspection and writes outside the working directory;
* resource limits: address space (memory), file size, open files, no core dumps;
* a private network namespace with no interfaces up, when the kernel allows it (root, or user namespaces);
* per-cell wall-clock and CPU timers that raise inside the cell first (the state survives), and a host-side
  deadline that kills the worker when the cell does not yield.
"""

from __future__ import annotations

import _random
import ast
import io
import json
import linecache
import os
import random
import resource
import signal
import socket
import struct
import sys
import threading
import time
import traceback

MAX_MESSAGE = 64 * 1024 * 1024
_RANDOM = random._inst  # `random`'s global generator (what random.random() draws from), as the template imported it
_HEADER = struct.Struct("!I")


# --------------------------------------------------------------------------------------------------------------------
# Framing
# --------------------------------------------------------------------------------------------------------------------
def _recv_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk, new_fds, _flags, _addr = socket.recv_fds(sock, n - len(buf), 4)
        fds.extend(new_fds)
        if not chunk:
            raise EOFError("channel closed")
        buf += chunk
    return bytes(buf)


def recv_message(sock: socket.socket) -> tuple[dict, list[int]]:
    """Read one message and any file descriptors that came with it."""
    fds: list[int] = []
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, fds))
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes is over the {MAX_MESSAGE}-byte limit")
    return json.loads(_recv_exact(sock, size, fds)), fds


def send_message(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()  # ensure_ascii: lone surrogates in model text survive the trip
    frame = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [frame[:_HEADER.size]], fds)
        sock.sendall(frame[_HEADER.size:])
    else:
        sock.sendall(frame)


# --------------------------------------------------------------------------------------------------------------------
# Containment
# --------------------------------------------------------------------------------------------------------------------
class SandboxViolation(PermissionError):
    """Raised inside a cell when it tries something the sandbox does not allow."""


class CellTimeout(BaseException):
    """Raised inside a cell when its time is up. A BaseException, so `except Exception:` does not swallow it."""


_REFUSED = {
    "os.fork": "creating processes",
    "os.forkpty": "creating processes",
    "os.posix_spawn": "creating processes",
    "os.spawn": "creating processes",
    "os.exec": "running programs",
    "os.system": "running programs",
    "subprocess.Popen": "running programs",
    "os.startfile": "running programs",
    "pty.spawn": "running programs",
    "socket.__new__": "network access",
    "socket.bind": "network access",
    "socket.connect": "network access",
    "socket.getaddrinfo": "network access",
    "socket.gethostbyname": "network access",
    "socket.gethostbyaddr": "network access",
    "socket.sendto": "network access",
    "socket.sendmsg": "network access",
    "ctypes.dlopen": "foreign function calls (ctypes)",
    "ctypes.dlsym": "foreign function calls (ctypes)",
    "ctypes.dlsym/handle": "foreign function calls (ctypes)",
    "ctypes.call_function": "foreign function calls (ctypes)",
    "ctypes.cdata": "foreign function calls (ctypes)",
    "ctypes.cdata/buffer": "foreign function calls (ctypes)",
    "gc.get_objects": "inspecting the interpreter's internals",
    "gc.get_referrers": "inspecting the interpreter's internals",
    "gc.get_referents": "inspecting the interpreter's internals",
    "sys.setprofile": "inspecting the interpreter's internals",
    "os.setuid": "changing privileges",
    "os.setgid": "changing privileges",
    "os.chroot": "changing privileges",
}
_SIGNALS = {"os.kill", "os.killpg", "signal.pthread_kill"}
# Events whose listed argument positions are paths that get modified.
_PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
    "os.rename": (0, 1), "os.link": (1,), "os.symlink": (1,), "os.truncate": (0,), "os.utime": (0,),
    "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (1,),
    "shutil.make_archive": (0,), "os.setxattr": (0,), "os.removexattr": (0,), "os.chflags": (0,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_WRITABLE_DEVICES = {"/dev/null"}


class Guard:
    """The audit hook and its state. One per process; `trusted()` opens it for the server's own operations."""

    def __init__(self) -> None:
        self.root = os.getcwd()
        self._trusted = 0
        self._local = threading.local()

    def trusted(self) -> "_Trusted":
        return _Trusted(self)

    def inside(self, path: object) -> bool:
        if isinstance(path, int):  # an already-open descriptor: its opening was checked
            return True
        try:
            path = os.fsdecode(path)  # type: ignore[arg-type]
        except TypeError:
            return False
        full = os.path.realpath(os.path.join(os.getcwd(), path))
        return full == self.root or full.startswith(self.root + os.sep) or full in _WRITABLE_DEVICES

    def __call__(self, event: str, args: tuple) -> None:
        if self._trusted or getattr(self._local, "busy", False):
            return
        self._local.busy = True
        try:
            self._check(event, args)
        finally:
            self._local.busy = False

    def _check(self, event: str, args: tuple) -> None:
        what = _REFUSED.get(event)
        if what is not None:
            raise SandboxViolation(f"sandbox: {what} is not allowed ({event})")
        if event in _SIGNALS:
            target = args[0] if event != "signal.pthread_kill" else os.getpid()
            if target != os.getpid():
                raise SandboxViolation(f"sandbox: signalling other processes is not allowed ({event})")
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and not self.inside(path):
                raise SandboxViolation(f"sandbox: writing outside the working directory is not allowed ({path!r})")
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and args[i] is not None and not self.inside(args[i]):
                    raise SandboxViolation(
                        f"sandbox: changing files outside the working directory is not allowed ({args[i]!r})"
                    )
        elif event == "import" and args and args[0] in ("ctypes", "_ctypes", "cffi", "_cffi_backend"):
            raise SandboxViolation(f"sandbox: foreign function calls ({args[0]}) are not allowed")


class _Trusted:
    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def __enter__(self) -> None:
        self.guard._trusted += 1

    def __exit__(self, *exc: object) -> None:
        self.guard._trusted -= 1


def _private_network() -> str:
    """Move this process into a network namespace with no interfaces up; return what was done."""
    try:
        import ctypes  # loaded before the guard is armed; the guard refuses ctypes calls afterwards

        libc = ctypes.CDLL(None, use_errno=True)
        clone_newnet, clone_newuser = 0x40000000, 0x10000000
        if libc.unshare(clone_newnet) == 0:
            return "network namespace"
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(clone_newnet | clone_newuser) == 0:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                try:
                    with open(f"/proc/self/{name}", "w") as f:
                        f.write(text)
                except OSError:
                    pass
            return "user+network namespace"
    except Exception:  # noqa: BLE001 - any failure means: no namespace, the audit hook still refuses sockets
        pass
    return ""


def _set_subreaper() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come back to the template
    except Exception:  # noqa: BLE001
        pass


# --------------------------------------------------------------------------------------------------------------------
# Running cells
# --------------------------------------------------------------------------------------------------------------------
class CappedWriter(io.TextIOBase):
    """A text stream that keeps the first `cap` characters and counts the rest (output floods cost nothing)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        room = self.cap - self.kept
        if room > 0:
            self.parts.append(s[:room])
            self.kept += min(room, len(s))
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def getvalue(self) -> str:
        return "".join(self.parts)


class Worker:
    """One persistent interpreter: a namespace, a channel to the host, and the cell runner."""

    def __init__(self, sock: socket.socket, guard: Guard) -> None:
        self.sock = sock
        self.guard = guard
        self.namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
        self.cells = 0
        self.in_cell = False
        signal.signal(signal.SIGALRM, self._on_timer)
        signal.signal(signal.SIGPROF, self._on_timer)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large file is an OSError in the cell, not death

    def _on_timer(self, signum: int, _frame: object) -> None:
        if self.in_cell:
            self.in_cell = False  # one interrupt per cell: the other timer must not fire inside the handler
            kind = "wall-clock" if signum == signal.SIGALRM else "CPU"
            raise CellTimeout(f"the cell exceeded its {kind} time limit and was interrupted")

    # The main loop --------------------------------------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            try:
                msg, fds = recv_message(self.sock)
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
                send_message(self.sock, {"ok": True, "pid": os.getpid(), "cells": self.cells})
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
            with self.guard.trusted():
                self.sock = socket.socket(fileno=fd)
                os.chdir(workdir)
            self.guard.root = os.path.realpath(workdir)
            os.environ["TMPDIR"] = workdir
            send_message(self.sock, {"ok": True, "pid": os.getpid()})
            return
        os.close(fd)
        send_message(self.sock, {"ok": True, "pid": pid})

    # One cell -------------------------------------------------------------------------------------------------------
    def run_cell(self, code: str, opts: dict) -> dict:
        self.cells += 1
        name = f"<cell {self.cells}>"
        cap = int(opts.get("max_output_chars", 4000))
        out, err = CappedWriter(cap), CappedWriter(cap)
        value = error = None
        timed_out = False
        start = time.perf_counter()
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            self.in_cell = True
            signal.setitimer(signal.ITIMER_REAL, float(opts.get("timeout_s", 10.0)))
            signal.setitimer(signal.ITIMER_PROF, float(opts.get("cpu_s") or opts.get("timeout_s", 10.0)))
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
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.setitimer(signal.ITIMER_PROF, 0)
            sys.stdout, sys.stderr = old_out, old_err
        return {
            "stdout": out.getvalue(),
            "stderr": err.getvalue(),
            "value": value,
            "error": error,
            "dropped": out.dropped + err.dropped,
            "timed_out": timed_out,
            "elapsed_s": time.perf_counter() - start,
        }

    def _execute(self, code: str, name: str) -> str | None:
        """Run `code`; if it ends with an expression, return that value's repr (as a notebook shows it)."""
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        try:
            tree = ast.parse(code, name, "exec")
        except (SyntaxError, ValueError, UnicodeError) as exc:
            raise exc.with_traceback(None)  # the code never ran: no frames to show
        last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        if last is not None:
            tree.body.pop()
        exec(compile(tree, name, "exec"), self.namespace)
        if last is None:
            return None
        result = eval(compile(ast.Expression(last.value), name, "eval"), self.namespace)
        if result is None:
            return None
        self.namespace["_"] = result
        return _short_repr(result)

    @staticmethod
    def _traceback(exc: BaseException) -> str:
        """A traceback with the cell's own frames and the library frame that raised, the last five."""
        te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        stack = [f for f in te.stack if f.filename != __file__]
        frames = [f for f in stack if f.filename.startswith("<cell")]
        if stack and stack[-1] not in frames and not isinstance(exc, SyntaxError):
            frames.append(stack[-1])  # where inside a library it failed
        te.stack = traceback.StackSummary.from_list(frames[-5:])
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


# --------------------------------------------------------------------------------------------------------------------
# The template: preload, then fork workers on request
# --------------------------------------------------------------------------------------------------------------------
def _become_worker(sock: socket.socket, workdir: str, limits: dict, guard: Guard) -> None:
    os.chdir(workdir)
    guard.root = os.path.realpath(workdir)
    os.environ["TMPDIR"] = workdir
    os.environ["MPLCONFIGDIR"] = os.path.join(workdir, ".matplotlib")
    import tempfile

    tempfile.tempdir = workdir
    vm = _virtual_memory_bytes()
    mem = int(limits.get("memory_mb", 1024)) * 2**20
    for name, value in (
        ("RLIMIT_AS", vm + mem if mem > 0 else resource.RLIM_INFINITY),
        ("RLIMIT_FSIZE", int(limits.get("file_size_mb", 64)) * 2**20),
        ("RLIMIT_NOFILE", int(limits.get("max_open_files", 256))),
        ("RLIMIT_CORE", 0),
    ):
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
        except (ValueError, OSError):
            pass
    Worker(sock, guard).serve()
    os._exit(0)


def _virtual_memory_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def template_main(fd: int, preload: list[str]) -> None:
    os.setsid()  # one process group for the template and every worker: the host can kill them all at once
    _set_subreaper()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # exited workers are reaped by the kernel: no zombies
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the host's terminal is for the host
    network = _private_network()
    for name in preload:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a missing optional module must not stop the sandbox
            pass
    import gc

    gc.collect()
    gc.freeze()  # keep preloaded objects out of later collections: pages stay shared after fork
    guard = Guard()
    sys.addaudithook(guard)
    with guard.trusted():
        chan = socket.socket(fileno=fd)
        send_message(chan, {"ok": True, "pid": os.getpid(), "network": network})
    while True:
        try:
            with guard.trusted():
                msg, fds = recv_message(chan)
        except (EOFError, OSError, ValueError):
            break
        if msg.get("op") == "spawn":
            with guard.trusted():
                pid = os.fork()
            if pid == 0:
                chan.close()
                with guard.trusted():
                    sock = socket.socket(fileno=fds[0])
                try:
                    _become_worker(sock, msg["workdir"], msg.get("limits", {}), guard)
                finally:
                    os._exit(0)
            os.close(fds[0])
            with guard.trusted():
                send_message(chan, {"ok": True, "pid": pid})
        elif msg.get("op") == "shutdown":
            break
    with guard.trusted():
        os.killpg(0, signal.SIGKILL)  # the host is gone or asked: take every worker with us


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "template":
        template_main(int(sys.argv[2]), [m for m in sys.argv[3:] if m])
    else:
        sys.exit("usage: sandbox_server.py template FD [MODULE ...]")
