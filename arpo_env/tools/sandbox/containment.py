"""The sandbox's containment layers, set up in the template before any cell runs and inherited by every worker:
the audit hook (`Guard`), the disk quota, capabilities, seccomp, Landlock, the private network, and the timers that
interrupt threads.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import sys
import threading


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


for _shown in (SandboxViolation, DiskQuotaExceeded, CellTimeout, ThreadTimeout):
    _shown.__module__ = "builtins"  # a cell's traceback names them alone, as it names PermissionError
del _shown

_SET_ASYNC_EXC = None
"""CPython's ``PyThreadState_SetAsyncExc``, taken through ctypes before the guard is armed (`template_main`)."""


def interrupt_threads(guard: "Guard", idents: set[int]) -> None:
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
O_TMPFILE_FLAG = getattr(os, "O_TMPFILE", 0)
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
        """The kernel's rules for files this worker runs under (`landlock`'s words; empty: none, the hook alone)."""
        self.mapped = False
        """A cell has mapped memory (``mmap``, SQLite): a fork then looks for shared maps to make its own
        (`remap_shared`, some 0.5 ms, spared the forks of cells that never map)."""
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
                elif isinstance(flags, int) and flags & O_TMPFILE_FLAG == O_TMPFILE_FLAG and O_TMPFILE_FLAG:
                    # an unnamed file in the folder
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


def private_network() -> str:
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


def drop_capabilities() -> str:
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


def seccomp_filter() -> str:
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


def landlock(root: str, hidden: tuple[str, ...]) -> str:
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


def refuse_unaudited() -> None:
    """Have the loaded C functions that raise no audit event and that the sandbox refuses say so: running a program
    (`_posixsubprocess.fork_exec`), a memory file (``os.memfd_create``), a session or process group of its own
    (``os.setsid``, ``os.setpgid``, ``os.setpgrp``), POSIX shared memory (its files live in /dev/shm, outside
    the working directory, and outlast the worker). A fresh copy of such a module still gets past this, but not
    past `seccomp_filter`, except to shared memory."""
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


def local_semaphores() -> None:
    """Give multiprocessing semaphores of this process (`_ThreadSemLock`) in place of POSIX ones."""
    try:
        import _multiprocessing
    except ImportError:
        return
    if hasattr(_multiprocessing, "SemLock"):
        _ThreadSemLock.SEM_VALUE_MAX = _multiprocessing.SemLock.SEM_VALUE_MAX
        _multiprocessing.SemLock = _ThreadSemLock


def guard_node_makers(guard: Guard) -> None:
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


def guard_sqlite(guard: Guard) -> None:
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


def guard_socketpair(guard: Guard) -> None:
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


def set_subreaper() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come back to the template
    except Exception:  # noqa: BLE001
        pass
