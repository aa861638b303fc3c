"""Appending to JSON-lines logs (rollout trees, metrics, evaluation samples) so that a killed writer costs only its
own last line, and reading them past such a line.

A process killed in the middle of a line (a training run stopped hard) leaves the file without its final newline.
Opened in plain append mode, the next writer's first line would be glued to that cut one, and readers that skip
what is not JSON (`arpo view`, `arpo eval`'s resume, `arpo sft --from_rollouts`) would lose it with it. `append`
starts the next writer on a line of its own. A string with lone surrogates (text from an environment that let
them through: no UTF-8 encodes them) is written as the JSON escape ``\\udcff`` that ``json.dumps`` with ASCII
output would write, instead of failing the whole write.

Lines are written with ``ensure_ascii=False``, so a model's text can put U+2028, U+2029 or U+0085 in them unescaped:
read them by iterating an open file (lines end at ``"\\n"``), never with ``str.splitlines``, which cuts there too.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import IO, Any, Callable, Iterable, Iterator


def append(path: str | os.PathLike) -> IO[str]:
    """`path` opened to append text lines (UTF-8), after a newline when its last line was cut short."""
    cut = False
    try:
        with open(path, "rb") as f:
            if f.seek(0, os.SEEK_END):
                f.seek(-1, os.SEEK_END)
                cut = f.read(1) != b"\n"
    except FileNotFoundError:
        pass
    handle = open(path, "a", encoding="utf-8", errors="backslashreplace")
    if cut:
        handle.write("\n")
    return handle


def records(lines: Iterable[str], skipped: Callable[[int, str, ValueError], None] | None = None
            ) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each JSON line of `lines` (an open file, standard input), blank lines passed
    over. A line that is not JSON (one cut short by a killed writer) is skipped, and given to `skipped` with its
    number and the error when the reader reports such lines."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            if skipped is not None:
                skipped(n, line, exc)
            continue
        yield n, value


@contextmanager
def sole_writer(path: str | os.PathLike, busy: str, folder: bool = False, wait: bool = False
                ) -> Iterator[None]:
    """Hold `path` (a log file, or with `folder` the folder of a command's logs) for this process alone while it
    writes there: a second command into the same place at once read the first's logs when it began, so each made the
    work under way in the other again and appended it too (``arpo rollout``'s trees of the same tasks, ``arpo
    eval``'s samples, even made with other settings; ``arpo train``'s checkpoints). ConfigError(`busy`) when another
    process holds it; with `wait`, `busy` is said on stderr and the lock waited for. The lock is the kernel's
    (``flock``): a writer killed releases it; on a file system that has no locks the command runs without one. A
    file or folder that was not there is made to hold the lock, and removed again if it is still empty at the
    end."""
    import fcntl
    import sys

    from arpo_algo.settings import ConfigError

    made = not os.path.exists(path)
    if made and folder:
        os.makedirs(path)
    fd = os.open(path, os.O_RDONLY | (0 if folder else os.O_CREAT), 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise ConfigError(busy) from None
            print(busy, file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (ENOLCK, EOPNOTSUPP): the command runs unguarded, as before
            pass
        try:
            yield
        finally:
            if made and folder and not os.listdir(path):
                os.rmdir(path)
            elif made and os.path.isfile(path) and not os.path.getsize(path):
                os.remove(path)
    finally:
        os.close(fd)  # the lock with it


class OutputFolder:
    """What `removed_if_unused` yields: set `failed` for a command that fails without raising (an exit status)."""

    failed = False


@contextmanager
def removed_if_unused(folder: str | os.PathLike, has_results: Callable[[], bool]) -> Iterator[OutputFolder]:
    """A command's output `folder`, removed with what is in it when the command fails (an exception, Ctrl-C, or
    `OutputFolder.failed`) before `has_results()` holds, if the command made it: a run that stopped at a bad model
    or dataset left an empty or half-made folder behind. A folder that was there before is never removed."""
    import shutil

    made = not os.path.exists(folder)
    run = OutputFolder()

    def clean() -> None:
        if made and os.path.isdir(folder) and not has_results():
            shutil.rmtree(folder, ignore_errors=True)

    try:
        yield run
    except BaseException:
        clean()
        raise
    if run.failed:
        clean()
