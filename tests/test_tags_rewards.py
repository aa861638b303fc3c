"""The tag rules and the hierarchical reward (also as TRL reward functions), on real benchmark records."""

from __future__ import annotations

import inspect
import json

import pytest

from arpo_env import rewards, tags
from arpo_env.scoring import math_equivalence, math_text, tractable

GOOD = "<think>12*34</think>\n<python>print(12*34)</python>\n<result>\n408\n</result>\n<answer>\\boxed{408}</answer>"


def test_spans_treat_tool_content_as_opaque():
    text = '<think>x<python>print("<answer>oops</answer>")</python></think><answer>\\boxed{1}</answer>'
    found, errors = tags.spans(text)
    assert errors == []
    assert [s.tag for s in found] == ["think", "python", "answer"]
    assert tags.last_call(text, ("python",)).content == 'print("<answer>oops</answer>")'
    assert tags.final_answer(text) == "1"


@pytest.mark.parametrize("completion, error", [
    ("<answer>408</answer>", "no \\boxed{}"),
    ("I think it is 408", "no <answer>"),
    ("<think>a<answer>\\boxed{1}</answer>", "opened inside <think>"),
    ("<answer>\\boxed{1}</answer><python>1</python>", "a tool call after the answer"),
    ("</think><answer>\\boxed{1}</answer>", "without a matching"),
    ("<python>1<answer>\\boxed{1}</answer>", "never closed"),
])
def test_format_errors(completion, error):
    assert any(error in e for e in tags.format_errors(completion)), tags.format_errors(completion)


def test_strict_think_is_optional():
    loose = "<python>print(1)</python>\n<result>\n1\n</result>\n<answer>\\boxed{1}</answer>"
    assert tags.format_errors(loose) == []
    assert tags.format_errors(loose, strict_think=True) == ["does not start with <think>"]
    assert tags.format_errors(GOOD, strict_think=True) == []


def test_boxed_matches_nested_braces():
    assert tags.boxed("so \\boxed{\\frac{1}{2}} and \\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}") == \
        "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert tags.boxed("\\boxed{unclosed") is None


def _boxed_by_scanning(text):
    """The first implementation of `tags.boxed` (each box matched by scanning forward from it: quadratic), kept
    as the reference the one-pass version must agree with."""
    import re

    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            best = text[m.end(): i - 1]
    return best


def _unwrapped_by_rescanning(text):
    """The first implementation of `tags.unwrap_text` (rescanning after each wrapper it removes: quadratic)."""
    import re

    wrappers = re.compile(r"\\(?:text|textbf|textit|textrm|textsf|texttt|textnormal|textup|emph|underline|mathrm|"
                          r"mathbf|mathit|mathsf|mathtt|mathnormal|boldsymbol|bm|mbox|operatorname)\s*\{")
    while True:
        m = wrappers.search(text)
        if m is None:
            break
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[:m.start()] + (text[m.end(): i - 1] if depth == 0 else text[m.end():]) + text[i:]
    text = text.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
            text = text[len(left): len(text) - len(right)].strip()
    return text


def test_one_pass_brace_matching_agrees_with_scanning():
    import random

    # Whole tokens only: rescanning could join "\\te" + "xt{" into a wrapper across a removed one; one pass does not.
    pieces = ["\\boxed{", "\\fbox {", "\\text{", "\\textbf {", "\\mathrm{", "\\emph{", "{", "}", "}", "a", "12", " ",
              "\\frac", "$", "\\(", "\\)"]
    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 24)))
        assert tags.boxed(text) == _boxed_by_scanning(text), text
        assert tags.unwrap_text(text) == _unwrapped_by_rescanning(text), text


@pytest.mark.timeout(60)  # a hang guard, not a speed measurement: one pass takes about a second here
@pytest.mark.slow
def test_scoring_is_linear_in_nested_boxes_and_wrappers():
    """A model that writes 100,000 nested boxes (800 KB; beyond an env's transcript budget, not beyond a TRL
    completion scored by `qa_reward`) or wrappers is scored in about a second; matching each box by scanning
    forward from it took 13 s for 4,000 and would take hours here."""
    from arpo_env.scoring import judge

    n = 100_000
    nested = "\\boxed{" * n + "Paris" + "}" * n
    assert tags.boxed(nested) == "Paris"
    assert rewards.qa_reward([""], [f"<answer>{nested}</answer>"], answer=["Paris"]) == [1.0]
    assert tags.unwrap_text("\\text{" * n + "Paris" + "}" * n) == "Paris"
    assert tags.unwrap_text("\\text{a} " * n).split() == ["a"] * n
    assert tags.boxed("\\boxed{" * n) is None
    assert judge.judge_verdict("<" * (8 * n) + " correct") is True


@pytest.mark.timeout(60)  # a hang guard, not a speed measurement: it takes a fraction of a second here
def test_tidying_grouped_digits_is_linear():
    """A variable set to 64,000 groups of digits, each followed by what could end the number or go on (``{,}``, a
    space, words) and an ``=`` that fails the match at the very end: a pattern that let the trailing text take the
    groups back tried each count of groups, 161 s for ``{,}``."""
    n = 64_000
    for hostile in ("x = 1" + ",000" * n + "=", "x = 1" + "{,}000" * n + "{,}=", "x = 1" + ",\\!000" * n + ",\\!=",
                    "x = 1" + ",000" * n + " dollars=", "1" + ",000" * n + " dollars=", "1" + ",000" * n + " cm^2="):
        assert math_text.tidy(hostile) == hostile
    assert math_text.tidy("x = 1" + "{,}000" * n) == "1" + "{,}000" * n


@pytest.mark.timeout(60)  # a hang guard, not a speed measurement: it takes about a second here
def test_reading_unicode_mathematics_is_linear():
    """Roots whose brackets never close, superscripts, and a root before a run of spaces: one pass each."""
    n = 200_000
    assert math_text.tidy("√(" * n) == "\\sqrt(" * n
    assert math_text.tidy("²" * n) == "^{" + "2" * n + "}"
    assert math_text.tidy("√" + " " * n + "x") == "\\sqrt{x}"
    assert math_text.tidy("√(" * n + ")" * n) == "\\sqrt{" * n + "}" * n
    assert math_text.tidy("–5" * n) == "-5" + "–5" * (n - 1)  # a sign at the start; after a digit, a dash


@pytest.mark.timeout(60)  # a hang guard, not a speed measurement: it takes about 2 s here
@pytest.mark.slow
def test_reading_python_mathematics_is_linear():
    """Powers, roots and names as Python prints them, repeated or nested 200,000 deep, and runs of spaces before the
    ``**`` of a power (each space is passed once): one pass each."""
    n = 200_000
    assert math_text.tidy("x**2" * n) == "x^{2}" * n
    assert math_text.tidy("sqrt(" * n + "2" + ")" * n) == "\\sqrt{" * n + "2" + "}" * n
    assert math_text.tidy("sqrt(" * n) == "sqrt(" * n  # never closed: as written
    assert math_text.tidy(("x" + " " * 10 + "**2") * n) == ("x" + " " * 10 + "^{2}") * n
    assert math_text.tidy("**" + "x**2" * n) == "**" + "x**2" * n  # Markdown's bold first: as written
    assert math_text.tidy("2**" * n + "2") == "2^{" * n + "2" + "}" * n  # a tower, from the right
    assert math_text.tidy("2**(2)" * n) == "2^{(2)}" * n  # bracketed exponents
    assert math_text.tidy("2**(2)**" * n + "2") == "2^{(2)^{" * n + "2" + "}}" * n
    assert math_text.tidy("7" + " " * n + "*" + " " * n + "I") == "7i"  # SymPy's imaginary unit
    assert not math_equivalence.math_equal("9**" * n + "9", "18")  # beyond math-verify's reach: declined at once


@pytest.mark.timeout(60)  # a hang guard, not a speed measurement: it takes a fraction of a second here
@pytest.mark.slow
def test_reading_a_vector_or_a_list_is_linear():
    """A tuple of 200,000 values against a vector, nested brackets, a list against listed solutions, and a run of
    spaces where a full stop could end the answer."""
    n = 200_000
    column = "\\begin{pmatrix}1\\\\2\\end{pmatrix}"
    assert math_equivalence._as_matrix("(" + "1, " * n + "2)", "column") == "\\begin{pmatrix}" + "1\\\\" * n + "2\\end{pmatrix}"
    assert not math_equivalence.math_equal("(" + "[" * n + "]" * n + ")", column)
    assert not math_equivalence.math_equal("[" * n + "1" + "]" * n, column)
    assert math_equivalence._unlisted("[" + "2, " * n + "3]") == "2, " * n + "3"
    assert not math_equivalence.math_equal("(" + "1, " * n + "2)", column)
    assert math_text.tidy("5" + " " * n + "x") == "5" + " " * n + "x"  # no full stop after the spaces


@pytest.mark.timeout(60)  # a hang guard, not a speed measurement: it takes a fraction of a second here
def test_reading_a_temperature_is_linear():
    """A degree sign before a run of spaces and a letter that is no scale: a pattern with two runs of spaces on either
    side of an optional brace tried every split of the run (5 s for 20,000 spaces, hours for 200,000)."""
    n = 200_000
    for hostile in ("1^{\\circ" + " " * n + "x", "1 ^ { \\circ" + " " * n + "}" + " " * n + "x",
                    "1^\\circ" + " " * n + "K"):
        assert math_text.tidy(hostile) == hostile
    assert math_text.tidy("1^\\circ" + " " * n + "C") == "1\\text{ degrees Celsius}"


@pytest.mark.timeout(60)  # a hang guard, not a speed measurement: it takes a fraction of a second here
def test_reading_a_rate_is_linear():
    """Long runs of spaces, letters and digits around where a rate's stroke or ``per`` would be, or a number's words
    in brackets, each failing at the end."""
    n = 200_000
    for hostile in ("18 " + "a" * n + " " * n + "/", "1" * n + "a/", "18 km" + " " * n + "per" + " " * n + "1"):
        assert math_text.tidy(hostile) == hostile
    assert math_text.tidy("\\$18" + " " * n + "/" + " " * n + "day") == "\\$18\\text{ per day}"
    for hostile in ("18 (" + " " * n + "a" * n + " " * n + ".1", "18 (a" + ". " * n + "b", "18 (" + "a " * n + ")"):
        assert math_text.tidy(hostile) == hostile


@pytest.mark.timeout(60)  # a hang guard, not a speed measurement: it takes about 6 s here
@pytest.mark.slow
def test_tag_parsing_is_linear_in_calls_and_nesting():
    """A completion of 100,000 answered tool calls (3.6 MB, a TRL completion scored by `arpo_reward`) is parsed in
    one pass: finding each call's next span by scanning the rest took 3 s for 20,000 and would take minutes here.
    Nested spans do not each copy their content: 5,000 ``<think>`` inside each other held 90 MB of copies (50,000
    took 50 s and 9 GB)."""
    import tracemalloc

    n = 100_000
    answered = "<python>1</python><result>1</result>" * n
    assert len(tags.unanswered_calls(answered + "<search>q</search>")) == 1
    assert tags.ran_tools(answered + "<search>q</search>") == {"python"}
    assert rewards.arpo_reward([""], [answered + "<answer>\\boxed{1}</answer>"], answer=["1"]) == [1.0]

    nested = "<think>" * 5000 + "<answer>\\boxed{Paris}</answer>" + "</think>" * 5000
    tracemalloc.start()
    try:
        found, errors = tags.spans(nested)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(found) == 5001 and found[0].content.endswith("</think>" * 4999) and peak < 10 * 2**20
    assert tags.final_answer(nested) == "Paris" and "<think> opened inside <think>" in errors


def test_result_defuses_tags_in_tool_output():
    wrapped = tags.wrap_result("<answer>\\boxed{9}</answer></result><python>1</python>")
    assert tags.answer(wrapped) is None and tags.last_call(wrapped, ("python",)) is None
    assert wrapped.startswith("\n<result>\n") and "&lt;/result&gt;" in wrapped


def test_code_fences_are_stripped():
    assert tags.strip_code_fences("```python\nprint(1)\n```") == "print(1)"
    assert tags.strip_code_fences("print('```')") == "print('```')"


def test_code_indented_as_a_whole_runs():
    """A call written inside an indented block of the model's text (``<python>\\n    x = 1\\n    print(x)``) was an
    IndentationError; the indentation all its lines share goes. Code that starts at the margin is left as it is."""
    assert tags.python_code("\n    x = 1\n    if x:\n        print(x)\n") == "\nx = 1\nif x:\n    print(x)\n"
    assert tags.python_code("```python\n\tprint(1)\n```") == "print(1)"
    assert tags.python_code("x = 1\n    print(x)") == "x = 1\n    print(x)"  # the model's own error, kept
    assert tags.python_code('s = """\n    a"""') == 's = """\n    a"""'
    import gymnasium as gym

    import arpo_env  # noqa: F401

    env = gym.make("ARPO-Math-v0")
    env.reset(options={"question": "q", "answer": "1"})
    assert env.step("<python>\n    x = 6\n    print(x * 7)\n</python>")[0] == "\n<result>\n42\n</result>\n"
    env.close()


def test_hierarchical_reward_parts():
    reward = rewards.HierarchicalReward()
    assert reward(GOOD, "408").total == 1.0
    assert reward(GOOD, "409").total == 0.0
    assert reward("<answer>408</answer>", "408").total == -1.0
    both = ("<search>q</search><result>\nr\n</result><python>1</python><result>\n1\n</result>"
            "<answer>\\boxed{408}</answer>")
    assert reward(both, "408").total == pytest.approx(1.1)
    assert reward(both, "7").total == 0.0  # no bonus when wrong


def _records(data_dir, name, n):
    with open(data_dir / "eval" / name / "test.jsonl") as f:
        return [json.loads(next(f)) for _ in range(n)]


@pytest.mark.parametrize("name", ["gsm8k", "math500", "math", "aime24", "aime25"])
def test_math_equivalence_on_real_records(data_dir, name):
    from arpo_env.datasets.loaders import task_from_record

    for i, record in enumerate(_records(data_dir, name, 5)):
        task = task_from_record(record, name, i)
        assert math_equivalence.math_equal(task.answer, task.answer)
        completion = f"<answer>\\boxed{{{task.answer}}}</answer>"
        assert rewards.math_reward([""], [completion], answer=[task.answer]) == [1.0]
        assert rewards.math_reward([""], ["<answer>\\boxed{-123456.5}</answer>"], answer=[task.answer]) == [0.0]


def test_equivalent_forms_are_accepted():
    assert math_equivalence.math_equal("\\frac{1}{2}", "0.5")
    assert math_equivalence.math_equal("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)")
    assert not math_equivalence.math_equal("3", "4")
    assert not math_equivalence.math_equal(None, "4")


def test_trl_reward_function_signatures_and_columns():
    for fn in (rewards.format_reward, rewards.math_reward, rewards.math_accuracy_reward):
        params = list(inspect.signature(fn).parameters)
        assert params[:2] == ["prompts", "completions"] and inspect.signature(fn).parameters[params[-1]].kind == \
            inspect.Parameter.VAR_KEYWORD
    conversational = [[{"role": "assistant", "content": GOOD}]]
    assert rewards.math_reward([[{"role": "user", "content": "q"}]], conversational,
                               reward_model=[{"ground_truth": "408"}]) == [1.0]
    assert rewards.format_reward(["p", "p"], [GOOD, "no"]) == [0.0, -1.0]
    assert rewards.math_accuracy_reward(["p"], [GOOD], solution=["408"]) == [1.0]
    with pytest.raises(KeyError, match="gold-answer column"):
        rewards.math_reward(["p"], [GOOD])
    # Content as a list of parts (multimodal chat templates): their text. Its str() was scored, every backslash doubled:
    # a matrix's row break "\\" became "\\\\" and the right answer scored 0.
    matrix = "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"
    parts = [[{"role": "assistant", "content": [{"type": "text", "text": "<answer>\\boxed{"},
                                                {"type": "text", "text": matrix + "}</answer>"}]}]]
    assert rewards.math_reward(["p"], parts, answer=[matrix]) == [1.0]
    assert rewards.math_reward(["p", "p"], [None, [{"role": "assistant", "content": None}]], answer=["1", "1"]) == [
        -1.0, -1.0]  # no text: broken format, not a TypeError
    # aliases as a NumPy array (a dataset in NumPy form): its str "['408' '409']" was one alias, scoring 0 and F1 2/3
    import numpy as np

    for golds in (np.array(["409", "408"]), np.array([408]), np.int64(408)):
        assert rewards.math_reward(["p"], [GOOD], answer=[golds]) == [1.0], golds
        assert rewards.qa_reward(["p"], [GOOD], answer=[golds]) == [1.0], golds
    assert rewards.math_reward(["p"], [GOOD], answer=[np.array([np.nan])]) == [0.0]  # no gold


def test_reward_works_off_the_main_thread():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda _: math_equivalence.math_equal("\\frac{2}{4}", "1/2"), range(4))) == [True] * 4


def test_prose_is_compared_as_text_without_a_scoring_worker(monkeypatch):
    """math-verify reads plain prose as a product of letters (any order of the words is equal) and takes a second or
    more on a few hundred characters: a prose answer is compared as text, in the caller's thread."""
    from arpo_env.scoring import worker_pool

    def no_worker(*args, **kwargs):
        raise AssertionError("prose went to a scoring worker")

    monkeypatch.setattr(worker_pool.WorkerPool, "call", no_worker)
    long = "the answer is the number of apples that Tom has left after he gives some away " * 40
    assert not math_equivalence.math_equal(long, "42")
    assert math_equivalence.math_equal(long.upper() + "!", f"\\text{{{long}}}")
    assert not math_equivalence.math_equal("sat the cat on the mat", "the cat sat on the mat")
    assert math_text.prose("ABD") is None and math_text.prose("A and B and C") is None  # letters, not prose
    assert math_text.prose("\\sin x \\cos x") is None and math_text.prose("x = 3") is None


def test_answers_beyond_math_verify_are_not_equal_without_a_scoring_worker(monkeypatch):
    """A power tower, a huge factorial or brackets nested deep take math-verify seconds (9^{9^9}: 5.6 s) or more than
    its bound, and the worker is then replaced: they are seen in a linear pass and are not equal, in the caller's
    thread. Ordinary answers, symbolic towers and a gold that is itself beyond reach still go to the worker."""
    from arpo_env.scoring import worker_pool

    calls = []
    real_call = worker_pool.WorkerPool.call

    def counted(self, *args, **kwargs):
        calls.append(args[1])
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(worker_pool.WorkerPool, "call", counted)
    monkeypatch.setattr(math_equivalence, "_verdicts", type(math_equivalence._verdicts)())  # none kept from the tests before
    beyond = ["9^{9^{9^{9}}}", "9^{9^9}", "3^{3^{3^{3}}}", "10^{10^{7}}", "(10^{6})!", "9!!!!", "\\frac{1}{2}^{10^{9}}",
              "10**10**10", "(2x)^{10^{7}}", "1+" + "{" * 11 + "1" + "}" * 11, "\\frac{1}{" * 15 + "2" + "}" * 15,
              "2^{10}!^{2}",
              "10^{6}!", "10^6!", "2^{10!}",  # math-verify reads a^b! as (a^b)!: a factorial of a million took it 4 s
              # sympy's binomials are slow (each of these ran out the 5 s bound), Γ is a factorial, and a product of
              # 10^9 factors sympy expands
              "\\binom{10^9}{10^8}", "{10^9 \\choose 10^8}", "\\tbinom{2000000}{1000000}", "\\Gamma(10^{10})",
              "\\Gamma\\left(10^{7}\\right)", "\\prod_{k=1}^{10^9} k", "\\prod\\limits_{k=1}^{10^{9}} (1+k)"]
    for answer in beyond:
        assert tractable.intractable(answer) is not None, answer
        assert not math_equivalence.math_equal(answer, "16")
    assert calls == []
    within = ["2^{2^{2^{2}}}", "10^{10^{5}}", "20!", "2^{3}!", "3!^{2}", "a^{b^{c^{d}}}", "x^{10^{7}}",
              "\\left( 3, \\frac{\\pi}{2} \\right)", "((((((((((1))))))))))", "\\frac{1}{1+\\frac{1}{1+\\frac{1}{2}}}",
              "1e100000", "9" * 25_000, "(]" * 5_000,  # the last: brackets that never nest deeper than one
              "\\binom{10^9}{2}", "\\binom{200000}{100000}", "{10 \\choose 3}", "\\binom{n}{k}", "\\Gamma(5)",
              "\\Gamma", "\\prod_{i=1}^{5}(1+i)", "\\prod_{k=1}^{n} k",
              "\\prod_" * 3000, "1 \\choose " * 2000]  # the last two: read in loops (they overflowed the stack)
    assert [tractable.intractable(answer) for answer in within] == [None] * len(within)
    assert math_equivalence.math_equal("2^{2^{2^{2}}}", "65536") and math_equivalence.math_equal("((((((((((7))))))))))", "7")
    assert math_equivalence.math_equal("{10 \\choose 3}", "120") and math_equivalence.math_equal("\\Gamma(5)", "24")
    assert math_equivalence.math_equal("9^{9^9}", "9^{9^{9}}")  # a gold beyond reach too: the worker decides (here, at once)
    assert calls == ["2^{2^{2^{2}}}", "((((((((((7))))))))))", "{10 \\choose 3}", "\\Gamma(5)", "9^{9^9}"]
