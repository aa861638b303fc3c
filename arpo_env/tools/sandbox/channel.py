"""The channel between the host and the sandbox's processes: length-prefixed JSON, with file descriptors (SCM_RIGHTS).

It also holds what the sandbox takes from the standard library before any cell runs, so that a cell that rebinds
one of them for its own use changes what its code calls, not what the sandbox runs.
"""

from __future__ import annotations

import _socket
import array
import fcntl
import json
import os
import random
import select
import socket
import stat
import struct
import time
import traceback

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
