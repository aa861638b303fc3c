"""Answer scoring for question answering: SQuAD-normalised token F1 and exact match over gold aliases,
each Chinese, Japanese or Korean character a token, letter matching for multiple choice, and an optional LLM judge."""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections import Counter
from typing import Any, Mapping

CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
"""Chinese, Japanese and Korean characters, as the ranges of a regular expression's class: their words are not
spaced (QA's F1 and the local search index split them)."""
_PUNCT = set(string.punctuation) | set("，。、；：？！“”‘’（）《》【】—…·「」『』〈〉～")
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces; and Unicode's compatibility
    forms (NFKC) first, so that full-width digits and letters, as Chinese text writes them, are the ASCII ones
    (``２０２３年`` is ``2023年``; it shared only its ``年``), and ligatures their letters."""
    text = "".join(ch for ch in unicodedata.normalize("NFKC", str(text)).lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


_MIXED = re.compile(rf"[{CJK}]|[^\s{CJK}]+")


def tokens(text: str) -> list[str]:
    """Tokens of the normalised text: each Chinese/Japanese/Korean character is one, and so is each run of other
    characters between them and spaces (mixed segmentation, as CMRC scores: ``iPhone 15手机`` is ``iphone``, ``15``,
    ``手``, ``机``). Splitting a text that held such a character into characters made ``iPhone 15`` share nothing
    with ``iPhone 15手机``, and ``Apple公司`` share ``p``, ``l``, ``e`` with ``Google公司``."""
    return _MIXED.findall(normalize_answer(text))


def f1_score(prediction: str, gold: str) -> float:
    pred, ref = tokens(prediction), tokens(gold)
    # SQuAD: yes/no/noanswer only match exactly.
    if {normalize_answer(prediction), normalize_answer(gold)} & {"yes", "no", "noanswer"} and \
            normalize_answer(prediction) != normalize_answer(gold):
        return 0.0
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def missing(value: Any) -> bool:
    """Whether a gold answer (or one of its aliases) is not there: None, NaN (a null read through pandas), empty
    text. Its ``str`` ("None", "nan", "") is no answer, and must not score as one."""
    return (value is None or (isinstance(value, float) and math.isnan(value))
            or (isinstance(value, str) and not value.strip()))


def aliases(gold: Any) -> list[str]:
    """The gold's aliases as text, the missing ones left out (`missing`): a row without a gold has none. A NumPy
    array (a dataset in NumPy or pandas form) is its items: its ``str`` (``['12' '13']``) was one alias."""
    if hasattr(gold, "tolist") and not isinstance(gold, str):
        gold = gold.tolist()
    items = gold if isinstance(gold, (list, tuple)) else [gold]
    return [str(g) for g in items if not missing(g)]


def best_f1(prediction: str | None, gold: Any) -> float:
    if prediction is None:
        return 0.0
    return max((f1_score(prediction, g) for g in aliases(gold)), default=0.0)


def best_em(prediction: str | None, gold: Any) -> float:
    if prediction is None:
        return 0.0
    return max((exact_match(prediction, g) for g in aliases(gold)), default=0.0)


# After the letter: punctuation, the end, or a space before the option's text, which does not go on in lower case
# ("D Non-elitism"): "I think it is B", "a dog" and "D and E" name no single option.
_AFTER_LETTER = r"(?:[.:)\]!,;]|$|\s(?!\s*(?-i:[a-z])))"
_LETTER = r"[\"'“‘]?[(\[]?([A-Za-z])[)\]]?[\"'”’]?"
"""An option's letter, in brackets or quotes or neither: "D", "(D)", "[D]", '"D"'."""
_ANSWER_IS_WORDS = r"(?:the\s+)?(?:final\s+|correct\s+)?(?:answer|option|choice)\s*(?:is|:|：|=)?\s*"
""""The answer is", "Final answer:", "Option": what may stand before an option's letter (case aside)."""
_LEAD_IN = r"(?:i\s+(?:think|believe|guess|would\s+say|choose|pick)(?:\s+that)?\s+|my\s+)?"
""""I think", "I believe that", "My": what may stand before "the answer is" (case aside)."""
_IS_CORRECT = (r"\s+(?:is|would\s+be|seems\s+to\s+be)\s+(?:the\s+)?(?:correct|right|best|answer)\b"
               r"(?:\s+(?:answer|option|choice))?")
""""is correct", "is the answer", "is the correct option": what may follow an option's letter (case aside)."""
_CHOICE_FORMS = [
    re.compile(r"^" + _LETTER + _AFTER_LETTER),  # "D", "(D)", "[D]", "D.", "D!", "D, as …", "D) text", "D Text"
    re.compile(r"^" + _LEAD_IN + _ANSWER_IS_WORDS + r"(?:option\s+|choice\s+)?" + _LETTER + _AFTER_LETTER, re.I),
    re.compile(r"^(?:option\s+|choice\s+)?" + _LETTER + _IS_CORRECT, re.I),  # "D is correct", "A is the answer"
    re.compile(r"^" + _LEAD_IN + r"(?:option|choice)\s+" + _LETTER + _AFTER_LETTER, re.I),  # "I choose option D"
]


_CONNECTIVE = r"(?:[,;/&+]|\b(?i:and|or)\b)"
"""What joins two options named together: a comma, a slash, 'and', 'or'…"""

_MAYBE = r"(?i:maybe|possibly|perhaps|also)"
_ANOTHER_OPTION = re.compile(r"\s*[(\-–—]?\s*(?:" + _CONNECTIVE + r"\s*(?:(?:" + _MAYBE + r"|(?i:option|choice))\s+)?|"
                             + _MAYBE + r"\s+)[(\[]?([A-Z])[)\]]?(?!\w)")
"""A second option right after the first (``(D) and (E)``, ``(C), (D)``, ``(C) or D``, ``D (or E)``, ``D. Or maybe
E``): an answer that names two options names none. Not a letter in an option's text (``B. Both in (A) and (B)``)."""


_LATER_OPTION = re.compile(_CONNECTIVE + r"\s*[(\[]([A-Z])[)\]]")
"""An option's mark after a connective further on (``(C) Parabola or (D) Ellipse``): a hedge, unless an option's
mark stands between the first one and it (the option's own text lists options: ``(D) Both (A) and (B)``)."""

_MARK = re.compile(r"[(\[]([A-Z])[)\]]")
_LETTERS_ONLY = re.compile(r"(?:[\s,;/&+\-–—]*[(\[]?[A-H][)\]]?\.?)+[\s.!?]*")
"""Nothing but option letters after the first (``C D``, ``A B C D``, ``(A) (B)``, ``D E!``, ``D - E``): a hedge
between them."""


def _hedged(text: str, letter: str) -> bool:
    """Whether `text`, what follows an answer's option letter, names another option as well."""
    if _LETTERS_ONLY.fullmatch(text) and set(re.findall(r"[A-H]", text)) - {letter}:
        return True
    for later in _LATER_OPTION.finditer(text):
        if later.group(1) != letter and not _MARK.search(text, 0, later.start()):
            return True
    return False


def choice_letter(text: str) -> str | None:
    """The option letter of a multiple-choice answer: "D", "(D)", "D. text", "Answer: D", "The answer is D",
    "My answer: D", "I think the answer is D", "D is correct", "A is the answer", "Option D",
    "\\boxed{\\text{D}}", "$D$", "Answer: **D**", "（Ｄ）". None for an answer that names two ("(D) and (E)"), and
    for a letter that is only a sentence's first word ("I think it is B", "A plausible reading …")."""
    from arpo_env.tags import boxed, unwrap_text

    text = str(text).strip()
    inner = boxed(text)
    text = unicodedata.normalize("NFKC", unwrap_text(inner if inner is not None else text))  # full width: "（Ｄ）"
    text = text.replace("*", "").strip()  # Markdown's emphasis
    for form in _CHOICE_FORMS:
        m = form.match(text)
        if m:
            letter = m.group(1).upper()
            other = _ANOTHER_OPTION.match(text, m.end())
            if other is not None and other.group(1) != letter or _hedged(text[m.end():], letter):
                return None
            return letter
    return None


_OPTION = re.compile(r"^[ \t]*\(?([A-Z])[.):][ \t]+(?=\S)", re.M)


def choice_options(question: str) -> dict[str, str]:
    """The options of a multiple-choice question by letter: the lines ``A. text`` (``A)``, ``(A)``) after its last
    ``Answer Choices:``, as HLE writes them; an option's text runs to the next option."""
    question = str(question)
    at = question.rfind("Answer Choices:")
    if at < 0:
        return {}
    found = list(_OPTION.finditer(question, at))
    ends = [m.start() for m in found[1:]] + [len(question)]
    return {m.group(1): question[m.end():end].strip() for m, end in zip(found, ends)}


_ANSWER_IS = re.compile(r"^\W*" + _ANSWER_IS_WORDS, re.I)


def named_option(prediction: str, question: str | None) -> str | None:
    """The letter of the one option of `question` whose text `prediction` is, up to case, punctuation and articles
    (``Weak Non-Sadism`` for ``D. Weak Non-Sadism``), or whose letter and text it is (``F. A, B, C``, ``The answer
    is (F) A, B, C``: an option's text that lists options read as a hedge between them); None when it is no
    option's text, or several options'."""
    from arpo_env.tags import boxed, unwrap_text

    if not question:
        return None
    inner = boxed(str(prediction))
    written = unwrap_text(inner if inner is not None else prediction)
    said, bare = normalize_answer(written), normalize_answer(_ANSWER_IS.sub("", written))
    letters = [letter for letter, text in choice_options(question).items()
               if said and (normalize_answer(unwrap_text(text)) == said
                            or normalize_answer(f"{letter} {unwrap_text(text)}") in (said, bare))]
    return letters[0] if len(letters) == 1 else None


def names_another_option(prediction: str, letter: str, question: str | None) -> bool:
    """Whether `prediction`, read as option `letter`, goes on to name another option of `question` by its letter
    and the start of its text after a connective (``D. 12 or E. 15``, ``D) 12, or maybe E) 15``): a hedge that
    `choice_letter` cannot tell from an option's own text (``S and D. The number…``) without the options."""
    from arpo_env.tags import unwrap_text

    if not question:
        return False
    said = unicodedata.normalize("NFKC", str(prediction))
    for other, text in choice_options(question).items():
        start = " ".join(normalize_answer(unwrap_text(text)).split()[:3])
        if other == letter or not start:
            continue
        mark = re.compile(_CONNECTIVE + r"\s*(?:" + _MAYBE + r"\s+)?\(?" + other + r"(?:\)|[.:])?\s+")
        if any(f"{normalize_answer(said[m.end():m.end() + 4 * len(start) + 40])} ".startswith(start + " ")
               for m in mark.finditer(said)):  # its words, whole: "E. 150" is not E's "15"
            return True
    return False


def qa_score(prediction: str | None, gold: Any, meta: Mapping[str, Any] | None = None) -> float:
    """The score of a QA answer: the option letter for multiple-choice items, else the best F1 over aliases. An
    answer that is the whole text of one option (`named_option`, when `meta` holds the question) names that option,
    before any letter read from it (``A Gaussian blur …`` is not option A).
    LaTeX text wrappers and math delimiters (``\\text{Paris}``, ``\\(5.57\\text{ mol}\\)``) are unwrapped first, in
    the answer and in each alias alike: HLE's gold answers hold them, and unwrapped on one side only, the gold
    answer itself scored 0.5 against itself."""
    if prediction is None:
        return 0.0
    if (meta or {}).get("answer_type") == "multipleChoice":  # the letter, or an option's text in full
        question = (meta or {}).get("question")
        letter = named_option(prediction, question)
        if letter is None:
            letter = choice_letter(prediction)
            letter = None if letter is not None and names_another_option(prediction, letter, question) else letter
        golds = aliases(gold)
        return float(letter is not None and bool(golds) and letter == choice_letter(golds[0]))
    return best_f1(*_unwrapped(prediction, gold))


def _unwrapped(prediction: str, gold: Any) -> tuple[str, list[str]]:
    """The answer and the gold's aliases with LaTeX's wrappers taken off alike (`tags.unwrap_text`)."""
    from arpo_env.tags import unwrap_text

    return unwrap_text(prediction), [unwrap_text(g) for g in aliases(gold)]


def qa_exact_match(prediction: str | None, gold: Any) -> float:
    """Exact match (SQuAD normalisation) of a QA answer against any alias, LaTeX wrappers unwrapped on both sides
    as `qa_score` does (``\\text{Paris}`` matched no ``Paris`` while its F1 was 1)."""
    if prediction is None:
        return 0.0
    return best_em(*_unwrapped(prediction, gold))
