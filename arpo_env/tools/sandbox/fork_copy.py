"""What a forked worker puts right in its copy: the files it had open in its working directory, reopened in the
fork's own, and its shared memory mappings, made private (a fork must not write into its parent's)."""


from __future__ import annotations

import errno
import fcntl
import os

# --------------------------------------------------------------------------------------------------------------------
# The template: preload, then fork workers on request
# --------------------------------------------------------------------------------------------------------------------
import containment
from channel import (
    _CLOSE,
    _DUP2,
    _FCNTL,
    _FSTAT,
    _GET_INHERITABLE,
    _LISTDIR,
    _LSEEK,
    _OPEN,
    _READ,
    _READLINK,
    _REALPATH,
    _S_ISREG,
    _WRITE,
)
from containment import O_TMPFILE_FLAG


def _in_copy(real: str, old: str, new: str) -> str | None:
    """The real path `real` in the folder `old` (a worker's root) as the same path in `new` (its fork's), or None
    for a path outside `old`."""
    return new + real[len(old):] if real == old or real.startswith(old + os.sep) else None


def moved_path(path: str, old: str, new: str) -> str:
    """`path` (followed to its real path) in the fork's folder where it is in the parent's; any other path as it is."""
    moved = _in_copy(_REALPATH(path), old, new)
    return path if moved is None else moved


def reopen_files(old: str, new: str) -> None:
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
    if not O_TMPFILE_FLAG:
        raise OSError(errno.EOPNOTSUPP, "no O_TMPFILE")
    copy = _OPEN(folder, O_TMPFILE_FLAG | os.O_RDWR, 0o600)
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
(`take_mapping_calls`), for `remap_shared`: nothing a cell rebinds runs in a fork's trusted steps."""
_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4
_MAP_SHARED, _MAP_FIXED, _MAP_ANONYMOUS = 0x01, 0x10, 0x20
_SHARED_ANONYMOUS = "/dev/zero (deleted)"


def take_mapping_calls() -> None:
    global _MMAP, _MPROTECT, _STRING_AT, _MEMMOVE
    if containment._LIBC is None:
        return
    try:
        import ctypes

        mmap, mprotect = containment._LIBC.mmap, containment._LIBC.mprotect
        mmap.restype, mprotect.restype = ctypes.c_void_p, ctypes.c_int
        mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _MMAP, _MPROTECT, _STRING_AT, _MEMMOVE = mmap, mprotect, ctypes.string_at, ctypes.memmove
    except Exception:  # noqa: BLE001 - without them a fork's shared maps stay shared
        pass


def remap_shared(old: str, new: str) -> None:
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




def stat_fields(pid: int | str = "self") -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the process's name (its state first), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except OSError:
        return None
