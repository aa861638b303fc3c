r"""Scoring, case by case: what `arpo eval` extracts and scores, and what the training reward gives, on answers to
items of the shipped benchmarks — exact, reformatted, partly right, wrong, broken format, ``\text{}``, intervals,
lists, Chinese, HLE letters. Every row states the expected score."""

from __future__ import annotations

import json

import pytest

from arpo_algo.cli.eval.benchmarks import BENCHMARKS
from arpo_algo.cli.eval.runner import score_sample
from arpo_env import rewards
from arpo_env.scoring import math_text
from arpo_env.tags import eval_answer, wrap_result

A = "<answer>\\boxed{{{}}}</answer>"  # a well-formed final answer
R = "\n<result>\n{}\n</result>\n"  # a tool result, as the env writes it


def answer(text: str) -> str:
    return A.format(text)


def load(name: str, data_dir) -> list[dict]:
    return [json.loads(line) for line in open(data_dir / "eval" / name / "test.jsonl", encoding="utf-8")]


# (benchmark, gold, transcript, expected eval score) — golds as the shipped files have them --------------------------
MATH = [
    # intervals and lists are the answer itself: never split into aliases
    ("math", "[-2,0]", answer("[-2,0]"), 1.0),
    ("math", "[-2,0]", answer("[-2, 0]"), 1.0),
    ("math", "[-2,0]", answer("0"), 0.0),
    ("math", "[-2,0]", answer("-2"), 0.0),
    ("math", "[-2,0]", answer("(-2,0)"), 0.0),
    ("math500", "(3,4]", answer("(3,4]"), 1.0),
    ("math500", "(3,4]", answer("(3,4)"), 0.0),
    ("math500", "(3,4]", answer("4"), 0.0),
    ("math500", "(2,\\infty)", answer("(2, \\infty)"), 1.0),
    ("math500", "(2,\\infty)", answer("[2,\\infty)"), 0.0),
    ("math500", "(-\\infty, 0]", answer("(-\\infty,0]"), 1.0),
    ("math500", "(-\\infty, 0]", answer("0"), 0.0),
    ("math500", "(15,-29)", answer("(15,-29)"), 1.0),
    ("math500", "(15,-29)", answer("(15, -29)"), 1.0),
    ("math500", "(15,-29)", answer("(-29,15)"), 0.0),
    ("math500", "(15,-29)", answer("15"), 0.0),
    ("math500", "(6,31,-1)", answer("(6, 31, -1)"), 1.0),
    ("math500", "(6,31,-1)", answer("(6, 31, 1)"), 0.0),
    ("math500", "\\left( 3, \\frac{\\pi}{2} \\right)", answer("(3, \\pi/2)"), 1.0),
    ("math500", "\\left( 3, \\frac{\\pi}{2} \\right)", answer("(3, \\pi)"), 0.0),
    ("math500", "x \\in [-2,7]", answer("[-2,7]"), 1.0),
    ("math500", "x \\in [-2,7]", answer("7"), 0.0),
    ("math500", "(-\\infty, 2) \\cup (3, \\infty)", answer("(-\\infty,2)\\cup(3,\\infty)"), 1.0),
    ("math500", "(-\\infty, 2) \\cup (3, \\infty)", answer("(3,\\infty)"), 0.0),
    ("math", "[1, -1+j, 1, -1-j]", answer("[1, -1+j, 1, -1-j]"), 1.0),
    ("math", "[1, -1+j, 1, -1-j]", answer("1"), 0.0),
    # numbers, reformatted
    ("gsm8k", "18", answer("18"), 1.0),
    ("gsm8k", "18", answer("18.0"), 1.0),
    ("gsm8k", "18", answer("\\$18"), 1.0),
    ("gsm8k", "18", answer("17"), 0.0),
    ("gsm8k", "70000", answer("70,000"), 1.0),
    ("gsm8k", "70000", answer("7000"), 0.0),
    ("math500", "10,\\!080", answer("10080"), 1.0),
    ("math500", "10,\\!080", answer("10\\,080"), 1.0),  # digits grouped by a LaTeX thin space
    ("math500", "10,\\!080", answer("10\\;080"), 1.0),
    ("math500", "10,\\!080", answer("10\\,08"), 0.0),
    ("gsm8k", "70000", answer("70\\,000"), 1.0),
    ("gsm8k", "18", answer("18."), 1.0),  # a sentence's full stop inside the box
    ("gsm8k", "18", answer("18 cookies"), 1.0),  # a unit that math-verify's list lacks
    ("gsm8k", "18", answer("18 dollars"), 1.0),
    ("gsm8k", "18", answer("18 years old"), 1.0),
    ("gsm8k", "18", answer("19 cookies"), 0.0),
    ("gsm8k", "18", answer("18 oz"), 1.0),  # a unit math-verify read as letters (18·o·z)
    ("gsm8k", "70000", answer("70,000 dollars"), 1.0),  # grouped digits before a unit: math-verify read a tuple
    ("gsm8k", "70000", answer("x = 70,000"), 1.0),  # and after a variable
    ("gsm8k", "70000", answer("x = 70,001"), 0.0),
    ("math500", "5", answer("\\displaystyle\\text{5 cm}"), 1.0),  # a style kept the \text{} from being peeled
    ("math500", "15\\mbox{ cm}^2", answer("15 cm^2"), 1.0),
    ("math500", "15\\mbox{ cm}^2", answer("15 square centimeters"), 1.0),
    ("math500", "5.4 \\text{ cents}", answer("5.4 dollars"), 0.0),  # another unit: math-verify dropped both
    ("math500", "5.4 \\text{ cents}", answer("\\$5.4"), 0.0),
    ("math500", "5.4 \\text{ cents}", answer("5.4¢"), 1.0),
    ("math500", "\\$18.40", answer("18.40 dollars"), 1.0),
    ("math500", "18\\text{ hours}", answer("18 minutes"), 0.0),
    ("math500", "18\\text{ hours}", answer("18 hrs"), 1.0),
    ("math500", "\\frac{270}7\\text{ degrees}", answer("\\frac{270}{7}^\\circ"), 1.0),
    ("math500", "\\frac{270}7\\text{ degrees}", answer("\\frac{270}{7} radians"), 0.0),
    ("math500", "45\\text{ mph}", answer("45 miles per hour"), 1.0),
    ("math500", "45\\text{ mph}", answer("45 km/h"), 0.0),
    ("math500", "500 \\, \\mathrm{g}", answer("500 kg"), 0.0),
    ("math500", "25\\%", answer("25^\\circ"), 0.0),
    ("math500", "3s^2", answer("3 s^2"), 1.0),  # one letter may be a variable: as before
    ("math500", "2\\pi", answer("2 pi"), 1.0), ("gsm8k", "2", answer("2 pi"), 0.0),  # π, not a unit
    ("gsm8k", "18", answer("１８"), 1.0),  # full-width digits
    ("math500", "\\frac{1}{2}", answer("１／２"), 1.0),
    ("math500", "102", answer("10²"), 0.0),  # not NFKC's 102, but 100 (below)
    ("math500", "20", answer("2\\binom{5}{2}"), 1.0),  # math-verify did not read a number times a binomial
    ("math500", "20", answer("2 \\dbinom{5}{2}"), 1.0),
    ("math500", "20", answer("2\\binom{5}{3}+1"), 0.0),
    ("math500", "10", answer("\\sum\\limits_{k=1}^{4} k"), 1.0),  # nor \limits, which is only layout
    ("math500", "24", answer("\\prod\\limits_{k=1}^{4} k"), 1.0),
    ("gsm8k", "18", answer("\\$18."), 1.0),
    # what wraps a whole answer and only marks it up
    ("math500", "10,\\!080", answer("\\(10,\\!080\\)"), 1.0),  # math-verify read no number inside \( \)
    ("math500", "(6,31,-1)", answer("{(6,31,-1)}"), 1.0),  # a bare group: math-verify read a set of one tuple
    ("math500", "(6,31,-1)", answer("{(6,31,1)}"), 0.0),
    ("math500", "3\\sqrt{13}", answer("\\mathbf{3\\sqrt{13}}"), 1.0),
    ("math500", "3\\sqrt{13}", answer("\\boldsymbol{\\sqrt{117}}"), 1.0),
    ("math500", "p - q", answer("\\textbf{p - q}"), 1.0),
    ("math500", "\\text{east}", answer("\\textbf{east}"), 1.0),
    ("math500", "\\text{east}", answer("\\textbf{west}"), 0.0),
    ("gsm8k", "18", answer("**18**"), 1.0),
    ("math500", "120", answer("{10 \\choose 3}"), 1.0),  # a group that delimits \choose stays
    ("math500", "6 - 5i", answer("\\text{6 - 5i}"), 1.0),  # \text{} around mathematics
    ("math500", "\\text{east}", answer("\\mathrm{east}"), 1.0),
    ("math500", "10,\\!080", answer("10,\\!080\\quad"), 1.0),  # spacing at the end
    ("math500", "90^\\circ", answer("90°"), 1.0),  # the degree sign
    ("math500", "90^\\circ", answer("90\\degree"), 1.0),
    ("math500", "90^\\circ", answer("91°"), 0.0),
    ("gsm8k", "18", answer("17."), 0.0),
    ("gsm8k", "70000", answer("7e4"), 1.0),  # a float as Python prints it
    ("gsm8k", "70000", answer("70000.0e+00"), 1.0),
    ("gsm8k", "70000", answer("7e3"), 0.0),
    ("math500", "\\frac{1}{2}", answer("5e-01"), 1.0),
    ("math500", "\\frac{1}{2}", answer("5e-02"), 0.0),
    ("math500", "58,500", answer("58500"), 1.0),
    ("math500", "58,500", answer("5850"), 0.0),
    ("aime24", "204", answer("204"), 1.0),
    ("aime24", "204", answer("0204"), 1.0),
    ("aime24", "204", answer("240"), 0.0),
    ("math500", "\\frac{1}{2}", answer("0.5"), 1.0),
    ("math500", "\\frac{1}{2}", answer("1/2"), 1.0),
    ("math500", "\\frac{1}{2}", answer("\\dfrac12"), 1.0),
    ("math500", "\\frac{1}{2}", answer("\\frac{1}{3}"), 0.0),
    ("math500", "2\\sqrt{3}", answer("\\sqrt{12}"), 1.0),
    ("math500", "2\\sqrt{3}", answer("3\\sqrt{2}"), 0.0),
    ("math500", "\\frac{270}7\\text{ degrees}", answer("\\frac{270}{7}"), 1.0),
    ("math500", "5.4 \\text{ cents}", answer("5.4"), 1.0),
    ("math500", "\\text{(C)}", answer("C"), 1.0),
    ("math500", "\\text{Evelyn}", answer("\\text{Evelyn}"), 1.0),
    ("math500", "\\text{east}", answer("\\text{west}"), 0.0),
    ("math500", "(a+5)(b+2)", answer("(b+2)(a+5)"), 1.0),
    ("math500", "(a+5)(b+2)", answer("(a+2)(b+5)"), 0.0),
    # prose is text, not a product of letters; short letter strings stay math-verify's
    ("math500", "\\text{no real solutions}", answer("no real solutions"), 1.0),
    ("math500", "\\text{no real solutions}", answer("\\text{No real solutions.}"), 1.0),
    ("math500", "\\text{the cat sat on the mat}", answer("the mat sat on the cat"), 0.0),
    ("math500", "\\text{the cat sat on the mat}", answer("on the mat the cat sat"), 0.0),
    ("math", "the cat sat on the mat", answer("on the mat the cat sat"), 0.0),
    ("math", "the cat sat on the mat", answer("The cat sat on the mat."), 1.0),
    ("math500", "42", answer("the answer is forty two"), 0.0),
    ("math500", "\\text{(C)}", answer("\\text{C}"), 1.0),
    ("math500", "ABD", answer("DBA"), 1.0),
    # one word against a gold written as text: articles, case and punctuation aside
    ("math500", "\\text{ellipse}", answer("an ellipse"), 1.0),
    ("math500", "\\text{ellipse}", answer("\\text{Ellipse.}"), 1.0),
    ("math500", "\\text{ellipse}", answer("parabola"), 0.0),
    ("math500", "\\text{even}", answer("even."), 1.0),
    ("math500", "\\text{even}", answer("odd"), 0.0),
    ("math500", "\\text{east}", answer("seat"), 0.0),
    # extraction: the final answer wherever it is, never one inside a tool result
    ("math500", "7", "The answer is \\boxed{7}.", 1.0),
    ("math500", "7", "first \\boxed{3}, then \\boxed{7}", 1.0),
    ("math500", "7", "<python>print(7)</python>" + R.format("\\boxed{7}") + "so it is 6", 0.0),
    ("math500", "7", "<python>print(1)</python>" + R.format("<answer>\\boxed{7}</answer>") + answer("8"), 0.0),
    ("math500", "7", answer("3") + " and later " + answer("7"), 1.0),
    ("math500", "7", "<answer>7</answer>", 1.0),
    ("math500", "7", "I think it is 7", 0.0),
    ("math500", "7", "", 0.0),
    ("math500", "7", "<answer>\\boxed{7</answer>", 0.0),
    ("math500", "7", "<think>hmm \\boxed{7}</think>", 1.0),
    # a price in another currency is its number, and not one in dollars; cents are not dollars, written ¢ too
    ("gsm8k", "1200", answer("€1,200"), 1.0), ("gsm8k", "5", answer("£5"), 1.0), ("gsm8k", "300", answer("¥300"), 1.0),
    ("gsm8k", "1200", answer("USD 1200"), 1.0), ("math500", "1200\\text{ dollars}", answer("€1200"), 0.0),
    ("math500", "18\\text{ dollars}", answer("18¢"), 0.0), ("math500", "18\\text{ cents}", answer("18¢"), 1.0),
    ("gsm8k", "-5", answer("-€5"), 1.0), ("gsm8k", "5", answer("-€5"), 0.0),
    ("math500", "\\emptyset", answer("\\varnothing"), 1.0), ("math500", "\\varnothing", answer("\\emptyset"), 1.0),
    ("math500", "\\{1\\}", answer("\\varnothing"), 0.0),
    # a mixed number in plain text, and digits grouped by spaces, were no number at all
    ("gsm8k", "2.5", answer("2 1/2"), 1.0), ("math500", "\\frac{5}{2}", answer("2 1/2"), 1.0),
    ("gsm8k", "1", answer("2 1/2"), 0.0), ("gsm8k", "1200", answer("1 200"), 1.0), ("gsm8k", "200", answer("1 200"), 0.0),
    # other numbers side by side were their sum (whole ones) or product (decimals): they are a list
    ("gsm8k", "12", answer("3 4 5"), 0.0), ("math500", "8", answer("3 5"), 0.0), ("gsm8k", "7", answer("3.5 2"), 0.0),
    ("math500", "3, 5", answer("3 5"), 1.0), ("math500", "3, 5", answer("3 6"), 0.0),
    # TeX's tie is a space: neither answer was read
    ("math500", "16", answer("16~\\text{cm}^{2}"), 1.0), ("math500", "5", answer("x~=~5"), 1.0),
    ("math500", "16", answer("17~\\text{cm}^{2}"), 0.0),
    # Unicode's mathematics, which math-verify read none of: roots, superscripts, fractions, infinity
    ("math500", "2\\sqrt{2}", answer("2√2"), 1.0), ("math500", "\\sqrt{x+1}", answer("√(x+1)"), 1.0),
    ("math500", "2\\sqrt{3}", answer("√12"), 1.0), ("math500", "\\sqrt[3]{2}", answer("∛2"), 1.0),
    ("math500", "2\\sqrt{2}", answer("2√3"), 0.0), ("math500", "x^2+1", answer("x²+1"), 1.0),
    ("math500", "\\frac{1}{1000}", answer("10⁻³"), 1.0), ("math500", "x^3+1", answer("x²+1"), 0.0),
    ("gsm8k", "2.5", answer("2½"), 1.0), ("math500", "\\frac34", answer("¾"), 1.0), ("gsm8k", "2", answer("2½"), 0.0),
    ("math500", "(-\\infty, 3)", answer("(-∞, 3)"), 1.0), ("math500", "(-\\infty, 3]", answer("(-∞, 3)"), 0.0),
    ("math500", "\\sqrt{\\pi}", answer("√π"), 1.0), ("math500", "\\frac{\\sqrt{2}}{2}", answer("√2/2"), 1.0),
    ("math500", "100", answer("10²"), 1.0), ("gsm8k", "18", answer("≈18"), 1.0),
    # a multiple-choice option's letter: named with the option's text, or in words
    ("math500", "\\text{(C)}", answer("(C) Parabola"), 1.0),
    ("math500", "\\text{(C)}", answer("\\text{(C) Parabola}"), 1.0),
    ("math", "\\text{(B)}", answer("\\textbf{(B)}\\ 3(1 + r/10)^x = 7"), 1.0),
    ("math", "\\text{(E)}", answer("Option E"), 1.0),
    ("math500", "\\text{(C)}", answer("(D) Ellipse"), 0.0), ("math500", "\\text{(C)}", answer("A parabola"), 0.0),
    ("math500", "\\text{(C)}", answer("C"), 1.0), ("math500", "\\text{(C)}", answer("Parabola"), 0.0),
    ("math500", "\\text{(C)}", answer("(C) or (D)"), 0.0),
    ("math500", "\\text{(C)}", answer("(C) Parabola or (D) Ellipse"), 0.0),
    ("math500", "\\text{(C)}", answer("C D"), 0.0), ("math500", "\\text{(A)}", answer("A B C D"), 0.0),
    ("math500", "\\text{(C)}", answer("(C) Parabola, not (D) Ellipse"), 1.0),
    # an AMC option's mark before its value, as AoPS's solutions box it, where the gold is the value
    ("math", "12", answer("\\textbf{(B) }12"), 1.0), ("math", "\\frac34", answer("\\textbf{(E)}\\ \\frac{3}{4}"), 1.0),
    ("math", "12", answer("\\textbf{(B) }13"), 0.0), ("math", "\\text{(C)}", answer("\\textbf{(B) }12"), 0.0),
    # a number in millions, and a speed in metres a second, were no number
    ("gsm8k", "1200000", answer("\\$1.2 million"), 1.0), ("gsm8k", "18000", answer("18 thousand"), 1.0),
    ("gsm8k", "18000", answer("18 million"), 0.0), ("gsm8k", "18", answer("18 m/s"), 1.0),
    ("math500", "18\\text{ km/h}", answer("18 m/s"), 0.0),
    # an inequality is the interval it describes (math-verify's allow_set_relation_comp)
    ("math500", "(3,\\infty)", answer("x > 3"), 1.0), ("math500", "[-2,0]", answer("-2 \\le x \\le 0"), 1.0),
    ("math500", "(3,\\infty)", answer("x \\geq 3"), 0.0), ("math500", "(3,\\infty)", answer("x < 3"), 0.0),
    # a repeating decimal is its fraction
    ("math500", "\\frac{1}{3}", answer("0.\\overline{3}"), 1.0),
    ("math500", "\\frac{137}{110}", answer("1.2\\overline{45}"), 1.0),
    ("math500", "0.\\overline{3}", answer("0.3"), 0.0), ("math500", "\\frac{1}{3}", answer("0.\\overline{6}"), 0.0),
    # a rate was a quotient of letters; a quotient stays one
    ("gsm8k", "18", answer("\\$18/day"), 1.0), ("gsm8k", "18", answer("18 km per hour"), 1.0),
    ("gsm8k", "18", answer("18 miles/hour"), 1.0), ("gsm8k", "18", answer("18 eggs/day"), 1.0),
    ("gsm8k", "18", answer("\\$18/person"), 1.0), ("gsm8k", "18", answer("18/day"), 1.0),
    ("math500", "18\\text{ mph}", answer("18 km per hour"), 0.0),
    ("math500", "18\\text{ mph}", answer("18 miles/hour"), 1.0),
    ("gsm8k", "18", answer("18/x"), 0.0), ("gsm8k", "2", answer("2 abc/def"), 0.0),
    ("math500", "\\frac{2abc}{def}", answer("2 abc/def"), 1.0),
    # words in brackets after a number were a product with letters; a variable stays one
    ("gsm8k", "18", answer("18 (dollars)"), 1.0), ("gsm8k", "18", answer("18 (approx.)"), 1.0),
    ("gsm8k", "1200", answer("1,200 (in total)"), 1.0), ("math500", "18\\text{ dollars}", answer("18 (cents)"), 0.0),
    ("gsm8k", "18", answer("18 (x)"), 0.0), ("gsm8k", "18", answer("18 (mod 7)"), 0.0),
    # a dash written for a number's sign was no sign; a range stays a range
    ("gsm8k", "-5", answer("–5"), 1.0), ("math500", "(-3,4)", answer("(–3, 4)"), 1.0),
    ("math500", "-\\frac{1}{2}", answer("–\\frac{1}{2}"), 1.0), ("math500", "(-\\infty,3)", answer("(—∞, 3)"), 1.0),
    ("gsm8k", "5", answer("–5"), 0.0), ("gsm8k", "-2", answer("5–7"), 0.0),
    # a comma or a semicolon at the end, as a sentence goes on, or a full stop after a space; an ellipsis stays
    ("gsm8k", "16", answer("16,"), 1.0), ("gsm8k", "16", answer("16;"), 1.0), ("gsm8k", "16", answer("16 ."), 1.0),
    ("math500", "(1,2)", answer("(1,2),"), 1.0), ("math500", "16", answer("16\\;"), 1.0),
    ("math500", "1,2", answer("1, 2, ..."), 0.0),
    # a percentage in words is the fraction it is, as 50\% is
    ("math500", "\\frac{1}{2}", answer("50 percent"), 1.0), ("math500", "0.5", answer("50 per cent"), 1.0),
    ("gsm8k", "50", answer("50 percent"), 1.0), ("math500", "\\frac{1}{2}", answer("40 percent"), 0.0),
    # a percentage is its number, whatever its digits (math-verify: only whole positive ones), and its fraction
    ("math", "12.8\\%", answer("12.8"), 1.0), ("math", "12.8\\%", answer("0.128"), 1.0),
    ("gsm8k", "12.5", answer("12.5\\%"), 1.0), ("gsm8k", "-10", answer("-10\\%"), 1.0),
    ("math", "-10\\%", answer("-10"), 1.0), ("math", "12.8\\%", answer("12.9"), 0.0),
    ("gsm8k", "12.5", answer("13\\%"), 0.0), ("gsm8k", "563.51", answer("563.51 percent"), 1.0),
    # Python's and SymPy's printing, as a model copies it from the interpreter, is LaTeX's (math-verify read 10·p·i)
    ("math500", "10\\pi", answer("10*pi"), 1.0), ("math500", "-\\frac{\\pi}{3}", answer("-pi/3"), 1.0),
    ("math500", "1+\\sqrt{2}", answer("1 + sqrt(2)"), 1.0), ("math500", "(r+5)^2", answer("(r + 5)**2"), 1.0),
    ("math500", "\\sqrt[3]{2}", answer("2**(1/3)"), 1.0), ("math500", "2+7i", answer("2 + 7*I"), 1.0),
    ("math500", "2+7i", answer("(2+7j)"), 1.0), ("math500", "2+7i", answer("2 + 7 * I"), 1.0),
    ("math500", "(-\\infty,3)", answer("(-oo, 3)"), 1.0),
    ("math500", "e^2", answer("exp(2)"), 1.0), ("math500", "x^{10}", answer("x**10"), 1.0),
    ("math500", "x^{10}", answer("x**2"), 0.0), ("math500", "11\\pi", answer("10*pi"), 0.0),
    ("gsm8k", "512", answer("2**3**2"), 1.0), ("gsm8k", "64", answer("2**3**2"), 0.0),  # Python's from the right
    ("gsm8k", "512", answer("2**3**(1+1)"), 1.0), ("gsm8k", "512", answer("2**(3)**2"), 1.0),  # bracketed exponents
    ("gsm8k", "18", answer("**18** apples"), 0.0),  # Markdown's bold, not a power (as before)
    ("math500", "\\frac{1}{3}", answer("Fraction(1, 3)"), 1.0), ("gsm8k", "12.5", answer("np.float64(12.5)"), 1.0),
    ("gsm8k", "12.5", answer("Decimal('12.5')"), 1.0), ("math500", "\\frac{1}{4}", answer("Fraction(1, 3)"), 0.0),
    # a vector or matrix as a tuple, a list or SymPy's Matrix is the matrix (math-verify: a tuple is no matrix)
    ("math", "\\begin{pmatrix} -3 \\\\ 11 \\\\ 7 \\end{pmatrix}", answer("(-3, 11, 7)"), 1.0),
    ("math", "\\begin{pmatrix} 12/13 \\\\ -18/13 \\end{pmatrix}",
     answer("\\left\\langle \\frac{12}{13}, -\\frac{18}{13} \\right\\rangle"), 1.0),
    ("math", "\\begin{pmatrix} 3 & 2 \\\\ 0 & -7 \\end{pmatrix}", answer("Matrix([[3, 2], [0, -7]])"), 1.0),
    ("math", "\\begin{pmatrix} 3 & 2 \\\\ 0 & -7 \\end{pmatrix}", answer("[[3, 2], [0, 7]]"), 0.0),
    ("math", "\\begin{pmatrix} -3 \\\\ 11 \\\\ 7 \\end{pmatrix}", answer("(11, -3, 7)"), 0.0),
    # the solutions as SymPy's solve prints them, where the gold lists them; an interval stays one
    ("math", "2, 3", answer("[2, 3]"), 1.0), ("math", "[2,3]", answer("[2, 3]"), 1.0),
    ("math", "(2,3)", answer("[2, 3]"), 0.0), ("math", "2, 3", answer("[2, 4]"), 0.0),
    # a number in another base as Python prints it or words say it
    ("math", "1011_2", answer("0b1011"), 1.0), ("math", "1F_{16}", answer("0x1f"), 1.0),
    ("math", "17_8", answer("0o17"), 1.0),
    ("math", "4210_{5}", answer("4210 (base 5)"), 1.0), ("math", "1011_2", answer("1011 in base 2"), 1.0),
    ("math", "1011_2", answer("0b1010"), 0.0),
    # a float one ulp off a short decimal, as the interpreter prints binary arithmetic; a long decimal stays itself
    ("gsm8k", "18", answer("18.000000000000004"), 1.0), ("gsm8k", "18", answer("17.999999999999996"), 1.0),
    ("math500", "0.3", answer("0.30000000000000004"), 1.0), ("gsm8k", "19", answer("18.000000000000004"), 0.0),
    ("math500", "\\frac{1}{3}", answer("0.3333333333333333"), 1.0),
    # a full stop after a wrapper kept the wrapper on (the stop went after the wrappers were taken off)
    ("math", "\\text{A,C,F}", answer("\\text{A,C,F}."), 1.0),
    ("math", "\\text{June 20}", answer("\\text{June 20}."), 1.0),
    ("math", "\\text{A,C,F}", answer("\\text{A,C}."), 0.0),
    # a temperature with its degree sign was no number; a degree of either scale is a degree, the scales differ
    ("gsm8k", "18", answer("18°C"), 1.0), ("gsm8k", "-3", answer("-3 °F"), 1.0), ("gsm8k", "18", answer("18℃"), 1.0),
    ("gsm8k", "18", answer("18^\\circ C"), 1.0), ("gsm8k", "18", answer("18^{\\circ}\\text{F}"), 1.0),
    ("gsm8k", "18", answer("19°C"), 0.0), ("math500", "18^\\circ", answer("18°C"), 1.0),
    ("math500", "18^\\circ\\text{ C}", answer("18°F"), 0.0),
    ("math500", "18\\text{ degrees Celsius}", answer("18°"), 1.0),
    ("math500", "18\\text{ degrees Celsius}", answer("18 degrees Fahrenheit"), 0.0),
]

QA = [
    ("hotpotqa", ["Frank Lowy"], answer("Frank Lowy"), 1.0),
    ("hotpotqa", ["Frank Lowy"], answer("frank lowy"), 1.0),
    ("hotpotqa", ["Frank Lowy"], answer("Frank Lowy."), 1.0),
    ("hotpotqa", ["Frank Lowy"], answer("\\text{Frank Lowy}"), 1.0),
    ("hotpotqa", ["Frank Lowy"], answer("\\textbf{Frank Lowy}"), 1.0),
    ("hotpotqa", ["Frank Lowy"], answer("Lowy"), 2 / 3),
    ("hotpotqa", ["Frank Lowy"], answer("Sir Frank Lowy"), 0.8),
    ("hotpotqa", ["Frank Lowy"], answer("John Smith"), 0.0),
    ("hotpotqa", ["Frank Lowy"], "The answer is \\boxed{Frank Lowy}", 1.0),
    ("hotpotqa", ["Frank Lowy"], "Frank Lowy", 0.0),
    ("hotpotqa", ["1.95 m"], answer("1.95 m"), 1.0),
    ("hotpotqa", ["1.95 m"], answer("1.95"), 2 / 3),
    ("hotpotqa", ["1.95 m"], answer("2 m"), 0.5),
    ("hotpotqa", ["yes"], answer("yes"), 1.0),
    ("hotpotqa", ["yes"], answer("Yes."), 1.0),
    ("hotpotqa", ["yes"], answer("no"), 0.0),
    ("hotpotqa", ["yes"], answer("yes it is"), 0.0),
    ("hotpotqa", ["Crystal Dynamics"], answer("the Crystal Dynamics"), 1.0),
    ("hotpotqa", ["Crystal Dynamics"], answer("Crystal"), 2 / 3),
    ("2wiki", ["Essex", "Essex, England"], answer("Essex"), 1.0),
    ("2wiki", ["Essex", "Essex, England"], answer("Essex England"), 1.0),
    ("2wiki", ["Essex", "Essex, England"], answer("England"), 2 / 3),
    ("bamboogle", ["james madison"], answer("James Madison"), 1.0),
    ("bamboogle", ["james madison"], answer("President James Madison"), 0.8),
    ("bamboogle", ["james madison"], answer("Madison"), 2 / 3),
    ("bamboogle", ["Titan IIIE"], answer("Titan IIIE"), 1.0),
    ("bamboogle", ["Titan IIIE"], answer("Titan"), 2 / 3),
    ("bamboogle", ["1999"], answer("1999"), 1.0),
    ("bamboogle", ["1999"], answer("2000"), 0.0),
    ("bamboogle", ["20 June 1837"], answer("20 June 1837"), 1.0),
    ("bamboogle", ["20 June 1837"], answer("June 20, 1837"), 1.0),
    ("bamboogle", ["20 June 1837"], answer("1837"), 0.5),
    ("musique", ["Drifting"], answer("$\\text{Drifting}$"), 1.0),
    ("musique", ["Drifting"], answer("drifting!"), 1.0),
    ("musique", ["Drifting"], answer("Floating"), 0.0),
    # Chinese: each character is a token, and each run of other characters between them
    ("webwalker", "肖亮", answer("肖亮"), 1.0),
    ("webwalker", "肖亮", answer("肖"), 2 / 3),
    ("webwalker", "肖亮", answer("王明"), 0.0),
    ("webwalker", "肖亮", answer("肖亮。"), 1.0),
    ("webwalker", "66 hours", answer("66 hours"), 1.0),
    ("webwalker", "66 hours", answer("66"), 2 / 3),
    ("webwalker", "5 months", answer("five months"), 0.5),
    ("xbench", ["161.27元"], answer("161.27元"), 1.0),
    ("xbench", ["4"], answer("4"), 1.0),
    ("xbench", ["4"], answer("5"), 0.0),
    ("xbench", ["161.27元"], answer("１６１.２７元"), 1.0),  # full-width digits, as Chinese text may write them
    ("xbench", ["2023年"], answer("２０２３年"), 1.0),
    ("xbench", ["iPhone 15手机"], answer("iPhone 15"), 2 / 3),  # shared nothing: characters against words
    ("xbench", ["2023年"], answer("2028年"), 0.5),  # shared 2, 0, 2 and 年
    # extraction for QA
    ("hotpotqa", ["Essex"], "<search>q</search>" + R.format("<answer>\\boxed{Essex}</answer>") + answer("Kent"), 0.0),
    ("hotpotqa", ["Essex"], "<search>q</search>" + R.format("Essex is a county") + answer("Essex"), 1.0),
    ("hotpotqa", ["Essex"], "<answer>Essex</answer>", 1.0),
    ("hotpotqa", ["Essex"], "no answer at all", 0.0),
]

HLE = [  # multiple choice: the option letter, in its usual forms
    ("D", "D", 1.0), ("D", "(D)", 1.0), ("D", "D.", 1.0), ("D", "D. Because of the", 1.0), ("D", "Answer: D", 1.0),
    ("D", "The answer is D", 1.0), ("D", "The answer is (D).", 1.0), ("D", "\\text{D}", 1.0), ("D", "$D$", 1.0),
    ("D", "**D**", 1.0), ("D", "d", 1.0), ("D", "C", 0.0), ("D", "(C)", 0.0), ("D", "The answer is C", 0.0),
    ("E", "Option E", 1.0), ("E", "The correct answer is E", 1.0), ("E", "Everything", 0.0), ("B", "B) 12", 1.0),
    ("B", "none", 0.0),
    # a one-letter word that begins prose is not an option, nor is a hedge between two
    ("I", "I think it is B", 0.0), ("B", "I think it is B", 0.0), ("A", "a dog", 0.0),
    ("A", "The answer is a dog", 0.0), ("D", "D and E", 0.0), ("D", "D Non-elitism", 1.0), ("D", "The answer is D Paris", 1.0),
    ("D", "(D) and (E)", 0.0), ("D", "(D), (E)", 0.0), ("D", "Answer: (D) or E", 0.0), ("D", "(D) and (D)", 1.0),
    ("D", "D E", 0.0), ("A", "A B C D", 0.0), ("A", "(A) (B)", 0.0), ("D", "(D) 12 or (E) 15", 0.0),
    ("D", "D. 12; (E) 15", 0.0), ("D", "D. Both (A) and (B)", 1.0), ("D", "(D) (A) and (C) only", 1.0),
    ("B", "B. Both in (A) and (B)", 1.0), ("D", "D. A pair V = (S, D) where S is a sampler", 1.0),
    # hedges that read as their first letter: letters then a stop, a connective in brackets, a hedging word
    ("D", "D E!", 0.0), ("D", "D E?", 0.0), ("D", "D. E!", 0.0), ("D", "D - E", 0.0), ("D", "D (or E)", 0.0),
    ("D", "D (and E)", 0.0), ("D", "D (maybe E)", 0.0), ("D", "D — or E", 0.0), ("D", "D. Or maybe E.", 0.0),
    ("D", "D and possibly E", 0.0), ("D", "D (also E)", 0.0),
    ("D", "D (not E)", 1.0), ("D", "D. Option A is wrong because", 1.0), ("D", "D - Non-elitism", 1.0),
    # full width, as Chinese text writes letters and brackets
    ("D", "Ｄ", 1.0), ("D", "（D）", 1.0), ("D", "\\boxed{Ｄ}", 1.0), ("D", "＊＊Ｄ＊＊", 1.0), ("D", "Ｃ", 0.0),
    # square brackets, quotes, a letter then "!", "," or ";" (named no option); their hedges still name none
    ("D", "[D]", 1.0), ("D", "Option [D]", 1.0), ("D", '"D"', 1.0), ("D", "The answer is “D”.", 1.0), ("D", "D!", 1.0),
    ("D", "D, as the others fail", 1.0), ("D", "D;", 1.0), ("D", "[D] and [E]", 0.0), ("D", "[D], [E]", 0.0),
    ("D", "D, E", 0.0), ("D", "D; E", 0.0), ("D", "D, and E", 0.0), ("D", "[D] Parabola or [E] Ellipse", 0.0),
    ("D", "[D] Both [A] and [B]", 1.0), ("A", "A's", 0.0), ("D", "D?", 0.0),
    # a lone letter introduced or followed by the usual phrasings; a letter that only begins a sentence is none
    ("A", "A is correct", 1.0), ("D", "D is correct", 1.0), ("A", "A is the answer", 1.0),
    ("A", "A is the correct answer", 1.0), ("D", "My answer: D", 1.0), ("D", "My answer is D", 1.0),
    ("D", "I think the answer is D", 1.0), ("D", "I believe the answer is (D)", 1.0),
    ("D", "The correct option is D", 1.0), ("D", "option D", 1.0), ("D", "I choose option D", 1.0),
    ("C", "D is correct", 0.0), ("I", "I think the answer is D", 0.0), ("A", "A plausible answer is D", 0.0),
    ("A", "A dog is correct", 0.0), ("D", "D is correct or E", 0.0),
]


@pytest.mark.parametrize("bench, gold, transcript, expected", MATH + QA)
def test_eval_scores(bench, gold, transcript, expected):
    task = {"question": "q", "answer": gold, "meta": {}}
    _, score, _, _ = score_sample(BENCHMARKS[bench], transcript, task, judge=None)
    assert score == pytest.approx(expected, abs=1e-6), (bench, gold, transcript, eval_answer(transcript))


@pytest.mark.parametrize("gold, written, expected", HLE)
def test_hle_multiple_choice(gold, written, expected):
    """Through `arpo eval`'s scoring and through the training reward (the deep-search env's scorer)."""
    from arpo_env.scoring.qa_metrics import qa_score

    task = {"question": "q", "answer": gold, "meta": {"answer_type": "multipleChoice"}}
    for transcript in (answer(written), f"<answer>{written}</answer>"):
        _, score, _, _ = score_sample(BENCHMARKS["hle"], transcript, task, judge=None)
        assert score == expected, (gold, transcript)
    parts = rewards.HierarchicalReward(qa_score)(answer(written), gold, task["meta"])
    assert parts.score == expected and parts.scoring_errors == [], (gold, written)


HLE_QUESTION = ("Which condition of Arrhenius's sixth impossibility theorem do critical-level views violate?\n\n"
                "Answer Choices:\nA. Egalitarian Dominance\nB. General Non-Extreme Priority\nC. Non-Elitism\n"
                "D. Weak Non-Sadism\nE. A Weak Quality\nAddition\nF. \\(\\frac{1}{2}\\)")


@pytest.mark.parametrize("gold, written, expected", [
    ("D", "Weak Non-Sadism", 1.0), ("D", "weak non-sadism.", 1.0), ("D", "\\text{Weak Non-Sadism}", 1.0),
    ("C", "Weak Non-Sadism", 0.0), ("E", "A Weak Quality Addition", 1.0), ("A", "A Weak Quality Addition", 0.0),
    ("F", "\\frac{1}{2}", 1.0), ("D", "D", 1.0), ("D", "D. Weak Non-Sadism", 1.0), ("C", "Non", 0.0),
    ("D", "Sadism", 0.0)])
def test_hle_an_options_text_names_it(gold, written, expected):
    """An answer that is the whole text of one option, not its letter, scored 0 ("Weak Non-Sadism" for D), and one
    that starts with an article was read as option A ("A Gaussian blur …"). An option's text runs to the next."""
    task = {"question": HLE_QUESTION, "answer": gold, "meta": {"answer_type": "multipleChoice"}}
    _, score, _, _ = score_sample(BENCHMARKS["hle"], answer(written), task, judge=None)
    assert score == expected, (gold, written)


LISTING_QUESTION = ("Which numbers are prime?\n\nAnswer Choices:\nA. 4\nB. 6\nC. 9\nD. 12 only\nE. 15\nF. A, B, C\n"
                    "G. None of the above")


@pytest.mark.parametrize("gold, written, expected", [
    # an option's letter and its own text, which lists options: read as a hedge between A, B and C
    ("F", "F. A, B, C", 1.0), ("F", "(F) A, B, C", 1.0), ("F", "The answer is F: A, B, C", 1.0),
    ("A", "F. A, B, C", 0.0),
    # two options, each by its letter and its text: a hedge `choice_letter` alone cannot tell from an option's text
    ("D", "D. 12 only or E. 15", 0.0), ("E", "D. 12 only or E. 15", 0.0), ("D", "D) 12 only, or maybe E) 15", 0.0),
    ("D", "D. 12 only, not E. 15", 1.0), ("D", "D. 12 only", 1.0), ("E", "E. 15", 1.0),
    ("D", "D. 12 only, and E. 150 is not an option", 1.0)])
def test_hle_options_named_with_their_text(gold, written, expected):
    """"F. A, B, C" (F's letter and text) scored 0, as "A B C" would; "D. 12 only or E. 15" scored 1 for D."""
    task = {"question": LISTING_QUESTION, "answer": gold, "meta": {"answer_type": "multipleChoice"}}
    _, score, _, _ = score_sample(BENCHMARKS["hle"], answer(written), task, judge=None)
    assert score == expected, (gold, written)


def test_real_hle_items_a_list_gold_is_one_answer_and_options_read_by_their_phrasing(data_dir):
    """HLE's gold ``[11,19,22,23,29,30,31,36]`` is the answer, all of it (it was split into eight aliases, so "11"
    scored 1 and the list 0); multiple-choice items read "X is correct" and "My answer: X". Through `arpo eval` and
    the deep-search env's reward, on the shipped items."""
    import gymnasium as gym

    import arpo_env  # noqa: F401
    from arpo_env.datasets.loaders import load_tasks

    tasks = load_tasks("hle", data_dir / "eval")
    listed = next(t for t in tasks if t.answer == "[11,19,22,23,29,30,31,36]")
    chosen = next(t for t in tasks if t.meta.get("answer_type") == "multipleChoice")
    letter = chosen.answer.strip()[:1]
    other = "B" if letter != "B" else "C"
    cases = [(listed, "[11,19,22,23,29,30,31,36]", 1.0),
             (listed, "11", None), (chosen, f"{letter} is correct", 1.0), (chosen, f"My answer: {letter}", 1.0),
             (chosen, f"I think the answer is {letter}", 1.0), (chosen, f"{other} is correct", 0.0)]
    env = gym.make("ARPO-DeepSearch-v0", dataset="hle", data_dir=str(data_dir / "eval"))
    try:
        for task, written, expected in cases:
            as_task = {"question": task.question, "answer": task.answer, "meta": task.meta}
            _, score, _, errors = score_sample(BENCHMARKS["hle"], answer(written), as_task, judge=None)
            env.reset(options={"index": tasks.index(task)})
            parts = env.step(answer(written))[4]["reward_parts"]
            if expected is None:  # one number of eight: far from the answer, not its alias
                assert score < 0.5 and parts["score"] < 0.5, (written, score, parts)
            else:
                assert score == expected == parts["score"], (written, score, parts)
            assert errors == [] and parts["scoring_errors"] == []
    finally:
        env.close()


def test_hotpotqa_golds_written_as_a_list_are_aliases(data_dir, tmp_path):
    """The multi-hop QA sets document their golds as lists of aliases; a release that writes one as its Python repr
    keeps it a list of aliases there, and only there."""
    from arpo_env.datasets.loaders import load_tasks

    for name in ("hotpotqa", "hle"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "['Frank Lowy', 'Lowy']"}) + "\n")
    assert load_tasks("hotpotqa", tmp_path)[0].answer == ["Frank Lowy", "Lowy"]
    assert load_tasks("hle", tmp_path)[0].answer == "['Frank Lowy', 'Lowy']"


def test_a_bug_in_our_scoring_is_a_counted_error_not_a_wrong_answer(monkeypatch):
    """An exception inside our scoring code (here the math normaliser, made to fail) gives no verdict: the sample
    carries the error, the eval table counts it and leaves it out of pass@1, and the training reward's parts carry
    it (the trainer logs their rate). A timeout likewise; a wrong answer is still 0 with no error."""
    from arpo_algo.cli.eval.report import summarise, table
    from arpo_env.scoring import math_equivalence

    def broken(text):
        raise KeyError("a bug")

    bench = BENCHMARKS["gsm8k"]
    task = {"question": "q", "answer": "18", "meta": {}}
    monkeypatch.setattr(math_equivalence, "tidy", broken)
    _, score, _, errors = score_sample(bench, answer("18"), task, judge=None)
    assert score == 0.0 and len(errors) == 1 and "scoring failed: KeyError" in errors[0]
    parts = rewards.HierarchicalReward()(answer("18"), "18")
    assert parts.format_ok and parts.score == 0 and "scoring failed: KeyError" in parts.scoring_errors[0]
    monkeypatch.undo()
    _, wrong, _, none = score_sample(bench, answer("17"), task, judge=None)
    assert wrong == 0.0 and none == []
    records = [{"run": 0, "score": 1.0, "tool_calls": 1, "scoring_errors": []},
               {"run": 0, "score": 0.0, "tool_calls": 1, "scoring_errors": ["scoring failed: KeyError: 'a bug'"]},
               {"run": 0, "score": 0.0, "tool_calls": 1, "scoring_errors": ["math scoring timed out: 5 s"]},
               {"run": 0, "score": 0.0, "tool_calls": 1}]
    summary = summarise({"gsm8k": records}, runs=1)["gsm8k"]
    assert (summary["scoring_errors"], summary["scoring_timeouts"]) == (1, 1)
    assert summary["pass@1"] == pytest.approx(50.0)  # one right, one wrong; the two without a verdict left out
    md, rows = table({"gsm8k": summary}, [bench], None, "m", 1)
    assert ["scoring errors / timeouts", "1 / 1", ""] in [r[:3] for r in rows]
    assert "1 scoring error and 1 scoring timeout (out of pass@1)" in md


def test_the_math_worker_reports_a_bug_in_our_normaliser_instead_of_not_equal(monkeypatch):
    """`math_equal_unbounded` (what a scoring worker runs) turned every exception into "not equal"; an exception of
    our normaliser now reaches the caller (the worker reports it, and the scoring notes it as an error)."""
    from arpo_env.scoring import math_equivalence

    assert math_equivalence.math_equal_unbounded("18", ["18"]) is True
    monkeypatch.setattr(math_equivalence, "as_latex", lambda text: (_ for _ in ()).throw(KeyError("a bug")))
    with pytest.raises(KeyError):
        math_equivalence.math_equal_unbounded("18", ["18"])


# The training reward: the paper's format gate, the bonus only for tools that ran ----------------------------------
TOOLS = "<search>q</search>" + R.format("Page 1: …") + "<python>print(1)</python>" + R.format("1")
REWARD = [  # (completion, gold, expected math_reward)
    (answer("18"), "18", 1.0),
    (answer("17"), "18", 0.0),
    ("The answer is \\boxed{18}", "18", -1.0),  # no <answer>: the paper's reward gates it
    ("<answer>18</answer>", "18", -1.0),  # no \boxed{}
    (answer("18") + answer("18"), "18", -1.0),  # two answers
    (answer("18") + "<python>print(1)</python>", "18", -1.0),  # a tool call after the answer
    ("<python>print(18)</python>" + R.format("18") + answer("18"), "18", 1.0),
    (TOOLS + answer("18"), "18", 1.1),  # correct with search and python that ran: the bonus
    (TOOLS + answer("17"), "18", 0.0),  # wrong: no bonus
    ("<search>q</search><python>print(1)</python>" + R.format("1") + answer("18"), "18", -1.0),  # search never ran
    ("<search>q</search>" + answer("18"), "18", -1.0),  # tool tags with no result at all
    ("<python>print(1)</python>" + R.format("<search>q</search>") + answer("18"), "18", 1.0),  # not the model's tag
    ("<python>print(1)</python>" + wrap_result("<search>x</search>\n<result>\ny\n</result>") + answer("18"), "18",
     1.0),  # a result that prints tags: the env escapes its </result>, and nothing inside is the model's
    ("<think>ok</think>" + answer("18"), "18", 1.0),
    ("<think>open " + answer("18"), "18", -1.0),  # unclosed think
    ("", "18", -1.0),
    (answer("[-2,0]"), "[-2,0]", 1.0),
    (answer("0"), "[-2,0]", 0.0),
]


@pytest.mark.parametrize("completion, gold, expected", REWARD)
def test_training_reward(completion, gold, expected):
    assert rewards.math_reward(["q"], [completion], answer=[gold]) == [pytest.approx(expected)]


def test_the_reference_think_rule_is_available_by_name():
    plain = answer("18")
    assert rewards.math_reward(["q"], [plain], answer=["18"]) == [1.0]  # the default: <think> not required
    assert rewards.math_reward_strict_think(["q"], [plain], answer=["18"]) == [-1.0]
    assert rewards.math_reward_strict_think(["q"], ["<think>x</think>" + plain], answer=["18"]) == [1.0]
    assert rewards.qa_reward_strict_think(["q"], ["<think>x</think>" + answer("Essex")], answer=[["Essex"]]) == [1.0]


@pytest.mark.parametrize("written, tidied", [
    ("10\\,080", "10080"), ("1\\,234\\,567", "1234567"), ("10~080", "10080"), ("18.", "18"),
    ("\\frac{1}{2}. ", "\\frac{1}{2}"),
    ("1, 2, 3, ...", "1, 2, 3, ..."), ("1\\,2", "1\\,2"), ("10\\,0800", "10\\,0800"), (".", "."), ("x\\,y", "x\\,y"),
    ("1e6", "1\\times10^{6}"), ("-1.5e-05", "-1.5\\times10^{-5}"), ("2.E+03.", "2.\\times10^{3}"),
    ("2e", "2e"), ("e^{2}", "e^{2}"), ("3e2x", "3e2x"), ("x=1e6", "x=1e6"),
    ("2\\binom{5}{2}", "2\\cdot \\binom{5}{2}"), ("(n)\\tbinom{n}{2}", "(n)\\cdot \\tbinom{n}{2}"),
    ("１２，３", "12,3"), ("x²", "x^{2}"),
    ("18 cookies", "18\\text{ cookies}"), ("-1.5 cups of flour", "-1.5\\text{ cups of flour}"), ("2 pi", "2 \\pi"),
    ("3 sqrt", "3 sqrt"), ("4.4 million", "4400000"), ("18 and more", "18 and more"),
    ("x 18 cookies", "x 18 cookies"), ("18 a", "18 a"),
    ("x\\binom{5}{2}", "x\\binom{5}{2}"), ("\\sum\\limits_{k}", "\\sum_{k}"), ("\\limitsx", "\\limitsx"),
    ("\\(5\\)", "5"), ("$$5$$", "5"), ("$5$ and $6$", "$5$ and $6$"), ("{{5}}", "5"), ("{a}{b}", "{a}{b}"),
    ("\\{1,2\\}", "\\{1,2\\}"), ("{n \\choose k}", "{n \\choose k}"), ("**\\mathbf{7}**", "7"),
    ("\\textit{Evelyn}", "\\text{Evelyn}"), ("\\textbf{x+1}", "x+1"), ("\\mathbf{v}+1", "\\mathbf{v}+1"),
    ("\\text{Evelyn}", "\\text{Evelyn}"), ("\\mathrm{6 - 5i}", "6 - 5i"), ("\\quad 5\\,", "5"), ("5\\ ", "5"),
    ("5\\\\,", "5\\\\,"), ("5\\quadx", "5\\quadx"), ("90°", "90^{\\circ}"), ("x\\degree", "x^{\\circ}"),
    ("15 cm^2", "15\\text{ cm}"), ("15 cm²", "15\\text{ cm}"), ("3 oz", "3\\text{ oz}"), ("100cm", "100\\text{ cm}"),
    ("18¢", "18\\text{ ¢}"), ("3s^2", "3s^2"), ("3 s^2", "3 s^2"), ("500H", "500H"), ("2 xy", "2 xy"),
    ("1,200 dollars", "1200\\text{ dollars}"), ("12,345.5 km", "12345.5\\text{ km}"),
    ("1,2000 dollars", "1,2000 dollars"), ("x = 1,000", "1,000"), ("n_{0} = 10{,}080", "10{,}080"),
    ("x = 10,\\!080", "10,\\!080"), ("x = 1,5", "x = 1,5"), ("x = \\$1,000", "\\$1,000"),
    ("x = 1,000 dollars", "1000\\text{ dollars}"), ("x = 1,000, y = 2", "x = 1,000, y = 2"),
    ("x = 1,000 = y", "x = 1,000 = y"), ("x = 5", "x = 5"),
    ("\\displaystyle\\text{5 cm}", "5\\text{ cm}"), ("\\displaystyle \\frac{1}{2}", "\\frac{1}{2}"),
    ("\\textstyle\\sum_{k}", "\\sum_{k}"), ("\\displaystylex", "\\displaystylex"),
    ("16~\\text{cm}^{2}", "16 \\text{cm}^{2}"), ("x~=~5", "x = 5"), ("\\text{Espa\\~{n}a}", "Espa\\~{n}a"),
    ("€1,200", "1200\\text{ €}"), ("£ 5.50", "5.50\\text{ £}"), ("USD 1200", "1200\\text{ USD}"), ("5€", "5\\text{ €}"),
    ("€x", "€x"), ("USD1200", "USD1200"), ("-€5", "-5\\text{ €}"), ("\\varnothing", "\\emptyset"),
    ("\\varnothingx", "\\varnothingx"),
    ("2 1/2", "2\\frac{1}{2}"), ("-3 1/4", "-3\\frac{1}{4}"), ("3 5/4", "3 5/4"), ("1 200", "1200"),
    ("1\u00a0200\u202f000.5", "1200000.5"), ("1 20", "1, 20"), ("1234 567", "1234, 567"),
    ("3.5 2 .5", "3.5, 2, .5"), ("-3 5", "-3, 5"), ("3 -5", "3 -5"), ("3 5x", "3 5x"),
    ("2√2", "2\\sqrt{2}"), ("√ (x+(1))", "\\sqrt{x+(1)}"), ("√(2", "\\sqrt(2"), ("√{2}", "\\sqrt{2}"),
    ("∜x", "\\sqrt[4]{x}"), ("√2.25", "\\sqrt{2.25}"), ("(√3)", "(\\sqrt{3})"), ("x⁻¹", "x^{-1}"), ("10²³", "10^{23}"),
    ("1½", "1\\frac{1}{2}"), ("a·b", "a\\cdot b"), ("(0, ∞)", "(0, \\infty )"), ("2π", "2\\pi"),
    ("√π", "\\sqrt{\\pi}"), ("0.\\overline{3}", "\\frac{1}{3}"), ("-1.2\\overline{45}", "-\\frac{137}{110}"),
    ("\\textbf{(C)}\\ -\\sqrt{2}", "-\\sqrt{2}"), ("(A)-(B)", "(A)-(B)"), ("(B)", "(B)"),
    ("1.2 million", "1200000"), ("\\$ 4 billion", "\\$4000000000"), ("4.4 million people", "4400000\\text{ people}"),
    ("1,500 thousand", "1500000"), ("2 million and 5", "2 million and 5"), ("18 m/s", "18\\text{ m/s}"),
    ("0.\\dot{6}", "\\frac{2}{3}"), ("\\overline{CD}", "\\overline{CD}"), ("0.\\overline{x}", "0.\\overline{x}"),
])
def test_math_answers_lose_only_what_math_verify_misreads(written, tidied):
    assert math_text.tidy(written) == tidied


@pytest.mark.parametrize("written, unit", [
    ("18\\text{ cents}", "cent"), ("5.4 \\text{ cents}", "cent"), ("\\$18", "dollar"), ("-\\$ 5", "dollar"),
    ("15\\mbox{ cm}^2", "cm"), ("99\\pi \\text{ square inches}", "inch"), ("90^{\\circ}", "degree"),
    ("\\frac{270}7\\text{ degrees}", "degree"), ("25\\%", "percent"), ("45\\text{ miles per hour}", "mph"),
    ("25 \\, \\text{km}", "km"), ("500 \\, \\mathrm{g}", "g"), ("17 \\, \\mathrm{m/s}", "m/s"), ("5 m", "m"),
    ("(3+4) h", "h"), ("(a+b)h", None), ("18\\text{ cookies}", None), ("18", None), ("\\text{ cents}", None),
    ("2m+g", None),
    ("12\\text{ and }13", None), ("7200 \\mathrm{MB}", None), ("x" * 10_000 + "5 cm", "cm"),
    ("18\\text{ ¢}", "cent"), ("1200\\text{ €}", "euro"), ("5£", "gbp"), ("300\\text{ yen}", "yen"),
    ("\\$18\\text{ per day}", "dollar"), ("18\\text{ km per hour}", "km/h"), ("18\\text{ eggs per day}", None),
    ("18\\text{ degrees Celsius}", "celsius"), ("18\\text{ degrees F}", "fahrenheit"), ("5\\text{ degrees m}", None),
])
def test_the_unit_an_answer_ends_in(written, unit):
    assert math_text.unit(written) == unit


@pytest.mark.parametrize("reward, written, gold", [
    (rewards.math_reward, "None", None), (rewards.qa_reward, "None", None), (rewards.qa_reward, "nan", float("nan")),
    (rewards.math_reward, "nan", float("nan")), (rewards.qa_reward, "x", []), (rewards.math_reward, "x", []),
    (rewards.qa_reward, "None", [None]), (rewards.qa_reward, "x", "  "),
])
def test_a_row_without_a_gold_answer_has_no_right_answer_and_says_so(reward, written, gold, caplog):
    """A null in the dataset used to be the gold "None" (or "nan"), so that answering it scored 1; an empty alias
    list crashed QA scoring."""
    with caplog.at_level("WARNING", logger="arpo_env.rewards"):
        assert reward(["q", "q"], [answer(written), answer("18")], answer=[gold, "18"]) == [0.0, 1.0]
    assert "1 of 2 rows have no gold answer (rows [0]" in caplog.text


def test_trl_reward_functions_read_the_gold_columns_the_loader_reads():
    """A dataset with GAIA's ``Final answer`` or Bamboogle's ``Answer`` column was a KeyError in the TRL reward
    functions, while `load_tasks` read it."""
    assert rewards.math_reward(["q"], [answer("3")], **{"Final answer": ["3"]}) == [1.0]
    assert rewards.qa_reward(["q"], [answer("Paris")], Answer=["Paris"]) == [1.0]
    with pytest.raises(KeyError, match="Final answer, solution, golden_answers or reward_model"):
        rewards.math_reward(["q"], [answer("3")], gold=["3"])


def test_missing_aliases_are_left_out():
    assert rewards.qa_reward(["q"], [answer("Paris")], answer=[[None, "Paris"]]) == [1.0]
    assert rewards.qa_reward(["q"], [answer("None")], answer=[[None, "Paris"]]) == [0.0]
    assert rewards.qa_score("B", None, {"answer_type": "multipleChoice"}) == 0.0
    assert rewards.math_reward(["q"], [answer("0")], answer=[0]) == [1.0]  # 0 is an answer


# Every shipped benchmark: its first items, exact, reformatted, wrong, broken ---------------------------------------
SHIPPED = ["aime24", "aime25", "math500", "gsm8k", "math", "hotpotqa", "2wiki", "musique", "bamboogle", "webwalker",
           "xbench"]


@pytest.mark.parametrize("bench", SHIPPED)
def test_shipped_items_exact_reformatted_wrong_and_broken(bench, data_dir):
    import gymnasium as gym

    import arpo_env  # noqa: F401

    spec = BENCHMARKS[bench]
    env = gym.make(spec.env_id, dataset=bench, data_dir=str(data_dir / "eval"), tools=()).unwrapped
    checked = 0
    for task in env.tasks[:8]:
        gold = task.answer[0] if isinstance(task.answer, list) else task.answer
        record = {"question": task.question, "answer": task.answer, "meta": task.meta}
        for transcript, expected in [(answer(gold), 1.0), (f"So the final answer is \\boxed{{{gold}}}.", 1.0),
                                     (answer("zebra quantum 98765"), 0.0), ("no answer", 0.0)]:
            _, score, _, _ = score_sample(spec, transcript, record, judge=None)
            assert score == pytest.approx(expected), (bench, gold, transcript)
            checked += 1
    env.close()
    assert checked == 32
