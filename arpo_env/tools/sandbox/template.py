"""The code that runs *inside* the local Python sandbox: the template process and its workers.

This file is executed as a script (``python template.py template FD``) and imports nothing from ``arpo_env``: the
sandbox processes load only the standard library, the preloaded modules (numpy, sympy) and the modules beside this
one, by their own names (`channel`, `containment`, `fork_copy`, `worker`: the script's folder is first on its path).

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

import os
import resource
import signal
import socket
import sys
import time

import containment
from channel import recv_message, send_message
from containment import (
    DiskQuota,
    Guard,
    drop_capabilities,
    guard_node_makers,
    guard_socketpair,
    guard_sqlite,
    landlock,
    local_semaphores,
    private_network,
    refuse_unaudited,
    seccomp_filter,
    set_subreaper,
)
from fork_copy import stat_fields, take_mapping_calls
from worker import Worker


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
    file_cap = int(limits.get("file_size_mb", 64)) * 2**20
    disk = int(limits.get("disk_mb", 256)) * 2**20
    entries = int(limits.get("max_files", 4096))
    kept = [os.path.realpath(p) for p in (guard.root, sys.prefix, sys.base_prefix, os.path.dirname(__file__))]
    guard.hidden = tuple(h for h in (os.path.realpath(p) for p in limits.get("hidden_paths", ()))
                         if not any(k == h or k.startswith(h + os.sep) for k in kept))  # what would hide Python itself
    with guard.trusted():  # before any cell runs: the kernel's rules for files, which no cell can undo
        guard.files = landlock(os.path.dirname(guard.root), guard.hidden)
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
    set_subreaper()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # exited workers are reaped by the kernel: no zombies
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the host's terminal is for the host
    network = private_network()
    try:
        import ctypes

        containment._SET_ASYNC_EXC = ctypes.pythonapi.PyThreadState_SetAsyncExc
        containment._SET_ASYNC_EXC.argtypes = [ctypes.c_ulong, ctypes.py_object]
        containment._LIBC = ctypes.CDLL(None, use_errno=True)
    except Exception:  # noqa: BLE001 - without it, the cells' threads are not interrupted (only timed)
        pass
    take_mapping_calls()
    for name in preload:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a missing optional module must not stop the sandbox
            pass
    capabilities = drop_capabilities()  # after the namespace, which needs them, and the imports
    import gc

    gc.collect()
    gc.freeze()  # keep preloaded objects out of later collections: pages stay shared after fork
    programs = seccomp_filter()
    guard = Guard()
    guard_sqlite(guard)
    guard_node_makers(guard)
    guard_socketpair(guard)
    refuse_unaudited()
    local_semaphores()
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
        fields = stat_fields(name)
        if fields and int(fields[2]) == group:  # state, ppid, pgrp
            others.append(int(name))
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
    deadline = time.monotonic() + wait_s
    while others and time.monotonic() < deadline:
        others = [pid for pid in others if (stat_fields(pid) or ["X"])[0] not in ("Z", "X")]  # none: gone
        time.sleep(0.01)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "template":
        template_main(int(sys.argv[2]), [m for m in sys.argv[3:] if m])
    else:
        sys.exit("usage: template.py template FD [MODULE ...]")
