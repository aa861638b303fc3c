"""Tasks: questions with gold answers, read from a data directory, a file, the package, or (online) the hub.

`load_tasks(name, data_dir)` understands the layouts of the ARPO release:

* ``<data_dir>/<name>/test.jsonl`` or ``<data_dir>/eval/<name>/test.jsonl`` for the benchmarks (gsm8k, math500,
  math, aime24, aime25, …), with their own keys (``question``/``problem``, ``answer``; gsm8k's after ``####``);
* ``<data_dir>/train/train_10k.parquet`` (name ``train``) and ``valid.parquet`` (name ``valid``): the RL data, whose
  rows are filtered by ``ability`` (math or qa); the question is ``extra_info.question``, the gold answer
  ``reward_model.ground_truth`` (the release's own prompts are not used);
* any ``.jsonl``, ``.json``, ``.parquet``, ``.csv`` or ``.tsv`` path given as the name (a table's first row names
  its columns; a ``.json`` file is a list of records, JSON lines, or an object holding its records): a question
  (``question``, ``problem``, … or a ``prompt`` of chat messages, whose last user turn it is) and a gold answer
  (``answer``, ``ground_truth``, …, ``reward_model.ground_truth``, or MATH's worked ``solution``, whose last
  ``\\boxed{}`` it is);
* ``default``, ``default_qa``, ``default_deepsearch``: small sets shipped inside the package (no data directory,
  no network): 100 math problems (ARPO training rows and GSM8K), 100 multi-hop questions from the ARPO training set
  that the shipped search corpus covers, 100 questions of the release's hard-search set;
* ``hub:<owner>/<name>[:split]``: a Hugging Face dataset, when the ``datasets`` package and a network are there;
* ``arithmetic[:N:SEED:TERMS]`` and ``chain[:N:SEED:STEPS]``: the seeded procedural families
(`arpo_env.datasets.procedural`).

When `data_dir` is not given, the ``ARPO_DATA_DIR`` environment variable is used.
"""

from __future__ import annotations

import ast
import json
import logging
import numbers
import os
import re
import threading
from collections import OrderedDict
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

from arpo_env.datasets.task import DataError, DataNotFound, DataUnreadable, Task
from arpo_env.scoring.qa_metrics import aliases, missing
from arpo_env.tags import unicode_text

MATH_BENCHMARKS = ("aime24", "aime25", "math500", "gsm8k", "math")
ALIAS_LISTS = ("hotpotqa", "2wiki", "musique", "bamboogle", "nq", "triviaqa", "popqa")
"""The datasets whose gold is documented as a list of aliases, any of which is right (the FlashRAG releases of these
multi-hop and open-domain QA sets: ``golden_answers``). A gold written as a list elsewhere (HLE, GAIA, xbench, a
user's file) is one answer: all of it."""
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".tsv")
"""The dataset files `load_tasks` reads when given as the name."""
GOLD_FIELDS = ("answer", "Answer", "ground_truth", "final_answer", "Final answer", "golden_answers")
"""The fields a record's gold answer is read from, in this order (then ``reward_model.ground_truth``): GAIA's own
metadata names it ``Final answer``, Bamboogle's ``Answer``. A text gold's other forms in ``answer_aliases``
(MuSiQue's layout) are its aliases too."""
PACKAGED = {"default": "math_default.jsonl", "default_qa": "qa_default.jsonl",
            "default_deepsearch": "deepsearch_default.jsonl"}
_log = logging.getLogger(__name__)


def _gsm8k_answer(text: str) -> str:
    return text.split("####")[-1].strip().replace(",", "") if "####" in text else text.strip()


_UNESCAPED = str.maketrans({"\x08": "\\b", "\x0c": "\\f", "\x07": "\\a", "\x0b": "\\v"})
"""Control characters that stand for a LaTeX command's backslash and first letter, escaped once too few times."""


def _clean(text: str) -> str:
    # The ARPO release has a backspace where "\b" of "\boxed" was escaped once too few times, and a form feed for the
    # "\f" of "\frac" ("in the form \x0crac{m}{n}": 21 questions of train_10k). Neither is ever a question's own.
    # A lone surrogate ("\ud83d" of an emoji cut in half, as scraped text holds) is U+FFFD: no tokenizer encodes it.
    return unicode_text(text.translate(_UNESCAPED))


def gold_value_text(value: Any) -> str:
    """A gold answer given as a number, as text: a whole number stored as a float (an integer column with a null in
    it, read through pandas, holds 1990.0) is its integer ("1990": QA's F1 of "1990" against "1990.0" is 0); NaN
    (such a column's null) is blank."""
    if isinstance(value, float):
        if missing(value):
            return ""
        if value.is_integer() and abs(value) < 2 ** 53:
            return str(int(value))
    return str(value)


def gold_text(answer: Any) -> str | list[str]:
    """A gold answer as the scorers read it: text, or a list of aliases (a real list: the dataset's own), each
    number as its text (`gold_value_text`) and each lone surrogate U+FFFD. An object of fields is a `ValueError`: its
    keys or values read as aliases (QA's F1 scored "1" correct against ``{"a": 1}``)."""
    if isinstance(answer, dict):
        raise ValueError(f"gold answer is an object of fields ({', '.join(map(str, list(answer)[:6]))}), not text, "
                         "a number or a list of aliases")
    if answer is None:  # no gold: blank, not the text "None"
        return ""
    if not isinstance(answer, str) and isinstance(answer, Iterable):  # a list, a parquet column's array
        return [unicode_text(gold_value_text(a)) for a in answer]
    return unicode_text(gold_value_text(answer))


def as_tasks(tasks: Any, kind: str) -> list[Task]:
    """An env's ``tasks=``: `Task` objects, or records read as a dataset file's are (`task_from_record`: a question
    and a gold answer in any of its fields), of `kind` unless a record says. A record was an AttributeError ("'dict'
    object has no attribute 'question'"), and a string's letters were tasks."""
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Iterable):
        raise ValueError(f"tasks is a list of tasks, not {type(tasks).__name__} {str(tasks)[:100]!r}")
    out = []
    for i, task in enumerate(tasks):
        if isinstance(task, Task):
            out.append(task)
        elif isinstance(task, Mapping):
            out.append(task_from_record(dict(task), "custom", i, kind=task.get("kind") or kind, where="tasks"))
        else:
            raise ValueError(f"tasks[{i}] is a Task or a record with a question and an answer, not "
                             f"{type(task).__name__} {str(task)[:100]!r}")
    return out


def task_from_record(record: dict[str, Any], source: str, index: int, kind: str | None = None,
                     where: str | None = None) -> Task:
    """Normalise one record of any supported layout into a `Task` (`index` counts from 0; a record without a question
    or a gold answer is `DataUnreadable`, said of `where`, the file, or else of `source`)."""
    where = where or source
    question = record_question(record)
    if question is None:
        raise DataUnreadable(f"{where}: record {index + 1} has no question ({QUESTION_FIELDS}){named_fields(record)}")
    answer = record_gold(record)
    if answer is None:
        raise DataUnreadable(f"{where}: record {index + 1} has no gold answer ({GOLD_WORDS}){named_fields(record)}")
    others = record.get("answer_aliases")
    if isinstance(answer, str) and aliases(answer) and isinstance(others, (list, tuple)) and aliases(others):
        answer = list(dict.fromkeys([answer, *(str(a) for a in others if str(a).strip())]))  # MuSiQue's aliases
    if kind is None:
        kind = record.get("ability") or ("math" if source in MATH_BENCHMARKS else "qa")
    if source in ALIAS_LISTS and isinstance(answer, str) and answer.startswith("[") and answer.endswith("]"):
        # some releases of these store their alias lists as Python's repr: "['Frank Lowy']". Elsewhere a gold in
        # brackets *is* the answer: HLE's "[11,19,22,23,29,30,31,36]", a math interval "[-2,0]".
        try:
            parsed = ast.literal_eval(answer)
            answer = [str(a) for a in parsed] if isinstance(parsed, (list, tuple)) and parsed else answer
        except (ValueError, SyntaxError):
            pass
    if isinstance(answer, str) and "####" in answer:
        answer = _gsm8k_answer(answer)
    try:
        answer = gold_text(answer)
    except ValueError as exc:
        raise DataUnreadable(f"{where}: record {index + 1}'s {exc}") from None
    rid = next((record[k] for k in ("id", "unique_id", "task_id", "_id", "idx") if record.get(k) is not None),
               index)  # "_id": HotpotQA's and 2Wiki's own files
    meta = {k: v for k, v in record.items() if k in ("level", "subject", "answer_type", "Level", "data_source")}
    return Task(_clean(question).strip(), answer, str(rid), source, str(kind), meta)


QUESTION_FIELDS = "a text field question, problem, Question, query or prompt, or a prompt of chat messages"
GOLD_WORDS = f"{', '.join(GOLD_FIELDS)}, reward_model.ground_truth, or a solution with a \\boxed{{}}"


def record_question(record: dict[str, Any]) -> str | None:
    """A record's question: its first text field of ``question``, ``problem``, ``Question``, ``query``, ``prompt``,
    ``extra_info.question``, or a conversational ``prompt``'s last user turn; None when it has none."""
    extra = record.get("extra_info") if isinstance(record.get("extra_info"), dict) else {}
    question = next((record[k] for k in ("question", "problem", "Question", "query", "prompt")
                     if isinstance(record.get(k), str)), None) or extra.get("question")
    if question is None and isinstance(record.get("prompt"), list):  # a conversational row: its last user turn
        turns = [m.get("content") for m in record["prompt"] if isinstance(m, dict) and m.get("role") == "user"]
        question = turns[-1] if turns and isinstance(turns[-1], str) else None
    return question if isinstance(question, str) else None


def record_gold(record: dict[str, Any]) -> Any:
    """A record's gold answer as given: its first field of `GOLD_FIELDS` that is not blank, then
    ``reward_model.ground_truth``, then a worked ``solution``'s last ``\\boxed{}`` (a one-line ``solution`` without
    one is the answer itself, as TRL's ``accuracy_reward`` reads it); a blank one (``""`` for a null)
    when those fields are all blank; None when it has none of them."""
    rm = record.get("reward_model") if isinstance(record.get("reward_model"), dict) else {}
    given = [g for g in [*(record.get(k) for k in GOLD_FIELDS), rm.get("ground_truth")] if g is not None]
    if not given and (any(k in record for k in GOLD_FIELDS) or "ground_truth" in rm):
        given = [""]  # a gold field that is null (a parquet column's missing value): blank, left out, not fatal
    answer = next((g for g in given if aliases(g)), None)  # the first that is not blank
    if answer is None and isinstance(record.get("solution"), str):  # MATH's layout: a worked solution, \boxed{} last
        from arpo_env.tags import boxed

        answer = boxed(record["solution"])
        if answer is None and plain_answer(record["solution"]):  # TRL's layout: the solution is the answer ("18")
            answer = record["solution"].strip()
    if answer is None and given:  # only blank ones: a task `load_tasks` leaves out, saying so
        answer = given[0]
    return answer


PLAIN_ANSWER_CHARS = 100
"""The longest ``solution`` read as an answer in itself when it has no ``\\boxed{}``: a worked solution is longer."""


def plain_answer(text: str) -> bool:
    """Whether a ``solution`` without ``\\boxed{}`` is an answer in itself (``18``, ``\\frac{1}{2}``): one short
    line."""
    text = text.strip()
    return bool(text) and "\n" not in text and len(text) <= PLAIN_ANSWER_CHARS


def named_fields(record: dict[str, Any]) -> str:
    names = [str(k) for k in record if record[k] is not None]
    return f"; its fields: {', '.join(names[:12])}" + (", …" if len(names) > 12 else "") if names else "; it is empty"


def _read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a dataset file (parquet, a JSON list, JSON lines, or a CSV / TSV table with a header row), or
    `DataUnreadable` saying what is wrong and where."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            records = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise DataUnreadable(f"{path} is not a readable parquet file: {exc}") from exc
    else:
        try:
            text = path.read_text(encoding="utf-8-sig")  # past a byte-order mark
        except UnicodeDecodeError as exc:
            raise DataUnreadable(f"{path} is not UTF-8 text (byte {exc.start}): {exc.reason}") from exc
        if path.suffix in (".csv", ".tsv"):
            records = _read_table(path, text)
        elif path.suffix == ".json" and text.lstrip().startswith(("[", "{")):
            records = _json_records(_parse_json(path, text, 1, lines_after=text.lstrip().startswith("{")))
        else:
            records = _json_lines(path, text)
    for n, record in enumerate(records, 1):
        if not isinstance(record, dict):
            raise DataUnreadable(f"{path}: record {n} is a {type(record).__name__}, not an object of fields")
    return records


def _read_table(path: Path, text: str) -> list[dict[str, Any]]:
    """The rows of a CSV (TSV) table as records, by its header row's names; an empty cell is a missing field, but in
    a gold answer's column (`GOLD_FIELDS`) a blank gold, which `load_tasks` leaves out with a warning (not the whole
    table for one row)."""
    import csv
    import io

    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if path.suffix == ".tsv" else ",")
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise DataUnreadable(f"{path} line {reader.line_num} is not {path.suffix[1:].upper()}: {exc}") from exc
    extra = next((n for n, row in enumerate(rows, 2) if None in row), None)  # csv's key for cells past the header's
    if extra is not None:
        raise DataUnreadable(f"{path} row {extra} has more cells than the header row names")
    return [{k: v for k, v in row.items() if v not in (None, "") or k in GOLD_FIELDS} for row in rows]


def _json_lines(path: Path, text: str) -> list[Any]:
    # Lines end at "\n" (and "\r\n"): JSON text may hold U+2028, U+0085 … unescaped, which splitlines cuts at.
    return [_parse_json(path, line, n) for n, line in enumerate(text.split("\n"), 1) if line.strip()]


def _json_records(document: Any) -> list[Any]:
    """The records of a ``.json`` file's document: a list's items; an object's, when it holds them as its one list
    of objects (``{"version": …, "data": [{…}, …]}``); else the object itself, one record (a file of one JSON line)."""
    if isinstance(document, dict):
        lists = [v for v in document.values() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
        if len(lists) == 1 and not any(k in document for k in ("question", "problem", "Question", "query", "prompt")):
            return lists[0]
        return [document]
    return document if isinstance(document, list) else [document]


def _int(digits: str) -> int | str:
    # past Python's limit on an int's digits (4,300): the digits, as text (a gold answer's are read as text anyway)
    try:
        return int(digits)
    except ValueError:
        return digits


def _parse_json(path: Path, text: str, first_line: int, lines_after: bool = False) -> Any:
    """`text` (of `path`, from its line `first_line`) as JSON, or `DataUnreadable` naming the line. `lines_after`: a
    second object after the first makes it JSON lines, whose records are returned (a ``.json`` file as `datasets`'
    ``to_json`` writes it)."""
    try:
        return json.loads(text, parse_int=_int)
    except json.JSONDecodeError as exc:
        if lines_after and exc.msg == "Extra data":
            return _json_lines(path, text)
        raise DataUnreadable(f"{path} line {first_line + exc.lineno - 1} is not JSON ({exc.msg}, column "
                             f"{exc.colno})") from exc
    except RecursionError as exc:
        raise DataUnreadable(f"{path} line {first_line}: JSON nested too deeply to read") from exc


_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+(?::[\w.-]+)?")
"""What reads as a Hugging Face dataset's id (``openai/gsm8k``, as TRL's ``dataset_name`` takes one): the error that
finds no such file names its ``hub:`` form."""


def _candidates(name: str, data_dir: Path) -> Iterable[Path]:
    aliases = {"train": "train_10k", "hard_search": "hard_search_1k"}
    stem = aliases.get(name, name)
    for base in (data_dir, data_dir / "eval", data_dir / "train"):
        yield base / name / "test.jsonl"
        yield base / f"{stem}.parquet"
        yield base / f"{stem}.jsonl"


def resolve(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The file that holds dataset `name`, or a `DataNotFound` naming every place that was tried."""
    if name in PACKAGED:
        return Path(str(resources.files("arpo_env") / "data" / PACKAGED[name]))
    path = Path(name).expanduser()
    if path.suffix in FILE_SUFFIXES:
        if path.is_file():
            return path
        raise DataNotFound(f"dataset file {path} does not exist")
    if path.is_file():  # a file is read as it is, whatever its name
        raise DataUnreadable(f"{path}: a dataset file is {', '.join(FILE_SUFFIXES[:-1])} or {FILE_SUFFIXES[-1]}, "
                             f"not {path.suffix or 'a file without a suffix'}")
    hub = f"; a Hugging Face dataset is named hub:{name}" if _HUB_ID.fullmatch(name) else ""
    data_dir = data_dir or os.environ.get("ARPO_DATA_DIR")
    if not data_dir:
        raise DataNotFound(
            f"dataset {name!r} needs a data directory: pass data_dir=… (or set ARPO_DATA_DIR) pointing at a folder "
            f"with {name}/test.jsonl or eval/{name}/test.jsonl, as in the ARPO release's data layout; "
            f"or pass dataset='default' for the small math set shipped with the package{hub}"
        )
    tried = list(_candidates(name, Path(data_dir)))
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise DataNotFound(f"dataset {name!r} not found under {data_dir}; looked for: " + ", ".join(map(str, tried))
                       + hub)


def dataset_name(name: Any) -> str:
    """A dataset's name or file as text: a `pathlib.Path` is its path , anything else but text a `ValueError` saying
    what a dataset is."""
    if isinstance(name, os.PathLike):
        return os.fspath(name)
    if not isinstance(name, str):
        raise ValueError(f"dataset is a name (gsm8k, arithmetic:50:0, hub:ID) or a file's path, not "
                        f"{type(name).__name__} {str(name)[:100]!r}")
    return name


def task_paths(name: str, data_dir: str | os.PathLike | None = None) -> list[str]:
    """The folders that hold dataset `name`'s file and `data_dir`, for the sandbox to hide (its cells may not read
    the answers). A generated or a hub dataset has no file of its own here (the hub's cache is hidden anyway)."""
    paths = [os.path.abspath(data_dir)] if data_dir else []
    name = dataset_name(name)
    if name.startswith("hub:"):
        return paths
    try:
        paths.append(os.path.abspath(resolve(name, data_dir).parent))
    except DataError:  # a generated family, or a name load_tasks reports on itself
        pass
    return paths


def load_tasks(name: str = "default", data_dir: str | os.PathLike | None = None, kind: str | None = None,
               limit: int | None = None) -> list[Task]:
    """Load dataset `name` as tasks; `kind` ('math' or 'qa') keeps only rows of that ability in mixed files; `limit`:
    the first so many (at least 1; None: all). A record whose gold answer is blank is left out, with a warning, and so
    is one whose question comes with an image or a file (`has_attachment`), which a text model is not given."""
    check_limit(limit)
    name = dataset_name(name)
    if name.startswith("hub:"):
        return _load_hub(name[4:], kind, limit)
    from arpo_env.datasets.procedural import procedural_tasks

    generated = procedural_tasks(name)
    if generated is not None:
        return generated[:limit]
    path = resolve(name, data_dir)
    source = path.parent.name if path.name == "test.jsonl" else path.stem if path.suffix in FILE_SUFFIXES else path.name
    if name in PACKAGED:
        source = name
    return list(_file_tasks(path, source, kind, limit))


_FILE_TASKS: "OrderedDict[tuple[Any, ...], tuple[Task, ...]]" = OrderedDict()
_FILE_TASKS_KEPT = 8
_FILE_TASKS_LOCK = threading.Lock()


def _file_tasks(path: Path, source: str, kind: str | None, limit: int | None) -> tuple[Task, ...]:
    """The tasks of a dataset file, read once per version of the file (its inode, size, modification and change
    times) and per `kind` and `limit` in this process: `arpo eval` makes an env for every sample, and each env read
    the whole benchmark again (MATH's 5,000 problems: 0.13 s an env, 11 minutes a run of its 5,000 samples; the
    training set's 10,000 rows 0.47 s), warning again of each row it leaves out. Tasks are frozen; each caller gets a
    list of its own."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise DataNotFound(f"dataset file {path} cannot be read ({exc})") from exc
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, source, kind, limit)
    with _FILE_TASKS_LOCK:  # one thread reads a file; the others wait for its tasks
        found = _FILE_TASKS.get(key)
        if found is None:
            found = _FILE_TASKS[key] = tuple(_tasks(_read_records(path), source, kind, limit, str(path)))
            while len(_FILE_TASKS) > _FILE_TASKS_KEPT:
                _FILE_TASKS.popitem(last=False)
        else:
            _FILE_TASKS.move_to_end(key)
        return found


def _tasks(records: Iterable[dict[str, Any]], source: str, kind: str | None, limit: int | None, where: str
           ) -> list[Task]:
    """The tasks of `records` (a file's, a hub dataset's), the first `limit` of them: with `kind`, a row of another
    ability is passed over; a record whose question comes with an image or a file, or whose gold answer is blank
    (``" "``, ``""``, ``[" "]``: no answer could be right), is left out, with one warning each naming them.
    `DataNotFound` when none is left."""
    tasks, blank, attached = [], [], []
    for i, record in enumerate(records):
        ability = record.get("ability")
        if kind is not None and ability is not None and ability != kind:
            continue
        if has_attachment(record):
            attached.append(i)
            continue
        task = task_from_record(record, source, i, kind, where=where)
        if not aliases(task.answer):
            blank.append(i)
            continue
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    # a blank gold (train_10k's record 5275 is " ") would train on a reward no answer can earn
    _warn_left_out(blank, where, "with a blank gold answer", "no answer could be scored right")
    _warn_left_out(attached, where, "whose question comes with an image or a file", "a text model is not given it")
    if not tasks:
        raise DataNotFound(f"{where} holds no {kind or ''} tasks".replace("  ", " ") + (
            f" with a gold answer ({len(blank)} have a blank one)" if blank else "") + (
            f" without an image or a file ({len(attached)} have one)" if attached else ""))
    return tasks


def has_attachment(record: dict[str, Any]) -> bool:
    """Whether a record's question comes with an image or a file that the model is not given: HLE's own files hold
    its 2,500 questions, a seventh of them with an ``image`` (a data URI) the question refers to ("the image shows
    …"), and GAIA's own metadata names a file for a third of its validation questions (``file_name``: a spreadsheet,
    a PDF, a recording). The paper takes the text-only questions of both (HLE's 500, GAIA's 103), as text models
    must. A ``has_image`` flag says so too."""
    image, attached = record.get("image"), record.get("file_name")
    return bool(record.get("has_image")) or bool(image.strip() if isinstance(image, str) else image) or bool(
        attached.strip() if isinstance(attached, str) else attached)


def _warn_left_out(records: list[int], where: str, what: str, why: str) -> None:
    """One warning naming the `records` (counted from 0) of `where` left out, `what` they are and `why`."""
    if records:
        many = "s" if len(records) > 1 else ""
        _log.warning("%s: %d record%s %s left out (record%s %s): %s", where, len(records), many, what, many,
                     ", ".join(str(i + 1) for i in records[:10]) + (", …" if len(records) > 10 else ""), why)


def _load_hub(spec: str, kind: str | None, limit: int | None) -> list[Task]:
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as exc:
        raise DataNotFound(f"hub:{spec} needs the 'datasets' package (pip install datasets) and a network") from exc
    repo, _, split = spec.partition(":")
    try:
        rows = datasets.load_dataset(repo, split=split or "test")
    except (OSError, ValueError) as exc:  # offline, no such dataset (FileNotFoundError), no such split or config
        raise DataNotFound(f"hub:{spec}: {' '.join(str(exc).split())[:500]} (a hub dataset needs a network, or the "
                           "hub's cache; or give a data directory or a .jsonl / .parquet / .csv file)") from exc
    return _tasks(rows, repo.split("/")[-1], kind, limit, f"hub:{spec}")


def check_limit(limit: object) -> None:
    """A number of tasks to take: at least 1, or None for all. (A slice took 0 as all and -1 as all but the last.)"""
    if limit is not None and not (isinstance(limit, numbers.Integral) and not isinstance(limit, bool) and limit >= 1):
        raise ValueError(f"limit must be a whole number of tasks, at least 1 (None: every task), not {limit!r}")
