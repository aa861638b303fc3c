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
  processes, sockets, ctypes/FFI calls, garbage-collector introspection and writes outside the working directory
  (hard links out of it included; no directory is opened as a descriptor, since a path relative to one would get
  past the checks; ``os.mknod`` and ``os.mkfifo``, which raise no event, are checked the same way; SQLite, which
  writes in C, gets an authorizer for the files it attaches), and reading or listing the hidden paths (the tasks'
  answers, the host's keys: `arpo_env.tools.sandbox.host.hidden_by_default`);
* resource limits: address space (memory), file size, open files, no core dumps;
* no Linux capabilities: a template started by root gives them all up before any cell runs, so what the hook does
  not see, such as ``os.mknod`` of a device node (a disk's, written to as a file in the directory), the kernel
  refuses;
* no programs, memory files or new sessions: a seccomp filter makes ``execve``, ``memfd_create``, ``setsid`` and
  ``setpgid`` fail (``EPERM``) whatever calls them (on x86_64 and aarch64), such as a fresh copy of
  `_posixsubprocess`, whose ``fork_exec`` raises no audit event (a memory file's pages are past the address-space
  limit; a worker out of the template's group outlives a killed host); POSIX shared memory is refused;
* a disk quota on the working directory (what a fork copies): files are counted as they are opened for writing,
  directories as they are made, and an opening that could take the files past the quota fails with ``ENOSPC``;
* a private network namespace with no interfaces up, when the kernel allows it (root, or user namespaces);
* Landlock, where the kernel has it (Linux 5.13 on, unprivileged): each worker, before its first cell, is held by
  the kernel to writing under the sandbox's folder (every worker's directory is in it) and ``/dev/null``, to reading
  no file under the hidden paths, and (from ABI 6) to sending no signal out of itself; its forks inherit the rules.
  Through another process's ``/proc/<pid>`` it reaches neither that process's files nor its environment. The audit
  hook lives in the interpreter the cell runs in, so a cell can get past it (walk its frames down to the guard and
  turn it off; replace a library function the hook calls); these rules hold whatever the cell does;
* per-cell wall-clock and CPU timers that raise inside the cell first (the state survives), and a host-side
  deadline that kills the worker when the cell does not yield;
* threads a cell starts may outlive it (as in a notebook) but not its limits: those running when its time is up are
  interrupted with it, and while no cell runs one that runs for a cell's CPU time without a pause is interrupted;
  one that runs on for ``kill_grace_s`` CPU seconds after that takes the worker down (the host reads why and
  replaces it). Waiting threads (an idle pool's) are left alone.
"""

from __future__ import annotations

import _random
import _socket
import array
import ast
import codecs
import errno
import fcntl
import io
import json
import linecache
import math
import operator
import os
import random
import resource
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
import traceback
from typing import Any

MAX_MESSAGE = 64 * 1024 * 1024
_RANDOM = random._inst  # `random`'s global generator (what random.random() draws from), as the template imported it
_HEADER = struct.Struct("!I")
_DUMPS, _LOADS = json.dumps, json.loads
"""The channel's codec, taken before any cell runs: a cell that rebinds ``json.dumps`` or ``json.loads`` for its own
use (``json.dumps = functools.partial(json.dumps, default=str)``) changes what its code calls, not the channel."""
_RECVMSG, _SENDMSG, _SENDALL = _socket.socket.recvmsg, _socket.socket.sendmsg, _socket.socket.sendall
_CMSG_LEN, _ARRAY, _SELECT = socket.CMSG_LEN, array.array, select.select
_MONOTONIC, _PERF_COUNTER = time.monotonic, time.perf_counter
_EXEC, _EVAL, _COMPILE = exec, eval, compile
_GETCWD, _CHDIR, _REALPATH = os.getcwd, os.chdir, os.path.realpath
_LISTDIR, _READLINK, _FSTAT, _OPEN, _LSEEK, _DUP2, _CLOSE = (os.listdir, os.readlink, os.fstat, os.open, os.lseek,
                                                            os.dup2, os.close)
_GET_INHERITABLE, _FCNTL, _S_ISREG, _READ, _WRITE = os.get_inheritable, fcntl.fcntl, stat.S_ISREG, os.read, os.write
_TRACEBACK, _STACK = traceback.TracebackException, traceback.StackSummary
"""What the worker runs cells and talks to the host with, taken the same way: a cell that rebinds one of these for its
own use (``socket.socket.sendall``, ``time.perf_counter``, ``builtins.compile``...) broke the worker, whose state was
lost (the channel's methods are the C type's, which no cell can change)."""


# --------------------------------------------------------------------------------------------------------------------
# Framing
# --------------------------------------------------------------------------------------------------------------------
def _recv_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk, ancillary, _flags, _addr = _RECVMSG(sock, n - len(buf), _CMSG_LEN(4 * 4))  # socket.recv_fds, 4 fds
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(_ARRAY("i", data[:len(data) - len(data) % 4]))
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
    return _LOADS(_recv_exact(sock, size, fds)), fds


def send_message(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = _DUMPS(message).encode()  # ensure_ascii: lone surrogates in model text survive the trip
    frame = _HEADER.pack(len(data)) + data
    if fds:
        _SENDMSG(sock, [frame[:_HEADER.size]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _ARRAY("i", fds))])
        _SENDALL(sock, frame[_HEADER.size:])
    else:
        _SENDALL(sock, frame)


# --------------------------------------------------------------------------------------------------------------------
# Containment
# --------------------------------------------------------------------------------------------------------------------
class SandboxViolation(PermissionError):
    """Raised inside a cell when it tries something the sandbox does not allow."""


class DiskQuotaExceeded(OSError):
    """Raised inside a cell when a file it opens for writing (or a directory it makes) could take the working
    directory past its disk quota: errno ``ENOSPC``, as on a full disk."""


class CellTimeout(BaseException):
    """Raised inside a cell when its time is up. A BaseException, so `except Exception:` does not swallow it."""


class ThreadTimeout(CellTimeout):
    """Raised inside a thread a cell started: it was running when a cell's time was up, or it ran for a cell's CPU
    time while no cell ran (raised asynchronously, as a class: its message is its own)."""

    def __str__(self) -> str:
        return ("the thread was interrupted: it was running when a cell's time was up, or it ran for a cell's CPU time "
                "while no cell ran")


_SET_ASYNC_EXC = None
"""CPython's ``PyThreadState_SetAsyncExc``, taken through ctypes before the guard is armed (`template_main`)."""


def _interrupt_threads(guard: "Guard", idents: set[int]) -> None:
    """Raise `ThreadTimeout` in each of these threads (at their next bytecode: a thread blocked in C gets it when
    the call returns)."""
    if _SET_ASYNC_EXC is None:
        return
    with guard.trusted():
        for ident in idents:
            _SET_ASYNC_EXC(ident, ThreadTimeout)


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
    "sqlite3.enable_load_extension": "loading native extensions (sqlite3)",
    "sqlite3.load_extension": "loading native extensions (sqlite3)",
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
    "os.rename": (0, 1), "os.link": (0, 1), "os.symlink": (1,), "os.truncate": (0,), "os.utime": (0,),
    "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (1,),
    "shutil.make_archive": (0,), "os.setxattr": (0,), "os.removexattr": (0,), "os.chflags": (0,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
_WRITABLE_DEVICES = {"/dev/null"}


def _for_writing(flags: object) -> bool:
    """Whether an opening with these flags is for writing, and so cannot give a directory's descriptor: not O_PATH,
    which gives one whatever the rest of the flags say."""
    return isinstance(flags, int) and (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR) and not (
        flags & getattr(os, "O_PATH", 0))


def _sqlite_file(database: object) -> str | None:
    """The file SQLite opens for `database` (a path, or a ``file:`` URI), or None for an in-memory one."""
    try:
        name = os.fsdecode(database)  # type: ignore[arg-type]
    except TypeError:
        return None
    if name.startswith("file:"):  # taken as a URI whenever it could be one: the event does not say
        from urllib.parse import unquote, urlsplit

        name = unquote(urlsplit(name).path)
    return None if name in ("", ":memory:") else name


def _realpath(path: str) -> str:
    """`os.path.realpath`, or the path as given where a link on the way cannot be read: another worker's
    ``/proc/<pid>/cwd`` is out of reach under Landlock (a PermissionError from inside the hook, not its refusal)."""
    try:
        return os.path.realpath(path)
    except OSError:
        return os.path.abspath(path)


class Guard:
    """The audit hook and its state. One per process; `trusted()` opens it for the server's own operations."""

    def __init__(self) -> None:
        self.root = os.getcwd()
        self.quota: DiskQuota | None = None
        self.hidden: tuple[str, ...] = ()
        """Real paths no cell may open or list (the tasks' answers, the host's keys)."""
        self.files = ""
        """The kernel's rules for files this worker runs under (`_landlock`'s words; empty: none, the hook alone)."""
        self.mapped = False
        """A cell has mapped memory (``mmap``, SQLite): a fork then looks for shared maps to make its own
        (`_remap_shared`, some 0.5 ms, spared the forks of cells that never map)."""
        self._local = threading.local()  # trust and re-entry are per thread: a cell's threads never share them

    def trusted(self) -> "_Trusted":
        return _Trusted(self)

    def sqlite_authorizer(self, action: int, name: object, *_: object) -> int:
        """A SQLite connection's authorizer: it denies attaching (``ATTACH``, ``VACUUM INTO``) a file outside."""
        if action == 24 and name is not None:  # SQLITE_ATTACH
            database = _sqlite_file(name)
            if database is not None and not self.inside(database):
                return 1  # SQLITE_DENY
        return 0  # SQLITE_OK

    def refuse_unreadable(self, path: object) -> None:
        """Raise `SandboxViolation` if `path` is, or is under, a hidden path (after symlinks), or in another
        process's ``/proc/<pid>`` (as written, or after symlinks): the host's command line (``arpo eval --api-key
        …``) and, where the kernel lets it, environment are there, and the other workers' (other episodes') files
        through ``/proc/<pid>/cwd``. ``/proc/self`` and the worker's own threads are its own."""
        if path is None or isinstance(path, int):
            return
        try:
            given = os.path.abspath(os.path.join(os.getcwd(), os.fsdecode(path)))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return
        full = _realpath(given)
        if any(full == hidden or full.startswith(hidden + os.sep) for hidden in self.hidden):
            raise SandboxViolation(f"sandbox: {path!r} is hidden from the sandbox (the tasks' data or the host's keys)")
        for full in (given, full):
            parts = full.split(os.sep)
            if len(parts) < 3 or parts[1] != "proc" or not parts[2].isdigit():
                continue
            pid = int(parts[2])
            if pid != os.getpid() and str(pid) not in os.listdir(f"/proc/{os.getpid()}/task"):
                raise SandboxViolation(f"sandbox: other processes are not readable ({path!r})")

    def inside(self, path: object) -> bool:
        if isinstance(path, int):  # an already-open descriptor: its opening was checked
            return True
        try:
            path = os.fsdecode(path)  # type: ignore[arg-type]
        except TypeError:
            return False
        full = _realpath(os.path.join(os.getcwd(), path))
        return full == self.root or full.startswith(self.root + os.sep) or full in _WRITABLE_DEVICES

    def __call__(self, event: str, args: tuple) -> None:
        if getattr(self._local, "trusted", 0) or getattr(self._local, "busy", False):
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
        elif event in ("os.listdir", "os.scandir"):
            self.refuse_unreadable(args[0] if args and args[0] is not None else ".")
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            self.refuse_unreadable(path)
            folder = path is not None and not isinstance(path, int) and os.path.isdir(path)  # type: ignore[arg-type]
            if folder and not _for_writing(flags):
                # With a directory's descriptor as `dir_fd`, a relative path reaches wherever that directory is, and
                # the "open" event does not carry it: no directory is opened, inside or outside (use its path).
                # Opening one for writing gives none: the kernel refuses it (EISDIR), or with O_TMPFILE makes a file
                # in it. `tempfile`'s files open their folder so, with an opener that opens the file (checked too).
                raise SandboxViolation(f"sandbox: opening a directory as a file descriptor is not allowed ({path!r}); "
                                       "use its path")
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and not self.inside(path):
                raise SandboxViolation(f"sandbox: writing outside the working directory is not allowed ({path!r})")
            if writes and self.quota is not None and not isinstance(path, int):
                if not folder:
                    self.quota.admit(path)
                elif isinstance(flags, int) and flags & _O_TMPFILE == _O_TMPFILE and _O_TMPFILE:  # an unnamed file
                    self.quota.admit(os.path.join(os.fsdecode(path), "#unnamed"))  # type: ignore[arg-type]
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and args[i] is not None and not self.inside(args[i]):
                    what = "linking to" if event == "os.link" and i == 0 else "changing"  # a link writes through
                    raise SandboxViolation(
                        f"sandbox: {what} files outside the working directory is not allowed ({args[i]!r})"
                    )
            if self.quota is not None:
                if event in ("os.mkdir", "os.symlink"):  # an entry of a block, which a fork copies
                    self.quota.admit(args[0 if event == "os.mkdir" else 1], directory=True)
                elif event == "os.link":  # a second name for a file: a fork copies it twice
                    self.quota.admit(args[1], like=args[0])
                    self.quota.recount()
                elif event == "os.truncate" and not isinstance(args[0], int):  # it may grow a closed file
                    self.quota.admit(args[0])
                elif event in _FREEING_EVENTS:
                    self.quota.recount()
        elif event == "mmap.__new__":
            self.mapped = True
        elif event == "sqlite3.connect":  # SQLite opens and writes its files in C, where no "open" event is raised
            self.mapped = True  # its -shm file, in WAL mode
            database = _sqlite_file(args[0])
            if database is not None:
                if not self.inside(database):
                    raise SandboxViolation(
                        f"sandbox: a database outside the working directory is not allowed ({database!r})")
                if self.quota is not None:
                    self.quota.admit(database)
        elif event == "import" and args and args[0] in ("ctypes", "_ctypes", "cffi", "_cffi_backend"):
            raise SandboxViolation(f"sandbox: foreign function calls ({args[0]}) are not allowed")


_FREEING_EVENTS = {"os.remove", "os.rmdir", "os.rename", "os.link", "os.truncate", "shutil.rmtree", "shutil.move"}
"""Path events after which the quota recounts the working directory (they free, move or resize what it holds)."""
_BLOCK = 4096


def _footprint(st: os.stat_result) -> int:
    """What an entry costs the quota: its size in whole 4 KB blocks, at least one (an empty file or a directory
    still takes an inode and a block, and a fork copies it)."""
    return max(1, -(-st.st_size // _BLOCK)) * _BLOCK


class DiskQuota:
    """Holds a worker's working directory to `limit` bytes and `max_entries` entries. Checked, from the audit hook, at
    each opening of a file for writing and each directory made: the files not open for writing count at their size,
    every file open for writing (this one included) at `file_cap` (the size limit, ``RLIMIT_FSIZE``, it may still grow
    to), and the opening fails with `DiskQuotaExceeded` when that sum is over the limit. So the directory never holds
    more than `limit`, whatever the cell writes. The sizes are kept between checks (a file not open for writing
    changes only through an event the hook sees) and recounted after removals and renames; a file truncated by name
    counts as one opened for writing until the next check."""

    def __init__(self, root: str, limit: int, file_cap: int, max_entries: int = 0) -> None:
        self.root, self.limit, self.file_cap = root, limit, min(file_cap, limit)
        self.max_entries = max_entries
        """Files, directories and links the directory may hold together (0: any number): a fork copies each one,
        empty or not (some 70 microseconds an entry here)."""
        self.sizes: dict[str, int] | None = None
        """What each entry not open for writing costs (None: to be counted)."""
        self.total = 0
        self.writing: set[str] = set()
        """Files opened for writing that may still be open."""
        self.lock = threading.Lock()

    def moved_to(self, root: str) -> "DiskQuota":
        """The quota of a fork's copy of the directory, at `root`."""
        return DiskQuota(root, self.limit, self.file_cap, self.max_entries)

    def recount(self) -> None:
        with self.lock:
            self.sizes = None

    def admit(self, path: object, directory: bool = False, like: object = None) -> None:
        """Check that making or opening `path` for writing keeps the directory within the quota, or raise
        `DiskQuotaExceeded`. `directory`: it is a directory to make; `like`: a file `path` becomes a new name of (a
        hard link), which costs what that file does."""
        try:
            full = os.path.realpath(os.path.join(os.getcwd(), os.fsdecode(path)))  # type: ignore[arg-type]
            linked = _footprint(os.stat(like)) if like is not None else 0  # type: ignore[arg-type]
        except (TypeError, ValueError, OSError):
            return  # not a path, or nothing to link: the call fails on its own
        if not full.startswith(self.root + os.sep):
            return  # /dev/null, or the directory itself
        with self.lock:
            sizes = self._sizes()
            open_now = self._open_for_writing()
            for p in self.writing - open_now:  # closed since the last check: its size holds until it is reopened
                self.writing.discard(p)
                try:
                    sizes[p] = _footprint(os.lstat(p))
                    self.total += sizes[p]
                except OSError:  # removed
                    pass
            for p in open_now - self.writing:  # open since before a recount, or opened where the hook cannot see
                self.total -= sizes.pop(p, 0)
                self.writing.add(p)
            if directory:
                new = 0 if full in sizes else _BLOCK
            elif like is not None:
                new = 0 if full in sizes or full in self.writing else linked
            else:
                new = 0 if full in self.writing else self.file_cap - sizes.get(full, 0)
            entries = len(sizes) + len(self.writing)
            if self.max_entries and full not in sizes and full not in self.writing and entries >= self.max_entries:
                raise DiskQuotaExceeded(
                    errno.ENOSPC,
                    f"No space left on device: the sandbox may hold {self.max_entries} files and directories in all "
                    f"(every fork copies each one), and it holds {entries}. Delete some",
                    os.fsdecode(path))  # type: ignore[arg-type]
            if self.total + new + len(self.writing) * self.file_cap > self.limit:
                mb = 2**20
                raise DiskQuotaExceeded(
                    errno.ENOSPC,
                    f"No space left on device: the sandbox's files may take {self.limit / mb:g} MB in all; "
                    f"{self.total / mb:.1f} MB are taken, and {len(self.writing)} file(s) open for writing count at "
                    f"the {self.file_cap / mb:g} MB each may grow to. Delete files, or close them",
                    os.fsdecode(path))  # type: ignore[arg-type]
            if directory or like is not None:
                if full not in sizes and full not in self.writing:
                    sizes[full] = new
                    self.total += new
            else:
                self.total -= sizes.pop(full, 0)
                self.writing.add(full)

    def _sizes(self) -> dict[str, int]:
        if self.sizes is None:
            sizes, stack = {}, [self.root]
            while stack:
                try:
                    with os.scandir(stack.pop()) as entries:
                        for entry in entries:
                            try:
                                sizes[entry.path] = _footprint(entry.stat(follow_symlinks=False))
                                if entry.is_dir(follow_symlinks=False):
                                    stack.append(entry.path)
                            except OSError:
                                pass
                except OSError:
                    pass
            self.sizes, self.total = sizes, sum(sizes.values())
            self.writing = set()
        return self.sizes

    def _open_for_writing(self) -> set[str]:
        """The files in the directory that this process has open for writing, by /proc/self/fd."""
        found = set()
        try:
            fds = os.listdir("/proc/self/fd")
        except OSError:
            return found
        for fd in fds:
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
                if not target.startswith(self.root + os.sep):
                    continue
                with open(f"/proc/self/fdinfo/{fd}") as info:
                    flags = next((int(line.split()[1], 8) for line in info if line.startswith("flags:")), 0)
            except (OSError, ValueError):
                continue
            if flags & (os.O_WRONLY | os.O_RDWR):
                found.add(target)
        return found


class _Trusted:
    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def __enter__(self) -> None:
        local = self.guard._local
        local.trusted = getattr(local, "trusted", 0) + 1

    def __exit__(self, *exc: object) -> None:
        self.guard._local.trusted -= 1


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


def _drop_capabilities() -> str:
    """Give up every Linux capability this process holds, for it and all it forks; return what was done.

    A worker of a host that runs as root would otherwise keep root's powers that no audit hook sees: ``os.mknod``
    raises no audit event, and a device node made in the working directory (a disk's, say) would be written to
    as a file inside it. Without ``CAP_MKNOD`` the kernel refuses to make one. The capabilities go from the bounding
    set first (that needs ``CAP_SETPCAP``, so it goes last), then from the effective, permitted and inheritable sets,
    which a process may always lower. A process that holds none (a user's) changes nothing."""
    try:
        import ctypes  # loaded before the guard is armed; the guard refuses ctypes calls afterwards

        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/self/status") as f:
            held = next((int(line.split()[1], 16) for line in f if line.startswith("CapEff:")), 0)
        if not held:
            return ""
        pr_capbset_drop, cap_setpcap = 24, 8
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
        for cap in [c for c in range(last + 1) if c != cap_setpcap] + [cap_setpcap]:
            libc.prctl(pr_capbset_drop, cap, 0, 0, 0)  # fails without CAP_SETPCAP: the sets below still go
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable}, all zero
        if libc.capset(header, data) != 0:
            return ""
        return "no capabilities"
    except Exception:  # noqa: BLE001 - any failure means: the capabilities stay, the audit hook still checks
        return ""


_SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, 0x40000000, (59, 322, 319, 112, 109)),
    "aarch64": (0xC00000B7, 0xFFFFFFFF, (221, 281, 279, 157, 154)),
}
"""Per machine: the audit architecture, the lowest number of another ABI (x86_64's x32 calls, all refused; none on
aarch64), and the numbers of the calls refused: execve, execveat, memfd_create, setsid, setpgid."""


def _seccomp_filter() -> str:
    """Forbid this process and all it forks to run a program or make a memory file, by a seccomp filter; return what
    was done.

    The audit hook refuses the ways Python's own modules start programs, but `_posixsubprocess.fork_exec`, which
    `subprocess` calls after its audit event, raises none, and a cell can load a fresh copy of that module whatever
    is done to the loaded one. ``os.memfd_create`` raises none either, and the memory its files hold is not the
    process's address space: past `memory_mb` (40 of 64 MB each took 2.6 GB). Nor do ``os.setsid`` and
    ``os.setpgid``, and a worker out of the template's process group outlives it (a cell that ignores its interrupts
    ran on after its host was killed). The kernel's filter holds whatever the cell calls: those calls fail with
    ``EPERM``."""
    arch = _SECCOMP_ARCHES.get(os.uname().machine)
    if arch is None:
        return ""
    audit_arch, other_abi, refused = arch
    try:
        import ctypes  # loaded before the guard is armed; the guard refuses ctypes calls afterwards

        class Filter(ctypes.Structure):
            _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                        ("k", ctypes.c_uint32)]

        class Program(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

        load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, ..JGE.., BPF_RET
        allow_at, deny_at = 4 + len(refused), 5 + len(refused)  # the two returns, after the checks
        code = [
            (load, 0, 0, 4),  # seccomp_data.arch
            (jeq, 0, allow_at - 2, audit_arch),  # another architecture's call: allowed
            (load, 0, 0, 0),  # seccomp_data.nr
            (jge, deny_at - 4, 0, other_abi),
            *[(jeq, deny_at - i - 5, 0, nr) for i, nr in enumerate(refused)],
            (ret, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW: none of them
            (ret, 0, 0, 0x00050000 | errno.EPERM),  # SECCOMP_RET_ERRNO
        ]
        filters = (Filter * len(code))(*[Filter(*op) for op in code])
        program = Program(len(code), filters)
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
        if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
            return ""
        if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(program), 0, 0) != 0:
            return ""
        return "no programs, memory files or new sessions (seccomp)"
    except Exception:  # noqa: BLE001 - any failure means: no filter, the audit hook still refuses the usual ways
        return ""


_LANDLOCK_CREATE, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT = 444, 445, 446  # the same on every architecture
_FS_WRITE_FILE, _FS_READ_FILE, _FS_TRUNCATE = 1 << 1, 1 << 2, 1 << 14
_FS_FILE_RIGHTS = 1 << 0 | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | 1 << 15
"""What a rule on a file, not a directory, may grant: execute, write, read, truncate, device ioctls."""
_LIBC = None
"""The C library through ctypes, taken before the guard is armed (`template_main`), for the Landlock calls."""


def _landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where it has none (before Linux 5.13, or not enabled; not Linux: its
    calls' numbers are another system's calls)."""
    if _LIBC is None or not sys.platform.startswith("linux"):
        return 0
    try:
        import ctypes

        return max(0, int(_LIBC.syscall(_LANDLOCK_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))))
    except Exception:  # noqa: BLE001 - no Landlock
        return 0


def _landlock_words(abi: int) -> str:
    """The layer as `LocalSandbox.protections` lists it."""
    return (f"writes only in the sandbox's folder, hidden paths unreadable{', no signals out' if abi >= 6 else ''} "
            f"(Landlock ABI {abi})") if abi else ""


def _readable_around(hidden: tuple[str, ...]) -> list[str]:
    """What is left to read when `hidden` is taken out of the file system, as few subtrees as Landlock's rules (which
    grant a whole subtree) can say it: every entry of each folder above a hidden path, but the hidden ones and the
    folders on the way to one. A link is left out (a rule follows it: one to a hidden path would open it); what a
    link elsewhere points to is read as its target is. An entry made later in a folder on the way is unreadable."""
    ancestors = set()
    for path in hidden:
        while path != os.sep:
            path = os.path.dirname(path)
            ancestors.add(path)
    readable = []
    for folder in sorted(ancestors):
        if any(folder == h or folder.startswith(h + os.sep) for h in hidden):
            continue
        try:
            entries = os.scandir(folder)
        except OSError:  # not there (a hidden path that does not exist yet), or not listable
            continue
        with entries:
            for entry in entries:
                if entry.path not in ancestors and entry.path not in hidden and not entry.is_symlink():
                    readable.append(entry.path)
    return readable


def _landlock(root: str, hidden: tuple[str, ...]) -> str:
    """Restrict this process and all it forks, by the kernel's Landlock, to writing under `root` (the folder of every
    worker's working directory) and ``/dev/null``, and to reading no file under the `hidden` paths; return what was
    done. Call it before any cell runs: it cannot be undone.

    The audit hook refuses the same writes and reads, but from inside the interpreter the cell runs in, where a cell
    can reach it: it found the guard by walking its frames down to the server's and turned its checks off, or replaced
    a library function the hook calls (``posixpath.realpath``) with its own, which then ran unchecked inside the hook.
    Either way it wrote outside its directory and read the tasks' answers. The kernel's rules hold whatever the cell
    does."""
    abi = _landlock_abi()
    if abi < 1:
        return ""
    try:
        import ctypes

        write = _FS_WRITE_FILE | sum(1 << bit for bit in range(4, 13))  # remove and make every kind of entry
        write |= (1 << 13 if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)  # refer (link, rename), truncate
        handled = write | (_FS_READ_FILE if hidden else 0)
        # handled_access_fs, handled_access_net (none: the network namespace), scoped: from ABI 6, no signal to a
        # process outside this worker (the host, the template, another worker)
        fields = struct.pack("=QQQ", handled, 0, 2) if abi >= 6 else struct.pack("=Q", handled)
        attr = ctypes.create_string_buffer(fields, len(fields))
        ruleset = _LIBC.syscall(_LANDLOCK_CREATE, attr, ctypes.c_size_t(len(fields)), ctypes.c_uint32(0))
        if ruleset < 0:
            return ""
        try:
            def allow(path: str, access: int) -> None:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    return
                try:
                    if not os.path.isdir(f"/proc/self/fd/{fd}"):
                        access &= _FS_FILE_RIGHTS
                    rule = ctypes.create_string_buffer(struct.pack("=Qi", access & handled, fd), 12)
                    _LIBC.syscall(_LANDLOCK_ADD_RULE, ruleset, ctypes.c_int(1), rule, ctypes.c_uint32(0))
                finally:
                    os.close(fd)

            allow(root, write | _FS_READ_FILE)
            for device in _WRITABLE_DEVICES:
                allow(device, _FS_WRITE_FILE | _FS_TRUNCATE | _FS_READ_FILE)
            if hidden:
                for path in _readable_around(hidden):
                    allow(path, _FS_READ_FILE)
            if _LIBC.syscall(_LANDLOCK_RESTRICT, ruleset, ctypes.c_uint32(0)) != 0:
                return ""
        finally:
            os.close(ruleset)
        return _landlock_words(abi)
    except Exception:  # noqa: BLE001 - any failure means: no Landlock, the audit hook still checks
        return ""


def _refuse_unaudited() -> None:
    """Have the loaded C functions that raise no audit event and that the sandbox refuses say so: running a program
    (`_posixsubprocess.fork_exec`), a memory file (``os.memfd_create``), a session or process group of its own
    (``os.setsid``, ``os.setpgid``, ``os.setpgrp``), POSIX shared memory (its files live in /dev/shm, outside
    the working directory, and outlast the worker). A fresh copy of such a module still gets past this, but not
    past `_seccomp_filter`, except to shared memory."""
    import posix

    def refuse(what: str, name: str):  # noqa: ANN202
        def refused(*args: object, **kwargs: object) -> None:
            raise SandboxViolation(f"sandbox: {what} is not allowed ({name})")

        return refused

    try:
        import _posixshmem
    except ImportError:
        _posixshmem = None
    try:
        import _posixsubprocess
    except ImportError:
        _posixsubprocess = None
    refusals = [(_posixsubprocess, "fork_exec", "running programs"), (_posixshmem, "shm_open", "shared memory")]
    refusals += [(module, name, "making memory files" if name == "memfd_create" else "leaving the sandbox's process "
                  "group") for module in (posix, os) for name in ("memfd_create", "setsid", "setpgid", "setpgrp")]
    for module, name, what in refusals:
        if module is not None and hasattr(module, name):
            setattr(module, name, refuse(what, f"{module.__name__}.{name}"))


class _ThreadSemLock:
    """``_multiprocessing.SemLock`` for one process, on a condition variable: what multiprocessing's locks, queues,
    events and `ThreadPool` build on. The real one is a POSIX semaphore, a file in /dev/shm, outside the working
    directory: Landlock refuses it, and ``mp.Lock()``, ``mp.Queue()`` and ``ThreadPool(2)`` failed with a bare
    "Permission denied". A cell cannot make processes, so one process is all there is to synchronise. The name is
    never kept (as a semaphore unlinked at once): no resource tracker is started. Same methods and errors as the C
    type (Modules/_multiprocessing/semaphore.c)."""

    SEM_VALUE_MAX = 2**31 - 1
    _RECURSIVE_MUTEX = 0

    def __init__(self, kind: int, value: int, maxvalue: int, name: str | None = None, unlink: bool = True) -> None:
        if kind not in (0, 1):
            raise ValueError("unrecognized kind")
        self.kind, self.maxvalue, self.name = kind, maxvalue, None
        self.handle = id(self)
        self._value, self._count_, self._owner = value, 0, None
        self._changed = threading.Condition(threading.Lock())

    def _is_mine(self) -> bool:
        return self._count_ > 0 and self._owner == threading.get_ident()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        if self.kind == self._RECURSIVE_MUTEX and self._is_mine():
            self._count_ += 1
            return True
        with self._changed:
            if not self._changed.wait_for(lambda: self._value > 0, (None if timeout is None else max(timeout, 0))
                                          if block else 0):
                return False
            self._value -= 1
            self._count_ += 1
            self._owner = threading.get_ident()
        return True

    def release(self) -> None:
        if self.kind == self._RECURSIVE_MUTEX:
            if not self._is_mine():
                raise AssertionError("attempt to release recursive lock not owned by thread")
            if self._count_ > 1:
                self._count_ -= 1
                return
        with self._changed:
            if self._value >= self.maxvalue:
                raise ValueError("semaphore or lock released too many times")
            self._value += 1
            self._count_ -= 1
            self._changed.notify()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _count(self) -> int:
        return self._count_

    def _get_value(self) -> int:
        return self._value

    def _is_zero(self) -> bool:
        return self._value == 0

    def _after_fork(self) -> None:
        self._count_ = 0

    @classmethod
    def _rebuild(cls, *args: object) -> None:
        raise SandboxViolation("sandbox: a lock from another process cannot be used here")


def _local_semaphores() -> None:
    """Give multiprocessing semaphores of this process (`_ThreadSemLock`) in place of POSIX ones."""
    try:
        import _multiprocessing
    except ImportError:
        return
    if hasattr(_multiprocessing, "SemLock"):
        _ThreadSemLock.SEM_VALUE_MAX = _multiprocessing.SemLock.SEM_VALUE_MAX
        _multiprocessing.SemLock = _ThreadSemLock


def _guard_node_makers(guard: Guard) -> None:
    """Check `os.mknod` and `os.mkfifo`, which raise no audit event, like the calls that do: only inside the working
    directory, and within its quota. (Device nodes the kernel refuses anyway: the workers hold no capabilities.)
    And have `shutil.rmtree` work by path: its descriptor-based way opens directories, which the guard refuses."""
    import posix
    import shutil

    shutil._use_fd_functions = False  # type: ignore[attr-defined]

    def checked(original):  # noqa: ANN001, ANN202
        def make(path, *args, dir_fd=None, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if dir_fd is not None or not guard.inside(path):
                raise SandboxViolation(f"sandbox: making files outside the working directory is not allowed "
                                       f"({path!r})")
            if guard.quota is not None:
                guard.quota.admit(path, directory=True)
            return original(path, *args, **kwargs)

        make.__doc__, make.__name__ = original.__doc__, original.__name__
        return make

    for name in ("mknod", "mkfifo"):
        original = getattr(posix, name, None)
        if original is not None:
            setattr(posix, name, checked(original))
            setattr(os, name, getattr(posix, name))


def _guard_sqlite(guard: Guard) -> None:
    """Make `sqlite3.connect` give each connection the guard's authorizer. SQLite writes its files in C: the guard
    checks the database a connection opens (the ``sqlite3.connect`` event), but ``ATTACH`` and ``VACUUM INTO`` make
    files that no event reports. (The event for a new connection comes before it can take an authorizer, so the
    function that makes it is wrapped instead, in the template, for every worker.)"""
    try:
        import sqlite3
        import sqlite3.dbapi2
    except ImportError:
        return
    original = sqlite3.connect

    def connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        connection = original(*args, **kwargs)  # type: ignore[arg-type]
        connection.set_authorizer(guard.sqlite_authorizer)
        return connection

    connect.__doc__ = original.__doc__
    sqlite3.connect = sqlite3.dbapi2.connect = connect  # type: ignore[assignment]


def _guard_socketpair(guard: Guard) -> None:
    """Let `socket.socketpair` make its two connected local sockets, which reach nothing but each other: asyncio's
    event loop wakes itself with one, and ``asyncio.run`` failed with "network access is not allowed". Every other
    socket stays refused, local ones too: one made around a descriptor the cell holds (its channel to the host)
    could take the descriptors the host passes on it."""
    original = socket.socketpair

    def socketpair(family: int | None = None, type: int = socket.SOCK_STREAM, proto: int = 0
                   ) -> tuple[socket.socket, socket.socket]:
        if family not in (None, socket.AF_UNIX):
            raise SandboxViolation(f"sandbox: network access is not allowed (socket.socketpair of family {family})")
        with guard.trusted():
            return original(socket.AF_UNIX, type, proto)

    socketpair.__doc__ = original.__doc__
    socket.socketpair = socketpair  # type: ignore[assignment]


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
            _interrupt_threads(self.guard, running)
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
                _interrupt_threads(self.guard, {i})
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
                return int(_stat_fields()[17]) > 1  # num_threads
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
                    _CHDIR(_moved(cwd, old, new))
                except OSError:
                    _CHDIR(new)
                _reopen_files(old, new)
                if self.guard.mapped:
                    _remap_shared(old, new)
            self.guard.root = new
            if self.guard.quota is not None:
                self.guard.quota = self.guard.quota.moved_to(self.guard.root)
            # what named the parent's folder names the copy's: its files are there, and the parent's are outside the
            # copy's root (`tempfile` in a fork wrote to the parent's folder and was refused)
            try:
                for name in ("TMPDIR", "MPLCONFIGDIR"):
                    if isinstance(os.environ.get(name), str):
                        os.environ[name] = _moved(os.environ[name], old, new)
                tempfile = sys.modules.get("tempfile")
                if isinstance(getattr(tempfile, "tempdir", None), str):
                    tempfile.tempdir = _moved(tempfile.tempdir, old, new)
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
        stack = [f for f in te.stack if f.filename != __file__]
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


# --------------------------------------------------------------------------------------------------------------------
# The template: preload, then fork workers on request
# --------------------------------------------------------------------------------------------------------------------
def _in_copy(real: str, old: str, new: str) -> str | None:
    """The real path `real` in the folder `old` (a worker's root) as the same path in `new` (its fork's), or None
    for a path outside `old`."""
    return new + real[len(old):] if real == old or real.startswith(old + os.sep) else None


def _moved(path: str, old: str, new: str) -> str:
    """`path` (followed to its real path) in the fork's folder where it is in the parent's; any other path as it is."""
    moved = _in_copy(_REALPATH(path), old, new)
    return path if moved is None else moved


def _reopen_files(old: str, new: str) -> None:
    """In a fork: the files the cell holds open in the parent's folder (a log it writes, an SQLite connection) are
    the copy's files from now on, at the same place in each and for the same use. A fork shares its descriptors'
    files with its parent, so the copy's writes went to the parent's files (and past its own disk quota, which counts
    its own folder). A file with no name (``tempfile.TemporaryFile``, one removed while open) is copied into a new
    unnamed file of the copy's folder. Regular files only; one that cannot be opened again is left as it is."""
    try:
        fds = [int(fd) for fd in _LISTDIR("/proc/self/fd")]
    except (OSError, ValueError):
        return
    for fd in fds:
        try:
            target = _READLINK(f"/proc/self/fd/{fd}")  # a real path already
            moved = _in_copy(target, old, new)
            if moved is None or not _S_ISREG(_FSTAT(fd).st_mode):
                continue
            flags = _FCNTL(fd, fcntl.F_GETFL) & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC)
            offset, inheritable = _LSEEK(fd, 0, os.SEEK_CUR), _GET_INHERITABLE(fd)
            copy = _unnamed_copy(fd, new, flags) if target.endswith(_DELETED) else _OPEN(moved, flags)
        except OSError:
            continue
        try:
            _LSEEK(copy, offset, os.SEEK_SET)
            _DUP2(copy, fd, inheritable)
        except OSError:
            pass
        finally:
            _CLOSE(copy)


_DELETED = " (deleted)"


def _unnamed_copy(fd: int, folder: str, flags: int) -> int:
    """A new unnamed file in `folder` with the contents of the unnamed file open at `fd`, open with `flags`."""
    if not _O_TMPFILE:
        raise OSError(errno.EOPNOTSUPP, "no O_TMPFILE")
    copy = _OPEN(folder, _O_TMPFILE | os.O_RDWR, 0o600)
    try:
        source = _OPEN(f"/proc/self/fd/{fd}", os.O_RDONLY)  # the same file, readable whatever `fd` was opened for
        try:
            while True:
                chunk = _READ(source, 1 << 20)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[_WRITE(copy, view):]
        finally:
            _CLOSE(source)
        if flags & os.O_ACCMODE == os.O_RDWR and not flags & os.O_APPEND:
            return copy
        again = _OPEN(f"/proc/self/fd/{copy}", flags)  # for the same use: write-only, appending
    except BaseException:
        _CLOSE(copy)
        raise
    _CLOSE(copy)
    return again


_MMAP = _MPROTECT = _STRING_AT = _MEMMOVE = None
"""``mmap`` and ``mprotect`` of the C library and ctypes' ``string_at`` and ``memmove``, taken before any cell runs
(`_take_mapping_calls`), for `_remap_shared`: nothing a cell rebinds runs in a fork's trusted steps."""
_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4
_MAP_SHARED, _MAP_FIXED, _MAP_ANONYMOUS = 0x01, 0x10, 0x20
_SHARED_ANONYMOUS = "/dev/zero (deleted)"


def _take_mapping_calls() -> None:
    global _MMAP, _MPROTECT, _STRING_AT, _MEMMOVE
    if _LIBC is None:
        return
    try:
        import ctypes

        mmap, mprotect = _LIBC.mmap, _LIBC.mprotect
        mmap.restype, mprotect.restype = ctypes.c_void_p, ctypes.c_int
        mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _MMAP, _MPROTECT, _STRING_AT, _MEMMOVE = mmap, mprotect, ctypes.string_at, ctypes.memmove
    except Exception:  # noqa: BLE001 - without them a fork's shared maps stay shared
        pass


def _remap_shared(old: str, new: str) -> None:
    """In a fork: the memory a cell maps shared is the copy's own. A file of the parent's folder mapped shared
    (``np.memmap``, ``mmap.mmap`` of a file, SQLite's ``-shm``) is mapped again at the same address from the copy's
    file; an anonymous shared map (``mmap.mmap(-1, n)``) becomes a new one with the same contents. A fork keeps shared
    maps shared, so a branch's writes through them reached the other branch's memory and files."""
    if _MMAP is None:
        return
    try:
        fd = _OPEN("/proc/self/maps", os.O_RDONLY)
        try:
            text = b""
            while chunk := _READ(fd, 1 << 16):
                text += chunk
        finally:
            _CLOSE(fd)
    except OSError:
        return
    for line in text.decode("utf-8", "replace").splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or len(parts[1]) < 4 or parts[1][3] != "s":
            continue
        try:
            start, end = (int(x, 16) for x in parts[0].split("-"))
            perms, offset, path = parts[1], int(parts[2], 16), parts[5]
        except ValueError:
            continue
        prot = ((_PROT_READ if "r" in perms else 0) | (_PROT_WRITE if "w" in perms else 0)
                | (_PROT_EXEC if "x" in perms else 0))
        moved = _in_copy(path, old, new)
        try:
            if moved is not None and not path.endswith(_DELETED):
                mapped = _OPEN(moved, os.O_RDWR if "w" in perms else os.O_RDONLY)
                try:
                    _MMAP(start, end - start, prot, _MAP_SHARED | _MAP_FIXED, mapped, offset)
                finally:
                    _CLOSE(mapped)
            elif path == _SHARED_ANONYMOUS and "r" in perms:
                contents = _STRING_AT(start, end - start)
                if _MMAP(start, end - start, prot | _PROT_WRITE, _MAP_SHARED | _MAP_ANONYMOUS | _MAP_FIXED, -1,
                         0) == start:
                    _MEMMOVE(start, contents, end - start)
                    if not prot & _PROT_WRITE:
                        _MPROTECT(start, end - start, prot)
        except (OSError, MemoryError):
            continue


def _become_worker(sock: socket.socket, workdir: str, limits: dict, guard: Guard) -> None:
    os.chdir(workdir)
    guard.root = os.path.realpath(workdir)
    os.environ["TMPDIR"] = workdir
    os.environ["MPLCONFIGDIR"] = os.path.join(workdir, ".matplotlib")
    import tempfile

    tempfile.tempdir = workdir
    vm = _virtual_memory_bytes()
    mem = int(limits.get("memory_mb", 1024)) * 2**20
    file_cap = int(limits.get("file_size_mb", 64)) * 2**20
    disk = int(limits.get("disk_mb", 256)) * 2**20
    entries = int(limits.get("max_files", 4096))
    kept = [os.path.realpath(p) for p in (guard.root, sys.prefix, sys.base_prefix, os.path.dirname(__file__))]
    guard.hidden = tuple(h for h in (os.path.realpath(p) for p in limits.get("hidden_paths", ()))
                         if not any(k == h or k.startswith(h + os.sep) for k in kept))  # what would hide Python itself
    with guard.trusted():  # before any cell runs: the kernel's rules for files, which no cell can undo
        guard.files = _landlock(os.path.dirname(guard.root), guard.hidden)
    if disk > 0 or entries > 0:
        guard.quota = DiskQuota(guard.root, disk if disk > 0 else sys.maxsize, file_cap, entries)
        file_cap = guard.quota.file_cap
    for name, value in (
        ("RLIMIT_AS", vm + mem if mem > 0 else resource.RLIM_INFINITY),
        ("RLIMIT_FSIZE", file_cap),
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
    global _SET_ASYNC_EXC, _LIBC
    try:
        import ctypes

        _SET_ASYNC_EXC = ctypes.pythonapi.PyThreadState_SetAsyncExc
        _SET_ASYNC_EXC.argtypes = [ctypes.c_ulong, ctypes.py_object]
        _LIBC = ctypes.CDLL(None, use_errno=True)
    except Exception:  # noqa: BLE001 - without it, the cells' threads are not interrupted (only timed)
        pass
    _take_mapping_calls()
    for name in preload:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a missing optional module must not stop the sandbox
            pass
    capabilities = _drop_capabilities()  # after the namespace, which needs them, and the imports
    import gc

    gc.collect()
    gc.freeze()  # keep preloaded objects out of later collections: pages stay shared after fork
    programs = _seccomp_filter()
    guard = Guard()
    _guard_sqlite(guard)
    _guard_node_makers(guard)
    _guard_socketpair(guard)
    _refuse_unaudited()
    _local_semaphores()
    sys.addaudithook(guard)
    with guard.trusted():
        chan = socket.socket(fileno=fd)
        send_message(chan, {"ok": True, "pid": os.getpid(), "network": network, "capabilities": capabilities,
                            "programs": programs})  # the rules for files are each worker's own (its ping says them)
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
    with guard.trusted():  # the host is gone or asked: take every worker with us, and their files
        _end_workers()
        root = os.environ.get("ARPO_SANDBOX_ROOT")
        if root:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        os.killpg(0, signal.SIGKILL)


def _end_workers(wait_s: float = 2.0) -> None:
    """SIGKILL every other process of this process group (the workers and their forks) and wait until they are
    gone, so that none writes into a working directory while it is removed."""
    me, group = os.getpid(), os.getpgrp()
    others = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        fields = _stat_fields(name)
        if fields and int(fields[2]) == group:  # state, ppid, pgrp
            others.append(int(name))
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
    deadline = time.monotonic() + wait_s
    while others and time.monotonic() < deadline:
        others = [pid for pid in others if (_stat_fields(pid) or ["X"])[0] not in ("Z", "X")]  # none: gone
        time.sleep(0.01)


def _stat_fields(pid: int | str = "self") -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the process's name (its state first), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except OSError:
        return None


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "template":
        template_main(int(sys.argv[2]), [m for m in sys.argv[3:] if m])
    else:
        sys.exit("usage: sandbox_server.py template FD [MODULE ...]")
