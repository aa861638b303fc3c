"""Whether a math answer equals a gold one: `math_equal` (math-verify on `tidy` text, with lists, matrices, options
and percentages), bounded in time from any thread by a worker process, with a cache of recent verdicts."""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Mapping

from arpo_env.scoring import failures
from arpo_env.scoring.math_text import DECIMAL, KINDS_OF, OPTION_LETTER, as_latex, prose, tidy, unit
from arpo_env.scoring.qa_metrics import aliases, choice_letter
from arpo_env.scoring.tractable import FAR_LONGER, MIN_FAR_LONGER, intractable

# math-verify warns on every call made with its (signal-based) timeout off, which worker threads must do.
logging.getLogger("math_verify").setLevel(logging.ERROR)
_log = logging.getLogger(__name__)


_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_OPENERS_CLOSERS = (("(", ")"), ("[", "]"), ("\\langle", "\\rangle"), ("<", ">"))


def _split_top(text: str) -> list[str] | None:
    """`text` split at its commas outside brackets, each piece stripped; None where its brackets do not balance or a
    piece is empty. One pass."""
    pieces, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif c == "," and depth == 0:
            pieces.append(text[start:i].strip())
            start = i + 1
    pieces.append(text[start:].strip())
    return None if depth or not all(pieces) else pieces


def _bracketed_items(text: str) -> list[str] | None:
    """The items that one pair of brackets around all of `text` holds (``(1, 2)``, ``[1, 2]``, ``\\langle 1,
    2\\rangle``: ``1`` and ``2``), or None (no such pair, or ``(1)(2)``, two pairs)."""
    for opener, closer in _OPENERS_CLOSERS:
        if text.startswith(opener) and text.endswith(closer) and len(text) >= len(opener) + len(closer):
            items = _split_top(text[len(opener):len(text) - len(closer)])
            if items is not None:  # balanced inside: the pair is one
                return items
    return None


def _matrix_shape(gold: str) -> str | None:
    r"""``column``, ``row`` or ``matrix`` for a gold that is one ``pmatrix`` or ``bmatrix``, else None."""
    g = gold.strip()
    for kind in ("pmatrix", "bmatrix"):
        begin, end = f"\\begin{{{kind}}}", f"\\end{{{kind}}}"
        if g.startswith(begin) and g.endswith(end) and g.count("\\begin") == 1:
            inner = g[len(begin):-len(end)]
            return "matrix" if "&" in inner and "\\\\" in inner else "row" if "&" in inner else "column"
    return None


def _as_matrix(text: str, shape: str) -> str | None:
    r"""A vector or matrix written as a tuple, a list, a nested list or SymPy's ``Matrix(…)`` (``(1, 2)``,
    ``\langle 1, 2\rangle``, ``[[1, 2], [3, 4]]``), as the ``pmatrix`` of the gold's `shape`; None for anything
    else."""
    t = _LEFT_RIGHT.sub("", text).strip()
    if t.startswith("Matrix(") and t.endswith(")"):
        t = t[len("Matrix("):-1].strip()
    items = _bracketed_items(t)
    if not items:
        return None
    nested = [_bracketed_items(item) for item in items]
    if all(nested):  # rows: [[1, 2], [3, 4]], or SymPy's column [[1], [2]]
        rows = nested
        if len({len(r or []) for r in rows}) != 1:
            return None
    elif shape == "row" or len(items) == 1:
        rows = [items]
    else:
        rows = [[item] for item in items]
    return "\\begin{pmatrix}" + "\\\\".join("&".join(r or []) for r in rows) + "\\end{pmatrix}"


_OPTION_GOLD = re.compile(r"\s*" + OPTION_LETTER + r"\s*")
"""A gold that is a multiple-choice option's letter, as MATH writes it (``\\text{(C)}``)."""


def math_equal(prediction: str | None, gold: Any, timeout_s: float | None = None) -> bool:
    r"""Whether `prediction` and `gold` are the same mathematical answer (math-verify; any gold alias may match).

    Bounded from any thread: math-verify runs in a killable worker process (`arpo_env.scoring.worker_pool`); an answer
    that makes it overrun `timeout_s` (default ``ARPO_SCORE_TIMEOUT``, 5 s), exhaust its memory or crash is not equal,
    and the failure is noted with the reward (`arpo_env.scoring.failures`): no verdict, not a wrong answer.
    An inequality is the interval it describes (``x > 3`` is ``(3,\infty)``: math-verify's
    ``allow_set_relation_comp``). A percentage is its number as well as its fraction (``12.5\%`` is 12.5 and 0.125:
    math-verify read only a whole positive one both ways, `_without_percent`). Where the gold is a vector or a matrix
    (``\begin{pmatrix}``: 150 golds of MATH), one written as a tuple, a list or SymPy's ``Matrix(…)`` is that matrix
    (`_as_matrix`; math-verify read none as one), and where the gold lists values (``2, 3``) a list in square brackets
    is them (`_unlisted`: SymPy's ``solve`` prints ``[2, 3]``, which math-verify read as an interval).
    Where the gold is a multiple-choice option's letter (``\text{(C)}``), the letter the prediction names is
    compared (`qa_metrics.choice_letter`: ``(C) Parabola``, ``Option C``).
    A prediction in prose (`prose`) is compared as text, in this thread: equal when a gold alias has the same words;
    so is one word against a gold written as text (``\text{ellipse}``: "an ellipse." is equal, and "ellipses" goes on
    to math-verify).
    An answer in one unit of measure is not equal to a gold alias in another (`unit`: ``5.4 dollars`` and
    ``5.4\text{ cents}``; math-verify drops units; a degree Celsius or Fahrenheit is a degree, `KINDS_OF`); a number
    without a unit, or a word that is no unit, is not taken for one.
    One beyond math-verify's reach (`intractable`: a power tower, brackets nested deep) is not equal, at once, unless a
    gold alias is beyond it too; nor is one far longer than every gold (`FAR_LONGER`).
    A verdict of math-verify is asked once for the same answer, golds and bound (`VERDICTS_KEPT`).
    """
    if prediction is None or not str(prediction).strip():
        return False
    written = aliases(gold)
    golds = [tidy(g) for g in written]
    if not golds:  # a missing gold (None, NaN, empty): nothing is equal to it
        return False
    options = [_OPTION_GOLD.fullmatch(g) for g in written]
    letter = choice_letter(prediction) if all(options) else None
    if letter is not None:  # "(C) Parabola", "Option C": the letter is the answer
        return any(letter in o.groups() for o in options)
    text = tidy(prediction)
    shapes = {_matrix_shape(g) for g in golds}
    if None not in shapes:  # a vector or matrix: "(1, 2)" and "[[1, 2], [3, 4]]" compare as matrices
        text = _as_matrix(text, shapes.pop() if len(shapes) == 1 else "column") or text
    elif text[:1] == "[" and all(_listed(g) for g in golds):  # SymPy's solutions [2, 3]: an interval to math-verify
        text = _unlisted(text)
    if any(g == text for g in golds):
        return True
    measured = unit(text)
    if measured is not None:  # math-verify drops units: "18 cents" must not equal 18 dollars
        golds = [g for g in golds if unit(g) in (None, measured, *KINDS_OF.get(measured, ()))]
        if not golds:
            return False
    words = prose(text)
    if words is not None:  # not mathematics: compared as text, here
        return any(prose(g, least=1) == words for g in golds)
    word = prose(text, least=1)  # one word, against a gold written as text ("\text{ellipse}")
    if word is not None and any("\\text" in g and prose(g, least=1) == word for g in golds):
        return True  # "an ellipse.": else math-verify decides, which reads words as text only where \text{} says so
    longest_gold = max(len(g) for g in golds)
    if len(text) > max(MIN_FAR_LONGER, FAR_LONGER * longest_gold):  # far longer than every gold: not equal, at once
        _log.debug("math scoring declined %r: %d characters against golds of %d at most", text[:80], len(text),
                   longest_gold)
        return False
    beyond = intractable(text)
    if beyond is not None and not any(intractable(g) for g in golds):  # no gold is like it: not equal, and at once
        _log.debug("math scoring declined %r: %s", text[:80], beyond)
        return False
    bare_golds = tuple(b for b in map(_without_percent, golds) if b is not None)
    if _verdict(text, (*golds, *bare_golds), timeout_s):
        return True
    bare = _without_percent(text)  # "12.5\%" against 12.5: math-verify read 0.125
    return bare is not None and _verdict(bare, tuple(golds), timeout_s)


_PLAIN_NUMBER = re.compile(r"[+-]?" + DECIMAL)


def _listed(gold: str) -> bool:
    """Whether a gold is a list of values without brackets (``2, 3``: the solutions of an equation)."""
    g = gold.strip()
    return not g.startswith(("(", "[", "\\")) and len(_split_top(g) or []) > 1


def _unlisted(text: str) -> str:
    """A list in square brackets (``[2, 3]``, as SymPy's ``solve`` prints solutions) as the values it lists, where
    the gold is a list without brackets; else `text`."""
    items = _bracketed_items(text) if text.endswith("]") else None
    return ", ".join(items) if items and len(items) > 1 else text


def _without_percent(answer: str) -> str | None:
    r"""The number of a percentage (``12.5\%``, ``-10%``: ``12.5``, ``-10``), None for anything else.

    math-verify reads ``12.5\%`` as 0.125, and a bare 12.5 as no percentage, yet ``50\%`` as 50 too: a percentage and
    its number agree here whatever their digits (``12.5`` against a gold ``12.5\%``: 19 of the 47 percentage golds of
    MATH and the training set had no number that scored right, the ones not whole or not positive)."""
    text = answer.rstrip()
    if not text.endswith("%"):
        return None
    text = text[:-1]
    text = text[:-1].rstrip() if text.endswith("\\") else text.rstrip()
    return text if _PLAIN_NUMBER.fullmatch(text) else None


VERDICTS_KEPT = 1024
"""How many of math-verify's verdicts `math_equal` keeps: the samples of a group often end on the same answer, and
one that takes math-verify its whole bound (``(x+1)^{3000}``: 5 s of a worker) took it again at every sample."""
_verdicts: "OrderedDict[tuple[str, tuple[str, ...], float | None], Future[bool]]" = OrderedDict()
_verdicts_lock = threading.Lock()


def _verdict(text: str, golds: tuple[str, ...], timeout_s: float | None) -> bool:
    """math-verify's verdict from a scoring worker, asked once for the same answer, golds and bound: the threads
    that ask while it is being decided wait for that one verdict; kept for the `VERDICTS_KEPT` latest. A verdict the
    worker could not give (past its bound) is False, and recorded as a scoring failure (`failures.record`)."""
    from arpo_env.scoring.worker_pool import BoundExceeded, pool

    key = (text, golds, timeout_s)
    with _verdicts_lock:
        future = _verdicts.get(key)
        mine = future is None
        if mine:
            future = _verdicts[key] = Future()
            while len(_verdicts) > VERDICTS_KEPT:
                _verdicts.popitem(last=False)
        else:
            _verdicts.move_to_end(key)
    if mine:
        try:
            future.set_result((bool(pool().call(MATH_EQUAL_TARGET, text, list(golds), timeout_s=timeout_s)), None))
        except BoundExceeded as exc:
            _log.warning("math scoring gave up on %r: %s", text[:80], exc)
            what = failures.TIMEOUT if "did not finish" in str(exc) else "failed"
            future.set_result((False, f"math scoring {what}: {exc}"))
        except BaseException as exc:  # not a verdict (the pool could not start, an interrupt): asked again next time
            with _verdicts_lock:
                if _verdicts.get(key) is future:
                    del _verdicts[key]
            future.set_exception(exc)
            raise
    verdict, failure = future.result()
    if failure is not None:  # every answer scored by this verdict carries it, not only the first
        failures.record(failure)
    return verdict


MATH_EQUAL_TARGET = f"{__name__}:math_equal_unbounded"
"""What a scoring worker runs (`arpo_env.scoring.worker_pool`): `math_equal` without its bound."""


def math_equal_unbounded(prediction: str, golds: list[str]) -> bool:
    """math-verify itself, unbounded: what `math_equal` runs inside a scoring worker."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # math-verify's timeouts use SIGALRM, which only the main thread may set; in worker threads they are off.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    # our normaliser runs outside the try: its exception is a scoring error (the worker reports it), not "not equal"
    answer, targets = as_latex(prediction), [as_latex(g) for g in golds]
    try:
        pred = parse(answer, extraction_config=configs, parsing_timeout=timeout)
        for g in targets:
            target = parse(g, extraction_config=configs, parsing_timeout=timeout)
            if target and pred and not _numbers_apart(target[0], pred[0]) and verify(
                    target, pred, timeout_seconds=timeout, allow_set_relation_comp=True):
                return True
    except Exception:  # noqa: BLE001 - an answer math-verify itself cannot handle is not equal
        return False
    return False


def _numbers_apart(gold: Any, prediction: Any) -> bool:
    r"""Whether a gold with a logarithm (``\log 3``, ``\log_3 7``, ``\log x``) and a predicted number (``10^{30}``)
    plainly differ: apart by more than a thousandth of the number (or of 1), at two points where the gold has
    unknowns. math-verify, finding them not equal as numbers, asks SymPy's ``simplify`` last, which spent the whole
    bound on such a pair (a 30-digit integer against ``2\log 3``: ``logcombine`` raises 10 to the integer), 5 s of a
    scoring worker. Numbers this far apart are equal neither way; ``\log_2 8`` and 3 are not apart, and math-verify
    decides."""
    from sympy import Expr, log

    if not (isinstance(prediction, Expr) and isinstance(gold, Expr) and prediction.is_number and gold.has(log)):
        return False
    try:
        scale = max(1, abs(prediction.evalf(30)))
        unknowns = sorted(gold.free_symbols, key=str)
        points = [{u: value + i for i, u in enumerate(unknowns)} for value in (2.718, 7.389)] if unknowns else [{}]
        return all(bool(abs((gold - prediction).evalf(30, subs=at)) > 1e-3 * scale) for at in points)
    except Exception:  # noqa: BLE001 - math-verify decides
        return False


def math_score(prediction: str | None, gold: Any, meta: Mapping[str, Any] | None = None) -> float:
    return 1.0 if math_equal(prediction, gold) else 0.0


def _prestart_math_scoring() -> None:
    from arpo_env.scoring.worker_pool import prestart

    prestart("score")


math_score.prestart = _prestart_math_scoring  # type: ignore[attr-defined]  # see HierarchicalReward.prestart
