"""Math answers as text: `tidy` rewrites what models and datasets write (units, words, Python and Unicode
notation, LaTeX spacing, thousands separators) into the LaTeX that math-verify parses; `unit` and `prose` say what a
piece of text is."""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from arpo_env import tags
from arpo_env.scoring.qa_metrics import normalize_answer


# --------------------------------------------------------------------------------------------------------------------
# Correctness
# --------------------------------------------------------------------------------------------------------------------
def as_latex(text: str) -> str:
    text = str(text).strip()
    return text if "\\boxed" in text else f"\\boxed{{{text}}}"


_PROSE = re.compile(r"[A-Za-z][A-Za-z\s,.;:!?'\-]*")


def prose(answer: str, least: int = 2) -> str | None:
    r"""`answer` normalised as QA answers are (`qa_metrics.normalize_answer`: lower case, no punctuation, no articles)
    when it is prose: letters, spaces and punctuation only once ``\text{…}`` and its kin are unwrapped
    (`tags.unwrap_text`), with at least `least` distinct words of three letters or more; else None.

    math-verify reads plain prose as a product of one-letter symbols: "the cat sat on the mat" equals the same words
    in any order, and a few hundred characters take it a second or more. Prose is not mathematics: `math_equal`
    compares it as text. Short letter strings ("ABD", "abc", "No", "A and B") stay math-verify's, which reads them as
    it always has (as products: "seat" equals "east")."""
    text = tags.unwrap_text(answer).replace("\\ ", " ").replace("~", " ").strip()
    if not _PROSE.fullmatch(text):
        return None
    words = normalize_answer(text).split()
    if len({w for w in words if len(w) >= 3}) < least:
        return None
    return " ".join(words)


_DIGIT_GROUP = re.compile(r"(?<=\d)(?:\\[,;: ]|~)(?=\d{3}(?!\d))")
_FULL_STOP = re.compile(r"(?<=[^.,;\s\\])\s*[.,;]\s*$")
"""A sentence's full stop, comma or semicolon at the answer's end (``12.``, ``16,``, ``16 .``): math-verify read ``16,``
as no number. Not an ellipsis's last dot (``1, 2, ...``), nor TeX's ``\\;``."""
_MIXED_NUMBER = re.compile(r"([+-]?)(\d+)\s+(\d+)\s*/\s*(\d+)")
"""A mixed number in plain text (``2 1/2``), which math-verify read as no number: `tidy` writes ``2\\frac{1}{2}``."""
_SPACED_DIGITS = re.compile(r"([+-]?\d{1,3}(?:[ \u00a0\u202f]\d{3})+)((?:\.\d+)?)")
"""Digits grouped by spaces (``1 200``, with a no-break or a narrow no-break space too, as French and SI write them)."""
_TIE = re.compile(r"(?<!\\)~")
"""TeX's tie, a space that does not break (``16~\\text{cm}``, ``x~=~5``: math-verify read neither), once digit groups
(``10~080``) are taken; not an accent (``\\~{n}``)."""
DECIMAL = r"(?:\d+(?:\.\d*)?|\.\d+)"
"""A number's digits with perhaps a decimal point (``12``, ``12.5``, ``.5``), no sign."""
_JUXTAPOSED = re.compile(r"[+-]?" + DECIMAL + r"(?:\s+" + DECIMAL + r")+")
"""Numbers side by side and nothing else (``3 5``, ``5 1 3 6``), once mixed numbers and spaced digit groups are taken:
math-verify added whole ones (``3 4 5`` was 12) and multiplied decimals (``3.5 2`` was 7); `tidy` lists them."""
_E_NOTATION = re.compile(r"([+-]?" + DECIMAL + r")[eE]([+-]?\d{1,7})")  # linear: the answer is hostile
_FULLWIDTH = {**{cp: cp - 0xFEE0 for cp in range(0xFF01, 0xFF5F)}, 0x3000: 0x20}
"""Full-width forms of ASCII (``１２``, ``＋``, the ideographic space) to ASCII: only these, not all of NFKC, which
reads ``10²`` as 102."""
_NUMBER = r"([+-]?(?:\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+))"
"""A number, its digits perhaps grouped by commas (``1,200``)."""
_NUMBER_WORDS = re.compile(_NUMBER + r"\s+([A-Za-z]{3,}(?:\s+[A-Za-z]+){0,2})")
_ASSIGNED = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?\s*=\s*((?:\\\$\s*)?[+-]?\d{1,3}(?:(?:,|\{,\}|,\\!)\d{3})+(?!\d)"
                       r"(?:\.\d+)?(?:[^=,{\d.][^=]*)?)")
"""A variable set to a number whose digits are grouped (``x = 1,000``, ``n = 10{,}080``): math-verify read no number."""
_NOT_UNITS = {"sqrt", "sin", "cos", "tan", "sec", "csc", "cot", "log", "exp", "inf", "infinity", "mod", "choose",
              "over", "times", "plus", "minus", "and", "not", "the", "hundred", "thousand", "million", "billion",
              "trillion", "dozen", "hundreds", "thousands", "millions", "billions", "dozens"}
"""Words after a number that are not its unit: they change its value or are mathematics (``4.4 million``)."""
_MATH_FONT = re.compile(r"\\(?:mathbf|boldsymbol|bm|mathit|mathnormal)\s*\{")
_TEXT_FONT = re.compile(r"\\(?:text|textbf|textit|emph|textrm|textsf|textnormal|mathrm|mbox)\s*\{")
_DEGREE = re.compile(r"°|\\degree(?![A-Za-z])")
_WORDS = re.compile(r"[A-Za-z][A-Za-z\s,.'-]*")
_WORD = re.compile(r"[A-Za-z]{3}")
_INFIX = re.compile(r"\\(?:choose|over|atop|above|brack|brace)(?![A-Za-z])")
"""TeX's infix commands, whose operands the brace group around them delimits (``{10 \\choose 3}``)."""
_DELIMITERS = (*tags.MATH_DELIMITERS, ("**", "**"))  # and Markdown's bold
_SPACES = ("\\qquad", "\\quad", "\\,", "\\;", "\\:", "\\!", "\\ ", "~")
"""LaTeX's spacing: at either end of an answer it is nothing (``10,\\!080\\quad`` is not 10080 to math-verify)."""


def _strip_spacing(text: str) -> str:
    """`text` without white space and `_SPACES` at its ends, in one pass (the answer is hostile: no slicing per
    token, no backtracking regular expression)."""
    def spacing_at(i: int) -> int:  # the length of the spacing at i, 0 for none
        if text[i].isspace():
            return 1
        for sp in _SPACES:
            if text.startswith(sp, i) and not (sp[-1].isalpha() and text[i + len(sp): i + len(sp) + 1].isalpha()):
                return len(sp)
        return 0

    start, end = 0, len(text)
    while start < end and (step := spacing_at(start)):
        start += step
    while start < end:
        sp = next((sp for sp in _SPACES if text.endswith(sp, start, end)
                   and not text.endswith("\\" + sp, start, end)), None)  # \\, is a line break and a comma
        if sp is None and not text[end - 1].isspace():
            break
        end -= len(sp) if sp else 1
    return text[start:end]


def _closed_at_end(text: str, start: int) -> bool:
    """Whether the brace at `start` is closed by the last character of `text` (escaped braces skipped). Linear."""
    depth, i = 0, start
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        depth += (text[i] == "{") - (text[i] == "}")
        if depth == 0:
            return i == len(text) - 1
        i += 1
    return False


def _peel(text: str, rounds: int = 4) -> str:
    r"""The answer inside what wraps the whole of it and only marks it up: math delimiters (``$…$``, ``\(…\)``,
    ``\[…\]``; math-verify read ``\(10,\!080\)`` as no number), Markdown's bold (``**7**``), a bare brace group
    (``{(6,31,-1)}``: LaTeX shows the tuple, math-verify read a set; not one that delimits ``\choose``), a bold or
    italic math font (``\mathbf{3\sqrt{13}}``, ``\boldsymbol{7}``), and LaTeX's spacing at either end
    (``10,\!080\quad``). A text font (``\text{…}``, ``\textbf{…}``, ``\mathrm{…}``) stays, as ``\text{…}``, around
    words (``\textbf{east}``), and goes around anything else (``\textbf{p - q}``, ``\text{6 - 5i}``). At most
    `rounds` layers, so linear in the answer."""
    for _ in range(rounds):
        text = _strip_spacing(text)
        for left, right in _DELIMITERS:
            inner = text[len(left): len(text) - len(right)]
            if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right) \
                    and left not in inner and right not in inner:
                text = inner
                break
        else:
            font = _MATH_FONT.match(text) or _TEXT_FONT.match(text)
            opens = font.end() - 1 if font else 0 if text.startswith("{") else -1
            if opens < 0 or not _closed_at_end(text, opens) or (not font and _INFIX.search(text)):
                return text
            inner = text[opens + 1: -1]
            words = font is not None and font.re is _TEXT_FONT and _WORDS.fullmatch(inner.strip()) is not None \
                and _WORD.search(inner) is not None
            if words:
                return f"\\text{{{inner}}}"
            text = inner
    return _strip_spacing(text)


_UNIT_NAMES = {
    "cent": "cent cents ¢", "dollar": "dollar dollars usd", "euro": "euro euros eur €", "percent": "percent %",
    "gbp": "gbp £", "yen": "yen jpy ¥", "rupee": "rupee rupees inr ₹",
    "degree": "degree degrees deg", "radian": "radian radians rad",
    "mm": "mm millimeter millimeters millimetre millimetres", "cm": "cm centimeter centimeters centimetre centimetres",
    "m": "m meter meters metre metres", "km": "km kilometer kilometers kilometre kilometres",
    "inch": "in inch inches", "ft": "ft foot feet", "yd": "yd yard yards", "mile": "mi mile miles",
    "s": "s sec secs second seconds", "min": "min mins minute minutes", "h": "h hr hrs hour hours",
    "day": "day days", "week": "week weeks", "month": "month months", "year": "yr yrs year years",
    "mg": "mg milligram milligrams", "g": "g gm gram grams", "kg": "kg kilogram kilograms",
    "lb": "lb lbs pound pounds", "oz": "oz ounce ounces", "ton": "ton tons tonne tonnes",
    "ml": "ml milliliter milliliters millilitre millilitres", "l": "l liter liters litre litres",
    "gallon": "gal gallon gallons", "quart": "qt quart quarts", "pint": "pt pint pints", "cup": "cup cups",
    "mph": "mph", "km/h": "km/h kph kmh", "m/s": "m/s", "celsius": "celsius", "fahrenheit": "fahrenheit",
}
_UNITS = {name: unit for unit, names in _UNIT_NAMES.items() for name in names.split()}
"""Units of measure by their names (lower case): two answers in different ones are not the same answer."""
_MEASURE = re.compile(_NUMBER + r"\s*([a-z]{2,}(?:/[a-z]+)?|[a-z]/[a-z]+|[¢€£¥₹])\s*(?:\^\s*\{?\s*[23]\s*\}?|[²³])?")
"""A number, a unit's name in lower case, perhaps a power (``15 cm^2``, ``3 oz``, ``100cm``, ``18 m/s``): `tidy` writes
it as ``15\\text{ cm}``. Not a name of one letter, which may be a variable (``3s^2``, ``2 h``): math-verify reads
``5 m`` itself."""
_SCALE = {"thousand": 3, "million": 6, "billion": 9, "trillion": 12}
_SCALED = re.compile(r"(\\\$\s*)?" + _NUMBER
                     + r"\s*(thousand|million|billion|trillion)(?:\s+([A-Za-z]+(?:\s+[A-Za-z]+)?))?")
"""A number in thousands, millions, billions or trillions (``1.2 million``, ``\\$4 billion``, ``4.4 million people``):
math-verify read no number. `tidy` writes its digits."""
_RATE = re.compile(r"(\\\$\s*)?" + _NUMBER + r"(?:\s*([A-Za-z]{2,}))?(?:\s*/\s*|\s+per\s+)([A-Za-z]+)")
"""A rate: a number, perhaps in dollars or with a unit, per another unit (``\\$18/day``, ``18 km per hour``, ``18
miles/hour``, ``18 eggs/day``): math-verify read a quotient of letters. `tidy` writes it as ``18\\text{ km per hour}``
where it has a unit or a dollar sign, or a unit of time after the stroke (``18/day``; not ``18/x``, a quotient)."""
_BRACKETED_WORDS = re.compile(_NUMBER + r"\s*\(\s*([A-Za-z]+(?:[\s.]+[A-Za-z]+){0,3})\.?\s*\)")
"""A number and words in brackets after it (``18 (dollars)``, ``18 (in total)``, ``18 (approx.)``): math-verify read a
product with letters. `tidy` writes the words as the number's unit, where the first is a unit's name or a word of three
letters that does not change the value (`_NOT_UNITS`); ``18 (x)`` stays a product."""
_PERCENT_WORD = re.compile(_NUMBER + r"\s*(?:percent|per\s+cent|pct)\.?", re.I)
"""A percentage in words (``50 percent``, ``50 per cent``): `tidy` writes ``50\\%``, which math-verify reads as the
fraction it is, as it reads ``50\\%`` and ``50%`` (``50\\text{ percent}`` was 50, not 1/2)."""
_BASE = re.compile(r"0(?:[bB](?P<b>[01]+)|[oO](?P<o>[0-7]+)|[xX](?P<x>[0-9A-Fa-f]+))"
                   r"|(?P<digits>[+-]?[0-9A-Za-z]+)\s*(?:\(\s*base\s*(?P<base>\d{1,2})\s*\)"
                   r"|(?:in\s+)?base\s+(?P<named>\d{1,2}))")
"""A number in another base as Python prints it (``0b1011``, ``0o17``, ``0x1f``) or as words say it (``1011 (base
2)``, ``1011 in base 2``): `tidy` writes MATH's ``1011_{2}`` (math-verify read a product with letters)."""
_FLOAT = re.compile(r"[+-]?\d{1,30}\.\d{1,30}")


def _float_noise(text: str) -> str:
    """A float as binary arithmetic leaves it, one ulp off a short decimal (``18.000000000000004``,
    ``0.30000000000000004``, ``17.999999999999996``), as that decimal (math-verify held them unequal to 18, 0.3 and
    18). Only where 12 significant digits round it to 9 or fewer: ``0.3333333333333333`` stays."""
    if not _FLOAT.fullmatch(text) or len(text.replace("-", "").replace("+", "").replace(".", "").lstrip("0")) < 15:
        return text
    rounded = Decimal(format(Decimal(text), ".12g")).normalize()
    return f"{rounded:f}" if len(rounded.as_tuple().digits) <= 9 else text


_PREFIX_BASES = {"b": 2, "o": 8, "x": 16}
_PER_TIME = {"sec", "second", "min", "minute", "hr", "hour", "day", "week", "month", "year"}
_PRICE = re.compile(r"([+-]?)\s*([€£¥₹]|(?:USD|EUR|GBP|JPY|INR)\s)\s*" + _NUMBER)
"""A price written with its currency first (``€1,200``, ``-£5``, ``USD 1200``; ``\\$5`` math-verify reads itself):
`tidy` writes it as ``1200\\text{ €}``, a number math-verify reads and a unit `unit` reads."""
_UNIT_AT_END = re.compile(r"(?:\\(?:text|mbox|mathrm|textrm)\s*\{\s*([^{}\\]*?)\s*\}"  # \text{ cm}
                          r"|(?:(?<=\d)|(?<=[})]))\s*([A-Za-z]+(?:/[A-Za-z]+)?)"  # a name after a number: 5 cm
                          r"|(\^\s*\{?\s*\\circ\s*\}?)|\\(%)|([¢€£¥₹%]))"  # ^{\circ}, \%, signs
                          r"\s*(?:\^\s*\{?\s*[23]\s*\}?)?\s*$")  # a power
_UNIT_WORDS = re.compile(r"(?:(?:square|sq|cubic|cu)\.?\s+)?(?:(deg(?:ree)?s?)\.?\s+)?([a-z/]+|[¢€£¥₹])\.?"
                         r"(\s+per\s+hour)?")
_TEMPERATURES = {"c": "celsius", "celsius": "celsius", "f": "fahrenheit", "fahrenheit": "fahrenheit"}
"""A temperature's scale by its names after ``degrees`` (``18 degrees C``, ``18 degrees Fahrenheit``)."""
KINDS_OF = {"celsius": ("degree",), "fahrenheit": ("degree",), "degree": ("celsius", "fahrenheit")}
"""Units that agree though they differ: a degree (``18^\\circ``) is one of Celsius or of Fahrenheit, and either
scale's degree is a degree; Celsius and Fahrenheit disagree."""
_TEMPERATURE = re.compile(_NUMBER + r"\s*\^\s*(?:\{\s*\\circ\s*\}|\\circ)\s*"  # no two spaces' runs in a row: linear
                          r"(?:\\(?:text|mathrm|mbox|textrm)\s*\{\s*([CF])\s*\}|([CF]))")
"""A temperature with its degree sign (``18°C``, ``-3 °F``, ``18^\\circ C``, ``18^{\\circ}\\text{F}``; ``℃`` is ``°C``):
math-verify read no number before a letter. `tidy` writes it as ``18\\text{ degrees Celsius}``."""


def unit(answer: str) -> str | None:
    r"""The unit of measure a (`tidy`) answer ends in (``18\text{ cents}``, ``15\mbox{ cm}^2``, ``90^{\circ}``,
    ``\text{ square inches}``) or that its dollar sign gives (``\$18``), by its key in `_UNIT_NAMES` (``cent``,
    ``cm``, ``degree``, ``inch``); None for no number, no unit, or a word that is not a unit's name (``18\text{
    cookies}``). Reads the last 64 characters: linear in the answer."""
    if not any(c.isdigit() for c in answer):
        return None
    end = _UNIT_AT_END.search(answer[-64:])
    if end is not None:
        words = end.group(1) if end.group(1) is not None else end.group(2)
        if words is None:
            return "degree" if end.group(3) else _UNITS[(end.group(4) or end.group(5)).lower()]
        named = _UNIT_WORDS.fullmatch(words.lower())
        if named is not None:
            name = _UNITS.get(named.group(2))
            if named.group(1):  # degrees of a temperature's scale
                name = _TEMPERATURES.get(named.group(2))
            if named.group(3):  # per hour
                name = {"mile": "mph", "km": "km/h"}.get(name or "")
            if name is not None:
                return name
    start = answer.lstrip(" +-")
    return "dollar" if start.startswith("\\$") else None


_BEFORE_BINOMIAL = re.compile(r"(?<=[\d)])\s*(?=\\[dt]?binom(?![A-Za-z]))")
_LIMITS_MARK = re.compile(r"\\(?:no)?limits(?![A-Za-z])")
_STYLE = re.compile(r"\\(?:display|text|script|scriptscript)style(?![A-Za-z])\s*")
"""TeX's math styles, layout only: ``\\displaystyle\\text{5 cm}`` kept `_peel` from the ``\\text{}``."""
_REPEATING = re.compile(r"([+-]?)(\d{0,50})\.(\d{0,50})\\(?:overline|dot)\s*\{(\d{1,50})\}")
"""A repeating decimal (``0.\\overline{3}``, ``1.2\\overline{45}``): math-verify read the ``\\overline`` as a bar over
digits, not as 1/3. `tidy` writes the fraction."""
OPTION_LETTER = r"(?:\\(?:textbf|text|mathrm|mathbf)\s*\{\s*\(([A-Z])\)\s*\}|\(([A-Z])\))"
"""A multiple-choice option's mark (``(C)``, ``\\text{(C)}``, ``\\textbf{(C) }``), its letter in group 1 or 2."""
_OPTION_MARK = re.compile(OPTION_LETTER + r"(?:\s|\\[ ,;:]|\\q?quad(?![A-Za-z])|~)*(?=-?(?:\d|\\[dt]?frac|\\sqrt))")
"""The mark of an AMC option before its value, as AoPS's solutions box it (``\\textbf{(B) }12``,
``\\textbf{(B)}\\ 12``): `tidy` reads the value (math-verify read none)."""
_EMPTY_SET = re.compile(r"\\varnothing(?![A-Za-z])")
"""The empty set's other sign: math-verify reads ``\\emptyset`` (and ``\\{\\}``) as the empty set, ``\\varnothing`` as a
symbol."""


_SUPERSCRIPTS = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱ", "0123456789+-=()ni"))
_VULGAR = {"½": (1, 2), "⅓": (1, 3), "⅔": (2, 3), "¼": (1, 4), "¾": (3, 4), "⅕": (1, 5), "⅖": (2, 5), "⅗": (3, 5),
           "⅘": (4, 5), "⅙": (1, 6), "⅚": (5, 6), "⅐": (1, 7), "⅛": (1, 8), "⅜": (3, 8), "⅝": (5, 8), "⅞": (7, 8),
           "⅑": (1, 9), "⅒": (1, 10)}
_ROOTS = {"√": "\\sqrt", "∛": "\\sqrt[3]", "∜": "\\sqrt[4]"}
_SIGNS = {"∞": "\\infty ", "π": "\\pi ", "·": "\\cdot ", "⋅": "\\cdot ", "⁄": "/", "∓": "\\mp ", "≈": "\\approx ",
          "℃": "°C", "℉": "°F"}
_DASHES = "\u2010\u2011\u2012\u2013\u2014"
"""Hyphen, non-breaking hyphen, figure, en and em dash: written for a minus sign (``–5``) where they stand as one."""
_RADICAND = re.compile(r"\d+(?:\.\d+)?|[A-Za-zπ]|\\pi(?![A-Za-z])")


_PYTHONIC = re.compile(r"\*\*|(?<![A-Za-z_\\])(?:sqrt|exp|log|pi|oo|Fraction|Rational|Decimal|float\d*|int\d*)"
                       r"(?![A-Za-z_])|\d(?:j|\s*\*\s*I)(?![A-Za-z_0-9])")
"""What Python and SymPy print and LaTeX does not write: a power ``**``, ``sqrt(2)``, ``exp``, ``log``, ``pi``,
``oo``, a complex number ``7j`` or ``7*I``, a number's repr (``Fraction(1, 3)``, ``np.float64(12.5)``)."""
_PY_REPR = re.compile(r"(?:Fraction|Rational)\(\s*([+-]?\d+)\s*,\s*([+-]?\d+)\s*\)"
                      r"|(?:(?:np|numpy)\.)?(?:float|int)(?:16|32|64|128)?\(\s*([+-]?" + DECIMAL + r")\s*\)"
                      r"|Decimal\(\s*(['\"])([+-]?" + DECIMAL + r")\4\s*\)")
"""The repr of a number that the interpreter shows as a cell's value: ``Fraction(1, 3)``, ``np.float64(12.5)``,
``Decimal('12.5')``."""
_PY_NAME = re.compile(r"[^\W\d]\w*")
_PY_NUMBER = re.compile(DECIMAL)
_PY_OPERAND = re.compile(DECIMAL + r"|[^\W\d]\w*")
_PY_CALLS = {"sqrt": ("\\sqrt{", "}"), "exp": ("e^{", "}"), "log": ("\\ln(", ")")}
_PY_CONSTANTS = {"pi": "\\pi ", "oo": "\\infty ", "I": "i"}


def _number_of_repr(match: re.Match) -> str:
    numerator, denominator, number, _, decimal = match.groups()
    return f"({numerator}/{denominator})" if numerator is not None else number or decimal


def _last_filled(out: list[str]) -> str:
    """The last piece of `out` that is not a space (each space is looked at once: the caller drops them)."""
    k = len(out) - 1
    while k >= 0 and out[k] == " ":
        k -= 1
    return out[k] if k >= 0 else ""


def _power_follows(text: str, i: int) -> bool:
    """Whether a ``**`` comes next in `text` from `i`, after spaces (each space is passed once: what follows it is the
    caller's next token)."""
    while i < len(text) and text[i] == " ":
        i += 1
    return text.startswith("**", i)


def _python_math(text: str) -> str:
    r"""An answer written as Python or SymPy print it, as LaTeX writes it (math-verify read ``10*pi`` as 10·p·i,
    ``x**2`` and ``1 + sqrt(2)`` as nothing, ``oo`` as o·o, ``2+7j`` with a variable j): a model that computed its
    answer in the interpreter often copies it as printed. ``**`` is a power (``x^{2}``, ``2^{(1/3)}``), ``sqrt(…)``,
    ``exp(…)`` and ``log(…)`` are ``\sqrt{…}``, ``e^{…}`` and ``\ln(…)`` (SymPy's and Python's log is natural),
    ``pi``, ``oo`` and ``I`` are ``\pi``, ``\infty`` and ``i``, ``7j`` is ``7i``, and a number's repr is the number
    (``Fraction(1, 3)``, ``np.float64(12.5)``, ``Decimal('12.5')``: `_PY_REPR`). Only an answer with no
    backslash (no LaTeX) that has one of these (`_PYTHONIC`); one whose brackets do not balance is left as written.
    One pass: the answer is hostile."""
    if "\\" in text or not _PYTHONIC.search(text):
        return text
    text = _PY_REPR.sub(_number_of_repr, text)
    out: list[str] = []
    closers: list[str | int] = []  # for each bracket open, what closes it; a power's bracket: the powers open before
    chained = 0  # exponents still open: 2**3**2 is 2^{3^{2}}, Python's powers group from the right
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("**", i):
            j = i - 1
            while j >= 0 and text[j] == " ":  # each space is passed once: the next "**" stops the walk before it
                j -= 1
            if j < 0 or not (text[j].isalnum() or text[j] in "_.)"):  # no base: Markdown's bold ("**18** apples")
                return text
            i += 2
            while i < n and text[i] == " ":
                i += 1
            sign = text[i] if i < n and text[i] in "+-" else ""
            i += len(sign)
            if i < n and text[i] == "(":
                out.append("^{" + sign + "(")
                closers.append(chained)
                chained = 0
                i += 1
                continue
            operand = _PY_OPERAND.match(text, i)
            if operand is None or operand.group() in _PY_CALLS:  # "x**", "2**sqrt(2)": as written
                return text
            out.append("^{" + sign + _PY_CONSTANTS.get(operand.group(), operand.group()).strip())
            i = operand.end()
            chained += 1
            if not _power_follows(text, i):
                out.append("}" * chained)
                chained = 0
            continue
        name = _PY_NAME.match(text, i) if not c.isdigit() else None
        if name is not None:
            word, i = name.group(), name.end()
            if word in _PY_CALLS and i < n and text[i] == "(":
                opener, closer = _PY_CALLS[word]
                out.append(opener)
                closers.append(closer)
                i += 1
            elif word == "I" and _last_filled(out) == "*":  # 7*I: 7i (math-verify read 7*i as a product)
                while out.pop() != "*":
                    pass
                while out and out[-1] == " ":
                    out.pop()
                out.append("i")
            else:
                out.append(_PY_CONSTANTS.get(word, word))
            continue
        number = _PY_NUMBER.match(text, i)
        if number is not None:
            out.append(number.group())
            i = number.end()
            if i < n and text[i] == "j" and (i + 1 == n or not (text[i + 1].isalnum() or text[i + 1] == "_")):
                out.append("i")  # Python's complex 7j
                i += 1
            continue
        if c == "(":
            closers.append(")")
        elif c == ")":
            if not closers:
                return text
            closer = closers.pop()
            if isinstance(closer, int):  # a power's bracketed exponent ends: 2**(1/3), 2**(3)**2
                out.append(")")
                i += 1
                chained = closer + 1
                if not _power_follows(text, i):
                    out.append("}" * chained)
                    chained = 0
                continue
            c = closer
        out.append(c)
        i += 1
    return text if closers else "".join(out)


def _unicode_math(text: str) -> str:
    r"""The mathematics a model writes in Unicode as LaTeX writes it, which math-verify reads (it read none of it):
    a root sign over a number, a letter or a bracket (``2√2``, ``√(x+1)``, ``∛2`` are ``2\sqrt{2}``,
    ``\sqrt{x+1}``, ``\sqrt[3]{2}``), superscripts (``x²``, ``10⁻³``: ``x^{2}``, ``10^{-3}``), the vulgar fractions
    (``2½``: ``2\frac{1}{2}``), ``∞``, the dot of a product and a dash as a number's sign (``–5``). One pass: the
    answer is hostile."""
    if text.isascii():
        return text
    out: list[str] = []
    opened: list[int | None] = []  # for each "(" open, where in out the "{" of its root stands (None: a bracket)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _SUPERSCRIPTS:
            j = i
            while j < n and text[j] in _SUPERSCRIPTS:
                j += 1
            out.append("^{" + "".join(_SUPERSCRIPTS[d] for d in text[i:j]) + "}")
            i = j
            continue
        if c in _ROOTS:
            out.append(_ROOTS[c])
            j = i + 1
            while j < n and text[j] == " ":
                j += 1
            if j < n and text[j] == "(":
                opened.append(len(out))
                out.append("{")
                i = j + 1
                continue
            radicand = _RADICAND.match(text, j)
            if radicand is not None:
                out.append("{" + radicand.group().replace("π", "\\pi") + "}")
                i = radicand.end()
            else:  # over a brace group (``√{2}``) or what LaTeX would read
                i += 1
            continue
        if c == "(":
            opened.append(None)
        elif c == ")" and opened:
            if opened.pop() is not None:
                c = "}"
        elif c in _VULGAR:
            c = "\\frac{%d}{%d}" % _VULGAR[c]
        elif c in _DASHES and i + 1 < n and (text[i + 1].isdigit() or text[i + 1] in ".\\∞√") \
                and not (out and (out[-1][-1:].isalnum() or out[-1][-1:] in ")]}")):
            c = "-"  # a dash as a number's sign ("–5", "–\frac{1}{2}"; "5–7", a range, stays)
        else:
            c = _SIGNS.get(c, c)
        out.append(c)
        i += 1
    for at in opened:  # a root's bracket never closed: left as written
        if at is not None:
            out[at] = "("
    return "".join(out)


def _measured(number: str, name: str) -> str:
    """A number (its digits perhaps grouped by commas) and the name of its unit as ``18\\text{ cookies}`` writes
    them: the number math-verify reads (it drops a ``\\text{}``), the unit `unit` reads."""
    return f"{number.replace(',', '')}\\text{{ {name}}}"


def _per_unit(dollar: str | None, number: str, name: str | None, per: str) -> bool:
    """Whether a `_RATE` match is a rate, not a quotient (``2 abc/def``) or words that change the value: dollars per
    a word of three letters or a unit (``\\$18/person``), a unit per anything or anything per a unit (``18 km/day``,
    ``18 eggs/day``), or a number per a unit of time (``18/day``)."""
    name, per = (name or "").lower(), per.lower()
    if {name, per} & _NOT_UNITS:
        return False
    if dollar:
        return len(per) >= 3 or per in _UNITS
    if name:
        return name in _UNITS or per in _UNITS
    return per in _PER_TIME


def tidy(answer: str) -> str:
    r"""`answer` without what math-verify misreads and a reader would not: digits grouped by LaTeX spaces
    (``10\,080``, ``10\;080``, ``10~080``: 10080, as ``10{,}080`` and ``10,\!080`` already are; any other ``~`` is a
    space: `_TIE`), a sentence's full stop, comma or semicolon at its end (``12.``, ``\frac{1}{2}.``, ``16,``; an
    ellipsis ``...`` stays), and a whole answer that is a number in E notation, as Python prints floats (``1e6``,
    ``1.5e-05``: math-verify reads the ``e`` as Euler's number), is written as ``1\times10^{6}``. More that
    math-verify misreads:

    * a binomial after a number or a bracket gets its product sign (``2\binom{5}{2}`` is not 20 to math-verify);
    * ``\limits`` and ``\nolimits`` go, being layout only (``\sum\limits_{k=1}^{4} k`` is not 10 to math-verify), and so
    do
      ``\displaystyle`` and the other styles (``\displaystyle\text{5 cm}`` is not 5 to math-verify);
    * full-width digits and signs are ASCII (``１２``, as a model writing Chinese may put them, is not 12 to
    math-verify), and the
      mathematics of Unicode is LaTeX's (`_unicode_math`: ``2√2``, ``x²``, ``2½``, ``∞`` are none of its), and so
      is Python's and SymPy's printing, which a model copies from the interpreter (`_python_math`: ``10*pi``,
      ``x**2``, ``1 + sqrt(2)``, ``2+7j`` are none of its);
    * a number followed by up to three words and nothing else is that number with its unit, as ``18\text{ cookies}``
      writes it (``18 cookies`` and ``18 dollars`` were not 18: outside ``\text{}`` math-verify knows only the units
      on its list, ``18 meters``); not where a word changes the value or is mathematics (`_NOT_UNITS`); so is a
      number with a unit's name and perhaps a power (``15 cm^2``, ``3 oz``: math-verify read letters), and a price
      with its currency first (``€1,200``, ``USD 1200``: `_PRICE`), and a rate (``\$18/day``, ``18 km per hour``:
      `_RATE`, a quotient of letters to math-verify), and words in brackets after a number (``18 (dollars)``:
      `_BRACKETED_WORDS`, a product); the number's digits may be grouped by commas (``1,200 dollars`` would read as a
      tuple); a percentage in words is one in signs (``50 percent``: ``50\%``, 1/2 as that is: `_PERCENT_WORD`);
    * a variable set to a number whose digits are grouped is that number (``x = 1,000``, ``n = 10{,}080``: no number
      to math-verify);
    * what wraps the whole answer only to mark it up goes (`_peel`: ``\(10,\!080\)``, ``**18**``, ``{(6,31,-1)}``,
      ``\mathbf{3\sqrt{13}}``, ``\text{6 - 5i}``, ``10,\!080\quad`` were not their answers);
    * a degree sign is ``^{\circ}`` (``90°`` and ``90\degree`` were not ``90^\circ``), and ``\varnothing`` is
      ``\emptyset`` (math-verify reads it as a symbol, not the empty set); a temperature is its number in degrees of its
      scale (``18°C``, ``-3 °F``, ``18℃``: `_TEMPERATURE`; no number before);
    * a mixed number in plain text is one (``2 1/2``, `_MIXED_NUMBER`), and digits grouped by spaces are one number
      (``1 200``, `_SPACED_DIGITS`): neither was any number; nor was a number in millions (``1.2 million``:
      `_SCALED`), which is written in digits; other numbers side by side are a list (``3 4 5``: `_JUXTAPOSED`;
      math-verify read their sum, 12); a repeating decimal is its fraction (``0.\overline{3}``: `_REPEATING`);
      an AMC option's mark before its value goes (``\textbf{(B) }12``: `_OPTION_MARK`); a number in another base is
      MATH's ``1011_{2}`` (``0b1011``, ``1011 (base 2)``: `_BASE`); a float one ulp off a short decimal is that
      decimal (``18.000000000000004``: `_float_noise`).
    """
    text = _STYLE.sub("", _DEGREE.sub(r"^{\\circ}", _unicode_math(_python_math(str(answer).translate(_FULLWIDTH)))))
    text = _EMPTY_SET.sub(r"\\emptyset", text)
    text = _FULL_STOP.sub("", _TIE.sub(" ", _DIGIT_GROUP.sub("", _peel(_FULL_STOP.sub("", text)))))  # \text{A,C}.
    text = _LIMITS_MARK.sub("", _BEFORE_BINOMIAL.sub(r"\\cdot ", text))
    marked = _OPTION_MARK.match(text)
    if marked is not None:  # "\textbf{(B) }12": the value, after the option's mark
        text = text[marked.end():]
    temperature = _TEMPERATURE.fullmatch(text)
    if temperature is not None:  # "18°C": no number to math-verify
        scale = temperature.group(2) or temperature.group(3)
        text = _measured(temperature.group(1), "degrees " + {"C": "Celsius", "F": "Fahrenheit"}[scale])
    assigned = _ASSIGNED.fullmatch(text)
    if assigned is not None:
        text = assigned.group(1).strip()
    scaled = _SCALED.fullmatch(text)
    if scaled is not None:
        dollar, number, scale, words = scaled.groups()
        value = Decimal(number.replace(",", "")).scaleb(_SCALE[scale]).normalize()
        text = ("\\$" if dollar else "") + (f"{value:f}" if words is None else _measured(f"{value:f}", words))
    percent = _PERCENT_WORD.fullmatch(text)
    if percent is not None:  # "50 percent": 1/2, as "50\%" is
        text = percent.group(1).replace(",", "") + "\\%"
    counted = _NUMBER_WORDS.fullmatch(text)
    if counted is not None and not _NOT_UNITS & set(counted.group(2).lower().split()):
        text = _measured(counted.group(1), counted.group(2))
    measure = _MEASURE.fullmatch(text)
    if measure is not None and measure.group(2) in _UNITS:  # "15 cm^2", "3 oz": math-verify did not drop them
        text = _measured(measure.group(1), measure.group(2))
    price = _PRICE.fullmatch(text)
    if price is not None:  # "€1,200", "USD 1200": no number to math-verify
        text = _measured(price.group(1) + price.group(3), price.group(2).strip())
    bracketed = _BRACKETED_WORDS.fullmatch(text)
    if bracketed is not None:  # "18 (dollars)": a product with letters to math-verify
        first = bracketed.group(2).split()[0].rstrip(".").lower()
        if first not in _NOT_UNITS and (len(first) >= 3 or first in _UNITS):
            text = _measured(bracketed.group(1), bracketed.group(2))
    rate = _RATE.fullmatch(text)
    if rate is not None and _per_unit(*rate.groups()):  # "\$18/day", "18 km per hour": a quotient to math-verify
        dollar, number, name, per = rate.groups()
        text = ("\\$" if dollar else "") + _measured(number, f"{name + ' ' if name else ''}per {per}")
    mixed = _MIXED_NUMBER.fullmatch(text)
    if mixed is not None and int(mixed.group(3)) < int(mixed.group(4)):  # a proper fraction after the whole part
        text = f"{mixed.group(1)}{mixed.group(2)}\\frac{{{mixed.group(3)}}}{{{mixed.group(4)}}}"
    spaced = _SPACED_DIGITS.fullmatch(text)
    if spaced is not None:
        text = re.sub(r"\s", "", spaced.group(1)) + spaced.group(2)
    elif _JUXTAPOSED.fullmatch(text):  # "3 4 5": three numbers, not their sum
        text = ", ".join(text.split())
    repeating = _REPEATING.fullmatch(text)
    if repeating is not None:
        sign, whole, fixed, cycle = repeating.groups()
        value = int(whole or "0") + Fraction(int(fixed or "0"), 10 ** len(fixed)) \
            + Fraction(int(cycle), (10 ** len(cycle) - 1) * 10 ** len(fixed))
        text = f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"
    based = _BASE.fullmatch(text)
    if based is not None:  # "0b1011", "1011 (base 2)": 1011_{2}
        if based["digits"] is not None:
            text = f"{based['digits']}_{{{based['base'] or based['named']}}}"
        else:
            prefix = next(p for p in _PREFIX_BASES if based[p] is not None)
            text = f"{based[prefix].upper()}_{{{_PREFIX_BASES[prefix]}}}"
    text = _float_noise(text)
    number = _E_NOTATION.fullmatch(text)
    if number is not None:
        text = f"{number.group(1)}\\times10^{{{int(number.group(2))}}}"
    return text
