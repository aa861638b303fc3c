"""The local Python sandbox: persistence, forking, restore, and containment of hostile cells."""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import group_members, wait_until

from arpo_env.tools.sandbox.host import LocalSandbox, SandboxLimits, template_pids

LIMITS = SandboxLimits(timeout_s=2.0, kill_grace_s=2.0, memory_mb=512, max_output_chars=2000)


@pytest.fixture
def box():
    sandbox = LocalSandbox(LIMITS)
    yield sandbox
    sandbox.close()


def test_variables_persist_and_trailing_expression_is_shown(box):
    assert box.call("x = 41").text == "(no output)"
    assert box.call("x + 1").text == "42"
    out = box.call("import numpy as np, sympy as sp\nprint(np.arange(3).sum())\nsp.factor(sp.Symbol('y')**2 - 1)")
    assert out.text == "3\n(y - 1)*(y + 1)" and not out.failed


def test_stderr_and_short_traceback(box):
    out = box.call("import sys\nprint('to stderr', file=sys.stderr)\ndef f(a):\n    return 1 / a\nf(0)")
    assert out.failed and out.error == "ZeroDivisionError: division by zero"
    assert "to stderr" in out.text and '<cell 1>", line 4, in f' in out.text
    assert "arpo_env/tools/sandbox" not in out.text  # only the cell's frames
    syntax = box.call("def f(:\n  pass")
    assert syntax.failed and "SyntaxError" in syntax.text and "ast.py" not in syntax.text


def test_the_output_streams_are_utf8_and_take_bytes(box):
    """Code that writes bytes (``sys.stdout.buffer``) or encodes for the stream used to fail on the capture itself."""
    out = box.call("import sys\nsys.stdout.buffer.write(b'caf\\xc3'); sys.stdout.buffer.write(b'\\xa9 \\xff\\n')\n"
                   "sys.stdout.buffer.flush()\nsys.stderr.buffer.write('ok'.encode(sys.stderr.encoding))\n"
                   "sys.stdout.buffer.write(b'\\xe2\\x9c')")  # a character cut short at the end of the cell
    assert out.text == "caf\u00e9 \ufffd\n\ufffd\nok\n2" and not out.failed  # stdout, stderr, the value
    assert "TypeError" in box.call("import sys; sys.stdout.buffer.write('text')").text
    flood = box.call("import sys\nfor _ in range(1000): sys.stdout.buffer.write(b'x' * 1000)")
    assert flood.text.startswith("x" * 100) and "998,000 characters not shown" in flood.text


def test_a_flood_of_output_keeps_its_first_lines_and_its_last():
    """A loop's output beyond the cap used to hide what the cell printed last, most often its result."""
    box = LocalSandbox(LIMITS)
    try:
        out = box.call("for i in range(10_000): print(i, i * i)\nprint('the answer is', 42)")
        head, _, end = out.text.partition("\n[output truncated: ")
        assert head.startswith("0 0\n1 1\n2 4\n") and end.endswith("9999 99980001\nthe answer is 42")
        assert len(out.text) < LIMITS.max_output_chars + 100 and not out.failed
        printed = sum(len(f"{i} {i * i}\n") for i in range(10_000)) + len("the answer is 42\n")
        dropped = printed - LIMITS.max_output_chars  # the stream kept max_output_chars of it
        assert end.startswith(f"{dropped:,} characters not shown]\n") and out.extra["output_dropped"] == dropped
        err = box.call("import sys\nfor i in range(10_000): print(i, file=sys.stderr)\nraise ValueError('last')")
        assert err.text.startswith("0\n1\n") and "9999\n" in err.text and err.text.endswith("ValueError: last")
    finally:
        box.close()


def test_fork_copies_live_state_and_is_independent(box):
    box.call("x = 41")
    child = box.fork()
    try:
        assert child.pid != box.pid
        child.call("x = 0")
        assert box.call("x + 1").text == "42"
        assert child.call("x + 1").text == "1"
    finally:
        child.close()


def test_a_cell_that_rebinds_json_keeps_its_interpreter(box):
    """The channel's codec was taken before any cell ran: a cell that rebinds ``json.dumps`` and ``json.loads`` for
    its own use gets them, and the worker, its variables and its forks go on (before, the worker died at its answer
    and every variable was lost)."""
    box.call("import json\nx = 41\njson.dumps = lambda *a, **k: 'mine'\njson.loads = lambda *a, **k: 'mine too'")
    out = box.call("print(json.dumps({}), json.loads('1'), x + 1)")
    assert not out.failed and out.text == "mine mine too 42" and not box.restarts
    child = box.fork()
    try:
        assert child.call("x + 2").text == "43" and child.call("json.dumps(1)").text == "'mine'"
    finally:
        child.close()


def test_fork_copies_the_random_state(box):
    # A copy of the interpreter draws what the original would have drawn next (Python's `random` reseeds itself in
    # every forked process unless the fork puts its state back), with `random` and numpy's global generator alike.
    box.call("import random\nimport numpy as np\nrandom.seed(7)\nnp.random.seed(7)\nrandom.random()")
    # What a cell redefines does not run when the worker forks (nor stops it from copying the state).
    box.call("import sys, time\nrandom.Random.getstate = random.Random.setstate = lambda *a: time.sleep(60)\n"
             "random.getstate = random.setstate = None")
    child = box.fork()
    try:
        draws = "(random.random(), random.getrandbits(64), float(np.random.random()))"
        assert child.call(draws).text == box.call(draws).text
    finally:
        child.close()


def test_a_fork_that_never_starts_is_rebuilt_by_replay(box):
    # fork() returns before the copy has greeted its channel; its first call waits for that word. A copy that never
    # greets (here: its channel cut, so it exits at its greeting) is replaced by a replay of the history, so nothing
    # is lost.
    box.call("x = 41")
    child = box.fork()
    process = child._slot.process
    assert process.pid is None and process.greeting  # not known until the copy says it
    cut, peer = socket.socketpair()
    peer.close()
    process.sock.close()
    process.sock = cut
    try:
        assert child.call("x + 1").text == "42"
        assert child.pid not in (None, box.pid) and child._slot.process is not process
    finally:
        child.close()


def _workers() -> set[int]:
    """The live processes of the sandbox templates' process groups (the templates and their workers)."""
    return {pid for t in template_pids() for pid, state in group_members(os.getpgid(t)) if state != "Z"}


def test_fork_does_not_wait_for_the_worker_and_every_copy_is_accounted_for(box):
    # fork() only asks the worker to fork: its answers wait on the channel and are read before its next request's,
    # so forks in a row and the parent's next cell all work. A copy closed before it ever greeted exits by itself.
    box.call("x = 41")
    before = _workers()
    kids = [box.fork() for _ in range(3)]
    assert box._slot.process.unanswered == 3
    assert box.call("x + 1").text == "42" and box._slot.process.unanswered == 0
    for i, kid in enumerate(kids[:2]):
        kid.call(f"x = {i}")
    assert [k.call("x").text for k in kids] == ["0", "1", "41"]
    assert len(_workers() - before) == 3
    for kid in kids:
        kid.close()
    never = [box.fork() for _ in range(2)]  # closed without a call: their pids are never read
    assert box.call("x").text == "41"  # its answers to the two forks are read first: both copies were made
    greeted = lambda: all(select.select([k._slot.process.sock], [], [], 0)[0] for k in never)  # noqa: E731
    assert wait_until(greeted, 30) and len(_workers() - before) == 2  # both are up (their greetings unread)
    for kid in never:
        kid.close()
    assert wait_until(lambda: not _workers() - before, 30), _workers() - before
    for _ in range(40):  # a parent forked again and again, never asked anything: its answers are read in time
        box.fork().close()
        assert box._slot.process.unanswered <= box._slot.process.max_unanswered
    assert box.call("x").text == "41"


def test_a_copy_forked_ahead_is_handed_to_the_next_fork_and_never_outlives_its_state():
    # fork_ahead: after each cell a copy is forked in the background (while the caller waits on the model); a fork
    # takes it, already up. The next cell, a restore or close kills an unused one: it holds a state that is gone.
    box = LocalSandbox(LIMITS, fork_ahead=True)
    try:
        box.call("x = 41")
        assert wait_until(lambda: box._spare.process is not None, 30)
        spare = box._spare.process
        before = _workers()
        kid = box.fork()
        assert kid._slot.process is spare and box._spare.process is None
        assert kid.call("x + 1").text == "42" and kid.history == ["x = 41", "x + 1"]
        assert box.call("x = 0").text == "(no output)" and kid.call("x").text == "41"  # independent both ways
        assert wait_until(lambda: box._spare.process is not None, 30)
        stale = box._spare.process
        box.call("x = 1")  # the copy of x = 0 goes
        assert stale.closed and wait_until(lambda: box._spare.process not in (None, stale), 30)
        second = box.fork()
        third = box.fork()  # the spare went to the second: the third forks as usual
        assert second.call("x").text == third.call("x").text == "1"
        for k in (kid, second, third):
            k.close()
        box.close()
        assert wait_until(lambda: not _workers() - before, 30), _workers() - before
    finally:
        box.close()


def test_fork_copies_the_working_directory(box):
    box.call("open('notes.txt', 'w').write('parent')")
    child = box.fork()
    try:
        child.call("open('notes.txt', 'w').write('child')")
        assert box.call("open('notes.txt').read()").text == "'parent'"
        assert child.call("open('notes.txt').read()").text == "'child'"
    finally:
        child.close()


def test_a_fork_works_in_its_own_folder_where_the_parent_worked_in_its(box):
    # The copy was put at its folder's root and kept the parent's temporary folder: a cell that had gone into a
    # subfolder lost its relative paths in every fork, and tempfile in a fork was refused as writing outside.
    box.call("import os, tempfile\nos.makedirs('out')\nos.chdir('out')\nopen('data.txt', 'w').write('42')")
    child = box.fork()
    try:
        assert child.call("open('data.txt').read()").text == "'42'"
        root = child.call("print(os.path.dirname(os.getcwd()))").text.strip()
        assert root != box.call("print(os.path.dirname(os.getcwd()))").text.strip()
        made = child.call("with tempfile.NamedTemporaryFile('w', delete=False) as f: f.write('x')\n"
                          "print(f.name)\nprint(os.environ['TMPDIR'])\nprint(os.environ['MPLCONFIGDIR'])").text
        assert all(line.startswith(root) for line in made.split()), (root, made)
        grandchild = child.fork()  # and so on down a tree
        try:
            assert grandchild.call("print(os.getcwd() != tempfile.mkdtemp())\nopen('data.txt').read()").text == \
                "True\n'42'"
        finally:
            grandchild.close()
    finally:
        child.close()


def test_a_fork_writes_the_files_it_holds_open_in_its_own_folder(box):
    # A fork inherits its parent's descriptors: a file or an SQLite database a cell kept open was the parent's file
    # in the copy, so a branch's writes went into the other branch's files (and past the copy's disk quota).
    # Files with no name (tempfile.TemporaryFile) are copied.
    box.call("import sqlite3, tempfile\nlog = open('log.txt', 'w')\nlog.write('a')\nlog.flush()\n"
             "reader = open('log.txt')\ndb = sqlite3.connect('x.db')\ndb.execute('create table t (a)')\ndb.commit()\n"
             "scratch = tempfile.TemporaryFile('w+')\nscratch.write('b')\nscratch.flush()")
    child = box.fork()
    try:
        assert child.call("log.write('child')\nlog.flush()\ndb.execute('insert into t values (1)')\ndb.commit()\n"
                          "scratch.write('child')\nscratch.seek(0)\n"
                          "reader.read(), db.execute('select count(*) from t').fetchone(), scratch.read()"
                          ).text == "('achild', (1,), 'bchild')"
        assert box.call("scratch.seek(0)\nopen('log.txt').read(), reader.read(), "
                        "db.execute('select count(*) from t').fetchone(), scratch.read()"
                        ).text == "('a', 'a', (0,), 'b')"
    finally:
        child.close()


def test_a_forks_shared_memory_maps_are_its_own(box):
    # A fork keeps shared maps shared: a branch's writes through np.memmap reached the other branch's file, and
    # through an anonymous mmap.mmap the other branch's memory.
    box.call("import mmap\nimport numpy as np\nm = np.memmap('a.dat', dtype='int64', mode='w+', shape=(1000,))\n"
             "m[:] = 1\nm.flush()\nanon = mmap.mmap(-1, 4096)\nanon[:6] = b'parent'")
    child = box.fork()
    try:
        assert child.call("m[:] = 2\nm.flush()\nanon[:6] = b'child!'\n"
                          "int(np.fromfile('a.dat', dtype='int64')[0]), int(m[999]), anon[:6]"
                          ).text == "(2, 2, b'child!')"
        assert box.call("int(m[0]), int(np.fromfile('a.dat', dtype='int64')[0]), anon[:6]"
                        ).text == "(1, 1, b'parent')"
    finally:
        child.close()


def test_a_fork_keeps_a_current_folder_outside_its_own_as_a_replay_does(box, tmp_path):
    box.call(f"import os\nos.chdir({str(tmp_path)!r})")
    child, replayed = box.fork(), LocalSandbox()
    replayed.restore(box.snapshot())
    try:
        assert child.call("os.getcwd()").text == replayed.call("os.getcwd()").text == repr(str(tmp_path))
    finally:
        child.close()
        replayed.close()


def test_a_named_pipe_in_the_working_directory_is_forked_as_a_pipe(box):
    # shutil.copytree refuses named pipes: one made by a cell made every later fork of its env raise.
    box.call("import os, stat\nos.mkfifo('pipe')\nx = 5")
    child = box.fork()
    try:
        assert child.call("x, stat.S_ISFIFO(os.lstat('pipe').st_mode)").text == "(5, True)"
    finally:
        child.close()


def test_a_working_directory_that_cannot_be_copied_is_rebuilt_by_replay(box, monkeypatch):
    # A copy can still fail (the host's disk full): the fork starts from a clean directory and replays the cells.
    import arpo_env.tools.sandbox.host as sandbox

    def full_disk(src, dst):
        raise OSError(28, "No space left on device", dst)

    box.call("x = 6\nopen('notes.txt', 'w').write('kept')")
    monkeypatch.setattr(sandbox, "_copy_entry", full_disk)
    root = os.path.dirname(box._slot.process.workdir)
    before = set(os.listdir(root))
    child = box.fork()
    try:
        assert child.call("x, open('notes.txt').read()").text == "(6, 'kept')"  # the cell that wrote it ran again
        new = set(os.listdir(root)) - before
        assert new == {os.path.basename(child._slot.process.workdir)}  # no half copy left behind
    finally:
        child.close()


def test_a_template_that_dies_at_start_says_so(tmp_path, monkeypatch):
    # A preloaded module that ends the process (or a crash) used to surface as "EOFError: channel closed".
    (tmp_path / "ends_the_process.py").write_text("import os\nos._exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    box = LocalSandbox(preload=("ends_the_process",))
    with pytest.raises(RuntimeError, match=r"template process .* did not start: .*\(exit status 3\); run it by hand"):
        box.call("1")
    box.close()


def test_the_hosts_keys_are_not_in_the_sandboxs_environment(monkeypatch):
    # The model's code printed os.environ into its rollout: HF_TOKEN, WANDB_API_KEY and the like with it.
    monkeypatch.setenv("HF_TOKEN", "hf_not_for_the_model")
    monkeypatch.setenv("ARPO_TEST_SETTING", "wanted")
    monkeypatch.setenv("ARPO_SANDBOX_ENV", "ARPO_TEST_SETTING")  # what a user asks to pass
    box = LocalSandbox(preload=("math",))  # a template of its own, started with this environment
    try:
        out = box.call("import os\n"
                       "os.environ.get('HF_TOKEN'), os.environ.get('ARPO_TEST_SETTING'), 'PATH' in os.environ")
        assert out.text == "(None, 'wanted', True)", out.text
        out = box.call(f"open('/proc/{os.getpid()}/environ', 'rb').read()")  # nor the host's own, by /proc
        assert out.failed and "other processes are not readable" in out.text, out.text
    finally:
        box.close()
        import arpo_env.tools.sandbox.host as sandbox

        sandbox._templates.pop(("math",)).shutdown()  # the other tests count one template


def test_other_processes_are_not_readable(box):
    # /proc/<pid>/cmdline is readable by anyone: the host's holds its arguments (arpo eval --api_key …); another
    # worker's files (another episode's) are under /proc/<pid>/cwd. The worker's own entries stay readable.
    other = LocalSandbox()
    try:
        assert not other.call("open('mine.txt', 'w').write('from another episode')").failed
        host = os.getpid()
        for code in (f"open('/proc/{host}/cmdline', 'rb').read()", f"open('/proc/{host}/environ', 'rb').read()",
                     f"open('/proc/{other.pid}/cwd/mine.txt').read()", f"import os\nos.listdir('/proc/{other.pid}')",
                     f"open('/proc/self/root/proc/{host}/cmdline', 'rb').read()",
                     f"import numpy\nnumpy.fromfile('/proc/{host}/cmdline', dtype=numpy.uint8)"):
            out = box.call(code)
            assert out.failed and "other processes are not readable" in out.text, (code, out.text)
        own = box.call("import os, threading\n"
                       "t = threading.Thread(target=lambda: open(f'/proc/{threading.get_native_id()}/status').read())\n"
                       "t.start(); t.join()\n"
                       "len(open('/proc/self/status').read()) > 0, len(open(f'/proc/{os.getpid()}/stat').read()) > 0")
        assert own.text == "(True, True)" and "Traceback" not in own.text, own.text
    finally:
        other.close()


def test_the_hosts_key_stores_and_listed_paths_are_hidden(tmp_path, monkeypatch):
    # Keys in files (the Hugging Face token, ~/.ssh...) are as much the host's as its environment; a symlink made
    # in the working directory does not reach them either.
    hf_home, secret = tmp_path / "hf", tmp_path / "secret"
    hf_home.mkdir()
    secret.mkdir()
    (hf_home / "token").write_text("hf_not_for_the_model")
    (secret / "notes.txt").write_text("private")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    box = LocalSandbox(SandboxLimits(hidden_paths=(str(secret),)))
    try:
        for code in (f"open({str(hf_home / 'token')!r}).read()", f"open({str(secret / 'notes.txt')!r}).read()",
                     f"import os\nos.symlink({str(secret)!r}, 'link')\nopen('link/notes.txt').read()",
                     f"os.listdir({str(secret)!r})", "list(os.scandir('link'))"):
            out = box.call(code)
            assert out.failed and "is hidden from the sandbox" in out.text, (code, out.text)
        assert box.call(f"open({str(tmp_path / 'other.txt')!r}, 'w')").failed  # writes outside: refused as before
        assert box.call("open('mine.txt', 'w').write('ok')\nopen('mine.txt').read()").text == "'ok'"
    finally:
        box.close()


GUARD_OFF = {  # two ways a cell got past the audit hook, which lives in its own interpreter
    "its frames walked down to the guard": (
        "import sys\nf, guard = sys._getframe(), None\nwhile f is not None:\n"
        "    guard = next((v for v in list(f.f_locals.values()) if type(v).__name__ == 'Guard'), guard)\n"
        "    f = f.f_back\nguard._local.trusted = 1\n"),
    "a library function the hook calls replaced": (
        "import posixpath\nreal, todo = posixpath.realpath, []\n"
        "def evil(p, *a, **k):\n    while todo:\n        todo.pop()()\n    return real(p, *a, **k)\n"
        "posixpath.realpath = evil\ndef unchecked(f):\n    def run():\n        try:\n            f()\n"
        "        except OSError as exc:\n            print(f'{type(exc).__name__}: {exc}')\n"
        "    todo.append(run)\n    open('x.txt', 'w').close()\n"),
}


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none), asked here, not by the sandbox under test."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return max(0, libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))  # landlock_create_ruleset, VERSION


@pytest.mark.parametrize("how", list(GUARD_OFF))
def test_past_the_audit_hook_the_kernel_still_keeps_files_outside_and_answers_hidden(how, tmp_path):
    """Landlock's rules, set before any cell runs, hold whatever the cell does to the hook: with the hook turned
    off, a cell wrote outside its directory and read the tasks' answers."""
    secret = tmp_path / "answers"
    secret.mkdir()
    (secret / "gold.jsonl").write_text('{"answer": "gold-7d1f"}')  # not a number a tmp path may hold (pytest-142)
    (tmp_path / "public.txt").write_text("anyone may read this")
    box = LocalSandbox(SandboxLimits(hidden_paths=(str(secret),)))
    try:
        if not landlock_abi():
            pytest.skip("no Landlock in this kernel: the audit hook alone keeps the files")
        assert any("Landlock" in layer for layer in box.protections), box.protections
        assert not box.call(GUARD_OFF[how]).failed
        act = (lambda code: f"unchecked(lambda: {code})") if "replaced" in how else (lambda code: code)
        outside = tmp_path / "escaped.txt"
        out = box.call(act(f"open({str(outside)!r}, 'w').write('x')"))
        assert "PermissionError: [Errno 13]" in out.text and not outside.exists(), out.text
        out = box.call(act(f"print(open({str(secret / 'gold.jsonl')!r}).read())"))
        assert "PermissionError: [Errno 13]" in out.text and "gold-7d1f" not in out.text, out.text
        out = box.call(act(f"print(open({str(tmp_path / 'public.txt')!r}).read())"))  # the control: the hook is off
        assert "anyone may read this" in out.text, out.text
        assert box.call("open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())").text == "ok"
        fork = box.fork()  # a fork keeps the rules and writes in its own new directory
        try:
            out = fork.call(act(f"open({str(outside)!r}, 'w')"))
            assert "PermissionError: [Errno 13]" in out.text and not outside.exists(), out.text
            assert fork.call("open('b.txt', 'w').write('ok')\nprint(open('b.txt').read())").text == "ok"
        finally:
            fork.close()
    finally:
        box.close()


def test_a_greeting_that_names_a_process_outside_the_sandbox_is_not_adopted(box, tmp_path):
    """A fork's copy says its pid in its first word on its new channel, and closing the copy kills that pid. A cell
    past the audit hook can take the copy's end of the channel from the fork's message and name any process of the
    user (the trainer): it was adopted, and killed. Only a process in the sandbox's own group is adopted."""
    from arpo_env.tools.sandbox.channel import send_message
    from arpo_env.tools.sandbox.host import WorkerLost, _Process

    box.call("x = 41")
    group = box._slot.process.group
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        for word in ({"ok": True, "pid": victim.pid}, {"ok": True, "pid": "1"}, ["not", "a", "greeting"]):
            ours, theirs = socket.socketpair()
            send_message(theirs, word)
            copy = _Process(None, ours, str(tmp_path / "copy"), greeting=True, group=group)
            with pytest.raises(WorkerLost, match="named no process of the sandbox"):
                copy.greet()
            copy.kill()
            theirs.close()
        assert victim.poll() is None  # alive
        fork = box.fork()  # a real copy is adopted: it is in the group
        assert fork.call("x + 1").text == "42" and os.getpgid(fork.pid) == group
        fork.close()
    finally:
        victim.kill()
        victim.wait()


NESTED_LANDLOCK = """
import ctypes, os, struct, sys
from arpo_env.tools.sandbox.host import LocalSandbox
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, which an unprivileged process needs to restrict itself
for layer in range(16):  # Landlock nests at most 16 domains: this process takes them all, each allowing everything
    attr = ctypes.create_string_buffer(struct.pack("=Q", 1), 8)  # handles executing files...
    ruleset = libc.syscall(444, attr, ctypes.c_size_t(8), ctypes.c_uint32(0))
    fd = os.open("/", os.O_PATH)
    rule = ctypes.create_string_buffer(struct.pack("=Qi", 1, fd), 12)  # ...and allows it everywhere
    assert libc.syscall(445, ruleset, ctypes.c_int(1), rule, ctypes.c_uint32(0)) == 0
    assert libc.syscall(446, ruleset, ctypes.c_uint32(0)) == 0, layer
box = LocalSandbox()
print(any("Landlock" in layer for layer in box.protections))
print(box.call(f"open({sys.argv[1]!r}, 'w')").error)
box.close()
"""


def test_protections_name_the_rules_for_files_only_where_the_worker_runs_under_them(tmp_path):
    """`protections` named Landlock from the template's first word, which said only that the kernel has it. Each
    worker sets its own rules; where that fails (here: a host already in the 16 nested domains Landlock allows), the
    list named a layer that was not there. The worker says what it runs under; the audit hook still keeps the files."""
    if not landlock_abi():
        pytest.skip("no Landlock in this kernel")
    outside = tmp_path / "outside.txt"
    out = subprocess.run([sys.executable, "-c", NESTED_LANDLOCK, str(outside)], capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.stdout.splitlines() == ["False", "SandboxViolation: sandbox: writing outside the working directory is "
                                       f"not allowed ({str(outside)!r})"], out.stdout + out.stderr
    assert not outside.exists()
    box = LocalSandbox()
    try:
        assert any("Landlock" in layer for layer in box.protections), box.protections  # here, where it holds
    finally:
        box.close()


def test_snapshot_pickle_restore_in_a_new_process(box, tmp_path):
    box.call("x = 41")
    fork = box.fork()
    fork.call("x = 0")
    path = tmp_path / "snap.pkl"
    path.write_bytes(pickle.dumps(box.snapshot()))
    code = ("import pickle, sys; from arpo_env.tools.sandbox.host import LocalSandbox\n"
            "s = LocalSandbox(); s.restore(pickle.load(open(sys.argv[1], 'rb'))); print(s.call('x + 1').text)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.stdout.strip() == "42", out.stderr
    assert fork.call("x + 1").text == "1"
    fork.close()


def _disk_usage(box: LocalSandbox) -> int:
    total = 0
    for folder, dirs, files in os.walk(box._slot.process.workdir):
        total += sum(os.lstat(os.path.join(folder, name)).st_size for name in files)
    return total


@pytest.mark.slow
def test_a_disk_bomb_is_held_to_the_quota_and_the_sandbox_goes_on():
    # The working directory (what each fork copies) may take `disk_mb`: a file open for writing counts at the size it
    # may grow to (`file_size_mb`), an entry at a 4 KB block at least, and past the quota opening fails with ENOSPC.
    box = LocalSandbox(SandboxLimits(timeout_s=10.0, kill_grace_s=2.0, disk_mb=32, file_size_mb=8, max_files=0))
    try:
        out = box.call("n = 0\nwhile True:\n    open(f'f{n}', 'wb').write(b'a' * 2**23)\n    n += 1")
        assert out.failed and "DiskQuotaExceeded: [Errno 28] No space left on device" in out.text, out.text
        assert box.call("n").text == "4" and _disk_usage(box) == 32 * 2**20
        # Files held open for writing count at the size they may grow to: four fit in 32 MB.
        out = box.call("import os\nfor f in os.listdir('.'):\n    os.remove(f)\nfs = []\ntry:\n"
                       "    while True:\n        fs.append(open(f'w{len(fs)}', 'w'))\nexcept OSError as e:\n"
                       "    print(len(fs), e.errno)\nfor f in fs:\n    f.close()")
        assert out.text == "4 28", out.text
        # Truncating a closed file by name may grow it (sparse, but a fork copies it whole): it counts the same way.
        out = box.call("open('one-more', 'w').close()\ntry:\n    for i in range(4):\n"
                       "        os.truncate(f'w{i}', 2**23)\nexcept OSError as e:\n    print(i, e.errno)")
        assert out.text == "3 28", out.text  # three of 8 MB and five blocks: no room for a fourth
        box.call("os.remove('one-more')\nfor i in range(4):\n    os.truncate(f'w{i}', 0)")
        # An unnamed file (O_TMPFILE, as tempfile.TemporaryFile makes) counts as a file open for writing does.
        out = box.call("fs = []\ntry:\n    while True:\n        fs.append(os.open('.', os.O_TMPFILE | os.O_RDWR))\n"
                       "except OSError as e:\n    print(len(fs), e.errno)\nfor f in fs:\n    os.close(f)")
        assert out.text == "3 28", out.text  # three of 8 MB beside the four closed files' blocks
        # Closed, they take a block each: three more fit beside them (a fourth would take 16 KB past the 32 MB).
        out = box.call("fs = [open(f'x{i}', 'w') for i in range(3)]\nfor f in fs:\n    f.close()\nlen(os.listdir('.'))")
        assert out.text == "7" and not out.failed, out.text
        # Directories count too (a fork copies every entry).
        out = box.call("for f in os.listdir('.'):\n    os.remove(f)\nn = 0\ntry:\n    while True:\n"
                       "        os.mkdir(f'd{n}')\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)")
        assert out.text == "8192 28", out.text
        child = box.fork()
        try:  # the copy is full as well; what it frees is its own
            assert "No space left on device" in child.call("open('note', 'w')").text
            out = child.call("for i in range(2048):\n    os.rmdir(f'd{i}')\nopen('note', 'w').write('fine')")
            assert not out.failed, out.text  # 8 MB freed: room for one file open for writing
            assert "No space left on device" in box.call("open('note', 'w')").text
        finally:
            child.close()
        assert box.call("import shutil\nfor d in os.listdir('.'):\n    os.rmdir(d)\nopen('note', 'w').write('ok')"
                        "\nopen('note').read()").text == "'ok'"
        out = box.call("with open('big', 'wb') as f:\n    f.write(b'a' * (2**23 + 1))")
        assert "File too large" in out.text and box.call("os.path.getsize('big')").text == str(2**23)  # file_size_mb
    finally:
        box.close()


def test_the_working_directory_holds_at_most_max_files_entries():
    # Empty files cost the disk quota little, but a fork copies each one (65,536 took 3-4 s a fork here).
    box = LocalSandbox(SandboxLimits(timeout_s=10.0, kill_grace_s=2.0, max_files=50))
    try:
        out = box.call("import os\nos.mkdir('d')\nn = 0\ntry:\n    while True:\n"
                       "        open(f'd/f{n}', 'w').close()\n        n += 1\n"
                       "except OSError as e:\n    print(n, e.errno)")
        assert out.text == "49 28", out.text  # the directory is one of the 50
        for make in ("os.mkdir('e')", "os.symlink('d', 'e')", "os.link('d/f0', 'e')"):
            out = box.call(make)
            assert "may hold 50 files and directories in all" in out.text, (make, out.text)
        assert box.call("open('d/f0', 'w').write('rewriting one is fine')").text == "21"
        assert box.call("os.remove('d/f1')\nopen('new', 'w').close()\nlen(os.listdir('d'))").text == "48"
        child = box.fork()
        try:  # the copy holds as many, under the same limit
            assert "may hold 50 files" in child.call("open('one-more', 'w')").text
        finally:
            child.close()
    finally:
        box.close()


def test_a_hard_link_neither_writes_outside_nor_passes_the_quota(tmp_path):
    # A hard link is the file itself under a second name: one to a host file would let the cell write to it from
    # inside its directory, and one to its own file is a second copy in every fork.
    victim = tmp_path / "host-file.txt"
    victim.write_text("the host's\n")
    box = LocalSandbox(SandboxLimits(timeout_s=10.0, kill_grace_s=2.0, disk_mb=32, file_size_mb=8))
    try:
        out = box.call(f"import os\nos.link({str(victim)!r}, 'mine')\nopen('mine', 'a').write('changed')")
        assert out.failed and "linking to files outside the working directory is not allowed" in out.text, out.text
        assert victim.read_text() == "the host's\n"
        out = box.call("open('big', 'wb').write(b'a' * 2**23)\nn = 0\ntry:\n    while True:\n"
                       "        os.link('big', f'l{n}')\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)")
        assert out.text == "3 28", out.text  # four names of 8 MB fill the 32 MB
        child = box.fork()
        try:
            assert child.call("len(os.listdir('.'))").text == "4"
            assert _disk_usage(child) == 32 * 2**20  # the copy holds each name as a file of its own
        finally:
            child.close()
    finally:
        box.close()


def test_a_cell_cannot_make_a_device_node(box):
    # os.mknod raises no audit event: as root, a cell could make a disk's device node in its directory and write to
    # it as to a file inside. The template gives up its capabilities (CAP_MKNOD among them) before any cell runs.
    out = box.call("import os, stat\nos.mknod('null', stat.S_IFCHR | 0o666, os.makedev(1, 3))")
    assert out.failed and "PermissionError: [Errno 1] Operation not permitted" in out.text, out.text
    effective = box.call("[l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1]").text
    assert effective == "'0000000000000000'"
    if os.geteuid() == 0:
        assert "no capabilities" in box.protections


FORK_EXEC_311 = ("import _posixsubprocess, importlib.util, os\nr, w = os.pipe()\n"
                 "ARGS = ([b'/bin/sh', b'-c', b'echo ran > {target}'], [b'/bin/sh'], True, (w,), None, None,"
                 " -1, -1, -1,"
                 " -1, -1, -1, r, w, True, False, -1, None, None, -1, -1, None, False)\n")


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="fork_exec's arguments are CPython 3.11's")
@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="the seccomp filter knows these two")
def test_a_cell_cannot_run_a_program_through_posixsubprocess(box, tmp_path):
    # subprocess raises its audit event in Python, then calls _posixsubprocess.fork_exec, which raises none; and a
    # cell can load a fresh copy of that module. The worker's seccomp filter refuses execve whatever calls it.
    target = tmp_path / "ran.txt"
    box.call(FORK_EXEC_311.format(target=target))
    out = box.call("_posixsubprocess.fork_exec(*ARGS)")
    assert out.failed and "running programs is not allowed" in out.text, out.text
    out = box.call("spec = importlib.util.find_spec('_posixsubprocess')\n"
                   "fresh = importlib.util.module_from_spec(spec)\n"
                   "spec.loader.exec_module(fresh)\npid = fresh.fork_exec(*ARGS)\nos.close(w)\nos.read(r, 200)")
    assert "OSError:1:" in out.text, out.text  # the child's report: execve failed with EPERM
    time.sleep(0.5)
    assert not target.exists()
    assert "no programs, memory files or new sessions (seccomp)" in box.protections


def test_no_path_relative_to_a_directory_descriptor_gets_out(box, tmp_path):
    # The "open" audit event does not carry `dir_fd`: with a descriptor of a directory outside, os.open(name,
    # dir_fd=...) (or open(..., opener=...)) wrote there. No directory is opened as a descriptor, inside or out.
    for where in (str(tmp_path), ".", "sub"):
        out = box.call(f"import os\nos.makedirs('sub', exist_ok=True)\nos.open({where!r}, os.O_RDONLY)")
        assert out.failed and "opening a directory as a file descriptor is not allowed" in out.text, out.text
        out = box.call(f"os.open({where!r}, os.O_PATH | os.O_WRONLY)")  # O_PATH: a directory's, whatever the rest
        assert out.failed and "opening a directory as a file descriptor is not allowed" in out.text, out.text
    # tempfile's files open their folder for writing, with an opener that opens the file: no directory's descriptor
    # (the kernel refuses a directory opened for writing), and the file itself is checked. They failed as above.
    out = box.call("import tempfile\nwith tempfile.NamedTemporaryFile('w+') as f:\n    f.write('ok')\n    f.seek(0)\n"
                   "    print(f.read(), os.path.dirname(f.name) == os.getcwd())\nwith tempfile.TemporaryFile() as f:\n"
                   "    print(f.write(b'ok'))\nwith tempfile.SpooledTemporaryFile(1) as f:\n    print(f.write(b'ok'))")
    assert out.text.splitlines() == ["ok True", "2", "2"], out.text
    for where, words in ((".", "IsADirectoryError"), ("sub", "IsADirectoryError"),  # the kernel's own refusal
                         (str(tmp_path), "writing outside the working directory is not allowed")):
        out = box.call(f"os.open({where!r}, os.O_WRONLY)")
        assert out.failed and words in out.text, out.text
    out = box.call(f"tempfile.NamedTemporaryFile(dir={str(tmp_path)!r})")
    assert out.failed and "writing outside the working directory is not allowed" in out.text, out.text
    # os.mknod and os.mkfifo raise no audit event: they are checked like the calls that do.
    for make in ("mkfifo", "mknod"):
        out = box.call(f"os.{make}({str(tmp_path / make)!r})")
        assert out.failed and "making files outside the working directory is not allowed" in out.text, out.text
    assert os.listdir(tmp_path) == []
    # What needs directories by path still works: a tree removed, walked, listed; a pipe made inside.
    out = box.call("import shutil, tempfile\nos.makedirs('a/b/c')\nopen('a/b/c/f', 'w').write('x')\n"
                   "with tempfile.TemporaryDirectory() as t:\n    open(os.path.join(t, 'g'), 'w').write('y')\n"
                   "n = sum(len(files) for _, _, files in os.walk('a'))\nshutil.rmtree('a')\nos.mkfifo('p')\n"
                   "n, sorted(os.listdir('.'))")
    assert out.text == "(1, ['p', 'sub'])", out.text


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="the seccomp filter knows these two")
def test_a_cell_cannot_hold_memory_past_its_limit_in_files():
    # A memory file's pages are not the process's address space: 40 of 64 MB each took 2.6 GB past memory_mb=1024.
    # POSIX shared memory lives in /dev/shm, outside the directory, and outlasts the worker. Neither raises an audit
    # event; the loaded functions say they are refused, and the kernel refuses memfd_create from a fresh copy of os.
    box = LocalSandbox(SandboxLimits(memory_mb=256))
    try:
        out = box.call("import os\nos.memfd_create('big')")
        assert out.failed and "making memory files is not allowed" in out.text, out.text
        out = box.call("import importlib.util\nspec = importlib.util.find_spec('posix')\n"
                       "fresh = importlib.util.module_from_spec(spec)\nfresh.memfd_create('big')")
        assert out.failed and "PermissionError: [Errno 1] Operation not permitted" in out.text, out.text
        out = box.call("import _posixshmem\n_posixshmem.shm_open('/arpo-test', os.O_CREAT | os.O_RDWR, 0o600)")
        assert out.failed and "shared memory is not allowed" in out.text, out.text
        assert not os.path.exists("/dev/shm/arpo-test")
        assert box.call("print('still here')").text == "still here"
    finally:
        box.close()


def test_multiprocessings_locks_and_queues_work_in_one_process_and_pools_of_threads_too(box):
    """multiprocessing's locks, queues and events are POSIX semaphores, files in /dev/shm: under Landlock they failed
    with a bare "PermissionError: [Errno 13] Permission denied", and `ThreadPool`, which makes one, with them. They
    are semaphores of the worker's own process now; pools of processes are refused as processes."""
    out = box.call("from multiprocessing.pool import ThreadPool\nwith ThreadPool(2) as p:\n"
                   "    print(p.map(abs, [-1, -2]))")
    assert out.text == "[1, 2]", out.text
    out = box.call("import multiprocessing as mp, threading\nq, lock, event = mp.Queue(), mp.RLock(), mp.Event()\n"
                   "def work():\n    with lock:\n        with lock:\n            q.put(7)\n    event.set()\n"
                   "threading.Thread(target=work).start()\nprint(event.wait(5), q.get(timeout=5))\n"
                   "s = mp.BoundedSemaphore(1)\nprint(s.acquire(), s.acquire(timeout=0.05), s.acquire(False))\n"
                   "s.release()\ntry:\n    s.release()\nexcept ValueError as e:\n    print(e)\n"
                   "try:\n    lock.release()\nexcept AssertionError as e:\n    print(e)")
    assert out.text.splitlines() == ["True 7", "True False False", "semaphore or lock released too many times",
                                     "attempt to release recursive lock not owned by thread"], out.text
    for call in ("mp.Pool(2)", "cf.ProcessPoolExecutor(2).submit(abs, -1).result()"):
        out = box.call(f"import multiprocessing as mp, concurrent.futures as cf\n{call}")
        assert out.failed and "creating processes is not allowed" in out.text, out.text
    assert not [name for name in os.listdir("/dev/shm") if name.startswith("sem.mp-")]


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="the seccomp filter knows these two")
def test_a_worker_cannot_leave_the_templates_process_group(box):
    # The template takes its whole group down when its host dies; a worker with a session of its own (os.setsid,
    # which raises no audit event) would be left running a cell that ignores its interrupts, with nobody to kill it.
    group = box.call("import os\nos.getpgrp()").text
    for call in ("os.setsid()", "os.setpgid(0, 0)", "os.setpgrp()"):
        out = box.call(call)
        assert out.failed and "leaving the sandbox's process group is not allowed" in out.text, (call, out.text)
    out = box.call("import importlib.util\nspec = importlib.util.find_spec('posix')\n"
                   "fresh = importlib.util.module_from_spec(spec)\nfresh.setsid()")
    assert out.failed and "PermissionError: [Errno 1] Operation not permitted" in out.text, out.text
    assert box.call("os.getpgrp()").text == group


def test_sqlite_writes_only_inside_the_working_directory(box, tmp_path):
    # SQLite opens and writes its files in C, where no "open" audit event is raised: a database anywhere, or one
    # attached (ATTACH, VACUUM INTO), was written outside the sandbox.
    outside = [str(tmp_path / f"{name}.db") for name in ("connected", "uri", "attached", "vacuumed")]
    for code in (f"import sqlite3\nsqlite3.connect({outside[0]!r})",
                 f"sqlite3.connect('file:{outside[1]}?mode=rwc', uri=True)"):
        out = box.call(code)
        assert out.failed and "a database outside the working directory is not allowed" in out.text, out.text
    box.call("db = sqlite3.connect(':memory:')\ndb.execute('create table t (x)')")
    out = box.call(f"db.execute(\"ATTACH DATABASE '{outside[2]}' AS other\")")
    assert "DatabaseError: not authorized" in out.text, out.text
    out = box.call(f"db.execute(\"VACUUM INTO '{outside[3]}'\")")
    assert "DatabaseError: authorization denied" in out.text, out.text
    assert os.listdir(tmp_path) == []
    out = box.call("db.execute(\"VACUUM INTO 'copy.db'\")\nmine = sqlite3.connect('mine.db')\n"
                   "mine.execute(\"ATTACH 'more.db' AS more\")\nmine.execute('create table more.u (y)')\n"
                   "mine.commit()\nimport os\nsorted(os.listdir('.'))")
    assert out.text == "['copy.db', 'mine.db', 'more.db']", out.text  # inside the directory, all of it works


HOSTILE = {
    "busy loop": "while True: pass",
    "loop swallowing exceptions": "while True:\n    try:\n        sum(range(10))\n    except BaseException:\n        pass",
    "sleep": "import time\ntime.sleep(60)",
    "8 GiB allocation": "b = bytearray(8 * 1024**3)",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "subprocess": "import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])",
    "kill the parent": "import os\nos.kill(os.getppid(), 9)",
    "kill the process group": "import os\nos.killpg(0, 9)",
    "100 MB of output": "print('x' * 100_000_000)",
    "many prints": "for i in range(2_000_000):\n    print(i)",
    "socket to 127.0.0.1": "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', PORT))",
    "socket around a descriptor": "import socket\nfor fd in range(3, 64):\n"
                                  "    socket.socket(socket.AF_UNIX, fileno=fd)",
    "socket pair of a network family": "import socket\nsocket.socketpair(socket.AF_INET)",
    "write outside workdir": "open('/tmp/arpo_sandbox_escape.txt', 'w').write('x')",
    "disk bomb": "for i in range(10**6):\n    open(f'f{i}', 'wb').write(b'a' * 2**24)",
    "remove outside workdir": "import os\nos.remove('/etc/hostname')",
    "ctypes": "import ctypes\nctypes.CDLL(None).getpid()",
    "segfault": "import faulthandler\nfaulthandler._sigsegv()",
    "os._exit": "import os\nos._exit(3)",
    "sys.exit": "raise SystemExit(1)",
    "null bytes": "print('a')\x00\x01",
    "deep recursion": "def f(n):\n    return f(n + 1)\nf(0)",
}


@pytest.mark.slow
def test_a_cells_own_alarm_works_and_leaves_the_time_limits_to_the_sandbox():
    """Models write timeouts of their own with SIGALRM (``signal.signal(SIGALRM, handler); signal.alarm(n)``). The
    cell's handler replaced the worker's: every later cell's time limit ran the model's handler (its exception
    instead of the timeout; a handler that returned turned the wall-clock limit off), and ``signal.alarm(0)``
    cancelled the limit of the cell it ran in."""
    box = LocalSandbox(SandboxLimits(timeout_s=2.0, kill_grace_s=1.0))
    try:
        out = box.call("import signal, time\nclass Late(Exception):\n    pass\ndef late(signum, frame):\n"
                       "    raise Late('too slow')\nsignal.signal(signal.SIGALRM, late)\nsignal.alarm(1)\n"
                       "try:\n    time.sleep(5)\nexcept Late as e:\n    print('caught', e)\n"
                       "print(signal.alarm(10), signal.alarm(0), signal.getsignal(signal.SIGALRM) is late)")
        # its own alarm ended the sleep, not the sandbox's 2 s limit
        assert out.text.splitlines() == ["caught too slow", "0 10 True"] and not out.extra.get("timed_out"), out.text
        out = box.call("signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)\nn = 0\nfor i in range(5):\n    try:\n"
                       "        time.sleep(1)\n    except Late:\n        n += 1\n"
                       "signal.setitimer(signal.ITIMER_REAL, 0)\nn")
        assert out.text == "5", out.text  # an interval timer, fired again and again
        for code in ("time.sleep(30)",  # the limit, not the model's handler (which stays installed)
                     "signal.signal(signal.SIGALRM, lambda signum, frame: None)\ntime.sleep(30)",  # one that returns
                     "signal.alarm(0)\nsignal.setitimer(signal.ITIMER_REAL, 0)\ntime.sleep(30)",  # cancelled: its own
                     "signal.alarm(100)\ntime.sleep(30)"):  # a later alarm of its own
            out = box.call(code)
            assert out.extra["timed_out"] and "CellTimeout: the cell exceeded its wall-clock time limit" in out.text, (
                code, out.text)
            assert "Late" not in out.text and not out.extra.get("restarted"), out.text  # the limit, not the host's
        assert box.call("print('still here')").text == "still here"
    finally:
        box.close()


def test_a_cell_that_rebinds_what_the_worker_uses_keeps_its_state(box):
    """The worker runs cells and answers the host with the standard library the cell shares: a cell that rebound
    ``socket.socket.sendall``, ``socket.recv_fds``, ``time.perf_counter`` or ``builtins.compile`` for its own use
    broke the worker (the host's deadline, or a crash), and every variable was lost."""
    box.call("x = 41")
    for code in ("import socket\nsocket.socket.sendall = lambda *a, **k: None",
                 "import socket\nsocket.recv_fds = socket.send_fds = None",
                 "import time\ntime.perf_counter = time.monotonic = None",
                 "import traceback\ntraceback.TracebackException = None",
                 "import builtins, ast\nbuiltins.compile = builtins.exec = builtins.eval = ast.parse = None"):
        out = box.call(code)
        assert not out.failed and not out.extra.get("restarted"), (code, out.text)
        assert box.call("x + 1").text == "42", code
    out = box.call("1 / 0")
    assert "ZeroDivisionError" in out.text and not out.extra.get("restarted"), out.text
    fork = box.fork()
    try:
        assert fork.call("x").text == "41"
    finally:
        fork.close()


def test_asyncio_runs_on_its_own_pair_of_local_sockets(box):
    """asyncio's event loop wakes itself through `socket.socketpair`, which the hook refused as network access:
    ``asyncio.run`` failed. A pair of connected local sockets reaches nothing but itself; every other socket is still
    refused (`HOSTILE`)."""
    out = box.call("import asyncio\nasync def square(i):\n    await asyncio.sleep(0.01)\n    return i * i\n"
                   "async def main():\n    return await asyncio.gather(*(square(i) for i in range(4)))\n"
                   "print(asyncio.run(main()))\nimport socket\na, b = socket.socketpair()\na.send(b'hi')\n"
                   "print(b.recv(2))")
    assert out.text.splitlines() == ["[0, 1, 4, 9]", "b'hi'"], out.text
    for code in ("s = socket.socket(socket.AF_UNIX)", "a.connect('/tmp/arpo-test.sock')"):
        out = box.call(code)
        assert out.failed and "network access is not allowed" in out.text, out.text


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    yield server.getsockname()[1], accepted
    thread.join()
    server.close()


@pytest.mark.parametrize("name", list(HOSTILE))
@pytest.mark.slow
def test_hostile_cell_is_contained_and_the_env_goes_on(name, box, listener):
    port, accepted = listener
    box.call("x = 41")
    host_pid = os.getpid()
    out = box.call(HOSTILE[name].replace("PORT", str(port)))
    assert os.getpid() == host_pid and os.path.exists(f"/proc/{host_pid}")
    assert not os.path.exists("/tmp/arpo_sandbox_escape.txt")
    assert os.path.exists("/etc/hostname") or name != "remove outside workdir"
    assert not accepted, "the sandbox reached a socket on the host"
    assert len(out.text) < 10_000  # floods are capped
    if name == "disk bomb":
        assert "No space left on device" in out.text and _disk_usage(box) <= LIMITS.disk_mb * 2**20
    if name in ("100 MB of output", "many prints"):
        assert "[output truncated:" in out.text
    else:
        assert out.failed, out.text
    follow = box.call("print('still here')")
    assert follow.text == "still here" and not follow.failed
    # Interrupted or refused cells keep the interpreter's state; only a dead worker loses it (and says so).
    if out.extra.get("restarted"):
        assert "fresh interpreter" in out.text
    else:
        assert box.call("x + 1").text == "42"
    assert len(template_pids()) == 1  # the template survived too


def threads_of(pid: int) -> int:
    """The worker's threads, as the kernel counts them (0 once it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0


BUSY_THREAD = "import threading\ndef spin():\n    while True:\n        sum(range(1000))\n"


@pytest.mark.parametrize("start", ["threading.Thread(target=spin, daemon=True).start()",
                                   "import _thread\n_thread.start_new_thread(spin, ())"])
@pytest.mark.slow
def test_a_thread_that_outlives_its_cell_is_held_to_a_cells_cpu_time(box, start):
    """A thread may outlive the cell that started it, but while no cell runs it may use one cell's CPU time (2 s
    here): then it is interrupted, the next cell's output says so, and the interpreter keeps its variables. A raw
    `_thread` thread, which `threading` does not list, is held the same way."""
    box.call("x = 41\n" + BUSY_THREAD + start)
    assert threads_of(box.pid) == 2
    assert wait_until(lambda: threads_of(box.pid) == 1, 60), "the busy thread was never interrupted"
    out = box.call("x + 1")
    assert "1 thread(s) started by earlier cells ran for 2 s of CPU time" in out.text and out.text.endswith("42")
    assert "thread(s)" not in box.call("x").text  # said once


@pytest.mark.slow
def test_a_cells_running_threads_end_with_its_time(box):
    """The threads running when a cell's time is up are interrupted with it, and the cell's output shows their short
    tracebacks (the cell's frames, not threading's)."""
    out = box.call(BUSY_THREAD + "threading.Thread(target=spin, daemon=True).start()\nwhile True: pass")
    assert out.extra["timed_out"]
    assert "Exception in thread" in out.text and "ThreadTimeout: the thread was interrupted" in out.text
    assert 'File "<cell' in out.text and "threading.py" not in out.text
    assert wait_until(lambda: threads_of(box.pid) == 1), "the cell's thread outlived its time limit"


@pytest.mark.slow
def test_a_thread_that_will_not_stop_takes_its_worker_down_and_the_model_is_told_why(box):
    box.call("x = 1\n" + BUSY_THREAD.replace("sum(range(1000))", "try:\n            sum(range(1000))\n"
                                                "        except BaseException:\n            pass")
             + "threading.Thread(target=spin, daemon=True).start()")
    pid = box.pid
    assert wait_until(lambda: threads_of(pid) == 0, 60), "the worker went on with a thread it could not stop"
    out = box.call("x")
    assert out.failed and out.extra["restarted"]
    assert "a thread started by a cell ran for 2 s of CPU time while no cell ran" in out.text
    assert "variables are lost" in out.text
    assert box.call("x = 2\nx").text == "2"
    assert len(template_pids()) == 1


@pytest.mark.slow
def test_waiting_threads_cost_nothing_and_stay(box):
    """A thread pool the cell did not shut down waits, using no CPU: nothing interrupts it, not even a later cell's
    time-out, and it serves the cells after."""
    box.call("from concurrent.futures import ThreadPoolExecutor\npool = ThreadPoolExecutor(2)\n"
             "list(pool.map(abs, [-1, -2]))")
    before = box.pid
    time.sleep(3)  # longer than the 2 s a cell's threads may run while no cell runs, had they run
    assert box.call("while True: pass").extra["timed_out"]
    out = box.call("list(pool.map(abs, [-3, -4]))")
    assert out.text == "[3, 4]" and not out.failed and box.pid == before


@pytest.mark.slow
def test_timeout_interrupts_and_keeps_state(box):
    out = box.call("y = 5\nwhile True: pass")
    assert out.extra["timed_out"] and "interrupted" in out.text
    assert box.call("y").text == "5"


def test_worker_killed_from_outside_is_replaced(box):
    box.call("x = 1")
    os.kill(box.pid, signal.SIGKILL)
    out = box.call("x")
    assert out.failed and out.extra["restarted"] and "variables are lost" in out.text
    assert box.call("x = 2\nx").text == "2"
    assert box.snapshot() == {"cells": ["x = 2\nx"]}  # the history restarts with the clean worker


def test_replay_restores_in_the_same_process(box):
    box.call("import numpy as np\na = np.arange(5)")
    box.call("b = a * 2")
    other = LocalSandbox(LIMITS)
    other.restore(box.snapshot())
    assert other.call("b.tolist()").text == "[0, 2, 4, 6, 8]"
    other.close()


@pytest.mark.slow
def test_two_hundred_envs_forked_and_closed_leave_no_process():
    import gymnasium as gym

    import arpo_env  # noqa: F401

    for _ in range(200):
        env = gym.make("ARPO-Math-v0", sandbox_options={"timeout_s": 5})
        env.reset(seed=0)
        env.step("<python>z = 3</python>")
        child = env.unwrapped.fork()
        child.step("<python>z</python>")
        child.close()
        env.close()
    (pgid,) = template_pids()
    assert wait_until(lambda: [p for p, _ in group_members(pgid)] == [pgid]), group_members(pgid)


def test_a_killed_host_leaves_no_working_directory_behind(tmp_path):
    # Workers write into their working directories (up to `disk_mb` each); a host killed with SIGKILL (a trainer
    # stopped hard) cannot remove them, so the template does, when it sees its host gone.
    code = ("import sys, time\nfrom arpo_env.tools.sandbox.host import LocalSandbox\nbox = LocalSandbox()\n"
            "box.call(\"open('notes.txt', 'w').write('x' * 100_000)\")\nchild = box.fork()\nchild.call('1')\n"
            "print(box._slot.process.workdir, child._slot.process.workdir, flush=True)\ntime.sleep(120)")
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(__file__)))
    try:
        workdirs = host.stdout.readline().split()
        assert len(workdirs) == 2 and all(os.path.isfile(os.path.join(w, "notes.txt")) for w in workdirs)
        root = os.path.dirname(workdirs[0])
        assert os.path.dirname(workdirs[1]) == root and os.path.basename(root).startswith("arpo-sandbox-")
    finally:
        host.kill()
        host.wait()
    assert wait_until(lambda: not os.path.exists(root), seconds=30), os.listdir(root)


def test_closing_removes_the_working_directories():
    box = LocalSandbox(LIMITS)
    box.call("open('notes.txt', 'w').write('x')")
    child = box.fork()
    child.call("1")
    workdirs = [box._slot.process.workdir, child._slot.process.workdir]
    child.close()
    box.close()
    assert not any(os.path.exists(w) for w in workdirs)


def test_garbage_collection_kills_the_worker():
    import gc

    box = LocalSandbox(LIMITS)
    box.call("1")
    pid = box.pid
    del box
    gc.collect()
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2])


def run_python(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (one with no template yet), from the project's root."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          cwd=os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.slow
def test_an_episode_starts_the_template_before_its_first_call():
    """Starting the template imports numpy and sympy (a third of a second here, two on a machine's first run): begun
    at reset, it overlaps the model's first turn instead of holding up the first call, which uses that template."""
    out = run_python(
        "import json, time, gymnasium as gym, arpo_env\n"
        "from arpo_env.tools.sandbox.host import template_pids\n"
        "env = gym.make('ARPO-Math-v0').unwrapped\n"
        "assert not template_pids()\n"
        "env.reset(options={'question': 'q', 'answer': '1'})\n"
        "deadline = time.monotonic() + 120\n"
        "while not template_pids() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "started = template_pids()\n"
        "obs, *_ = env.step('<python>print(6 * 7)</python>')\n"
        "print(json.dumps([started, template_pids(), '42' in obs]))\n"
        "env.close()\n")
    assert out.returncode == 0, out.stderr[-2000:]
    started, after, answered = json.loads(out.stdout)
    assert started and after == started and answered, out.stdout  # one template, up before the first call


def test_a_fork_taken_while_a_template_starts_can_start_its_own():
    """A host that forks (a vector env, a data loader) while a thread holds the template lock, as a background start
    does for its length, must not leave its child a lock that nobody will ever release."""
    out = run_python(
        "import os, signal, threading\n"
        "from arpo_env.tools.sandbox import host as sandbox\n"
        "held, release = threading.Event(), threading.Event()\n"
        "def hold():\n"
        "    with sandbox._templates_lock:\n"
        "        held.set()\n"
        "        release.wait()\n"
        "threading.Thread(target=hold, daemon=True).start()\n"
        "held.wait()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    signal.alarm(60)\n"
        "    box = sandbox.LocalSandbox()\n"
        "    os._exit(0 if box.call('6 * 7').text == '42' else 3)\n"
        "release.set()\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "0", out.stdout  # -14: the child hung on the lock until its alarm
