# ruff: noqa: RUF001 -- Chinese text uses full-width punctuation on purpose
"""Features of a prompt: word n-grams in a few positional namespaces plus structural cues.

Everything here runs per request on the gateway's hot path, so it is built from C-speed pieces (regexes,
``str`` methods, set operations) and reads at most a head and a tail window of long prompts: the
instruction that decides the shape of the reply sits at the start or at the end, rarely in the middle of
a pasted document. Training uses exactly the same code, so what the model learns is what it sees live.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import add
from typing import TYPE_CHECKING

from classifiers.request import RequestView

if TYPE_CHECKING:
    from classifiers._grams import DenseReader

HEAD, TAIL = 250, 300  # scanned window of the main text (structural cues)
TAIL_NS = 240  # the "instruction" windows: last and first characters of the main text
HEAD_NS = 160
CONTEXT_WINDOW = 600  # head and tail of the chat context
CJK_MAX = 800
CONTEXT_HEAD_NS = 300  # the instruction window of the chat context (its system prompt)
CONTEXT_CUES = ("extract", "role", "code", "format", "creative")

_CJK_RANGES = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[^\W\d_{_CJK_RANGES}]+|\d+|[^\w\s]")
_CJK = re.compile(rf"[{_CJK_RANGES}]+")
_DIGIT_RUN = re.compile(r"[0-9]+")
_FROM_KANA = re.compile(
    "[\u3040-\U0010ffff]"
)  # a character that may start a CJK run (``max`` of a str is slow)
# _TOKEN on ASCII text, spelled out as byte ranges: sre tests a character against a bitmap instead of
# Unicode categories, half the time. On ASCII, ``\w`` is [a-zA-Z0-9_] and ``\s`` is [ \t\n\r\v\f] plus the
# separators \x1c-\x1f (tests/classifiers/test_fast_path.py checks all 128 characters).
_TOKEN_ASCII = re.compile(r"[a-zA-Z]+|[0-9]+|[^a-zA-Z0-9_ \t\n\r\x0b\x0c\x1c-\x1f]")
_NUMSEQ = re.compile(r"\d+(?:\.\d+)?(?:\s*[,;]\s*-?\d+(?:\.\d+)?){3,}")
_KV_LINE = re.compile(r"^\s*[-\w.\[\]]{1,40}\s*[:=]\s*\S", re.MULTILINE)
_BULLET = re.compile(r"^\s*(?:[-*•]|\d{1,3}[.)])\s+\S", re.MULTILINE)
_SPEAKER = re.compile(
    r"^\s*(?:human|user|assistant|system|ai|bot|customer|agent|me|you|q|a|用户|助手)\s*[:：]",
    re.IGNORECASE | re.MULTILINE,
)
_SYMBOLS = "{}[]();=<>|$\\`"
_SYMBOL_BYTES = _SYMBOLS.encode()


def _lex(words: str) -> frozenset[str]:
    """A cue lexicon: unigrams, bigrams ("a b") and CJK words, matched against the instruction windows."""
    return frozenset(w.strip() for w in words.split(",") if w.strip())


_NUMBERS = [
    "#",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "twelve",
    "fifteen",
    "twenty",
    "thirty",
    "fifty",
    "hundred",
]
CODE_KEYWORDS = _lex(
    "def, return, function, class, import, select, from, where, public, void, int, const, let, var, printf, "
    "elif, lambda, struct, fn, func, async, await, echo, grep, sudo, npm, pip, null, true, false, none, "
    "= >, - >, : :, = =, ! =, & &, | |, # include"
)
# instruction cues
CUES: dict[str, frozenset[str]] = {
    "repeat": _lex(
        "repeat, copy, duplicate, verbatim, word for, continue the, continue this, next five, next ten, "
        "next #, "
        "count from, count up, count down, sequence, series, echo, retype, reproduce, exactly, verbatim, "
        "again, as written, as is, unchanged, same order, type out, write out, word by, character for, "
        "copies, repetition, repeated, over and, "
        + ", ".join(f"{n} {u}" for n in _NUMBERS for u in ("times", "copies", "repetitions"))
        + ", 重复, 复制, 抄写, 照抄, 数列, 遍"
    ),
    "code": _lex(
        "code, function, python, javascript, typescript, java, c +, c #, rust, golang, sql, query, regex, "
        "regular expression, bash, shell, script, command, html, css, class, method, compile, bug, refactor, "
        "unit test, program, implement, snippet, api, 代码, 函数, 程序, 脚本, 正则"
    ),
    "format": _lex(
        "json, yaml, yml, csv, xml, toml, ini, markdown, table, config, configuration, dockerfile, template, "
        "fill in, form, schema, format, fields, columns, 表格, 模板, 配置, 格式"
    ),
    "extract": _lex(
        "extract, pull out, find all, list all, identify the, based on, according to, from the, "
        "answer the, context, passage, the text, the article, the document, the following, 提取, 抽取, 根据"
    ),
    "rewrite": _lex(
        "summarize, summarise, summary, tl, tldr, rewrite, rephrase, paraphrase, proofread, correct, "
        "shorten, simplify, translate, edit, polish, condense, convert, key points, "
        "总结, 摘要, 概括, 改写, 润色, 翻译"
    ),
    "config": _lex(
        "docker, compose, dockerfile, kubernetes, k8s, helm, manifest, nginx, apache, yaml, yml, toml, ini, "
        "env, properties, settings, crontab, cron, systemd, pipeline, workflow, ci, terraform, ansible, "
        "tsconfig, package . json, pyproject, gitignore, editorconfig, eslint, prettier, webpack, config, "
        "configuration, . conf, playbook, values . yaml, 配置"
    ),
    "numbers": _lex(
        "numbers, number, digits, odd, even, multiples, powers, squares, primes, fibonacci, triangular, "
        "terms, "
        "next #, up to, from #, to #, through, comma separated, numbered, count, sequence, series, one "
        "through, "
        "# through, integers, 数列, 数字"
    ),
    "template": _lex(
        "template, format, structure, headings, sections, fields, fill, fill in, placeholder, card, form, "
        "report, checklist, minutes, invoice, table, columns, rows, entry, entries, each of, for each, "
        "模板, 格式"
    ),
    "math": _lex("how many, how much, calculate, solve, equation, sum of, percent, total, 多少, 计算"),
    "creative": _lex(
        "story, poem, poetry, song, lyrics, haiku, novel, fiction, imagine, character, essay, limerick, "
        "fairy tale, screenplay, joke, creative, myth, 故事, 诗, 小说, 歌词"
    ),
    "opinion": _lex(
        "you think, your opinion, your view, your take, your favorite, your favourite, do you, should i, "
        "advice, tips, ideas, suggest, recommend, how can, what would, why do, why is, why are, feel, "
        "meaning of, brainstorm, help me, opinion, 你觉得, 你认为, 看待, 建议, 感想, 怎么"
    ),
    "role": _lex(
        "pretend, act as, you are, role -, role play, roleplay, in character, imagine you, let ', play a, "
        "persona, 扮演, 假设"
    ),
    "chat": _lex("hi, hello, hey, good morning, thanks, thank you, lol, ugh, guess what, 你好, 聊聊, 聊天"),
}


_CUE_KEYS = [(f"cue_{name}", lex) for name, lex in CUES.items()]
_CONTEXT_KEYS = [(f"ctx_{name}", CUES[name]) for name in CONTEXT_CUES]
_CUE_NAMES = [key for key, _ in _CUE_KEYS]
_CONTEXT_NAMES = [key for key, _ in _CONTEXT_KEYS]

# Character n-gram windows. Characters carry across languages and scripts where word lists cannot; the
# instruction of a long prompt sits in its head or tail, so those are read apart from the body (the pasted
# passage, code or table), and each window is its own namespace: "copy lines 3-5" in the tail weighs as an
# instruction whatever the pasted text is about.
CHAR_HEAD = 120
CHAR_TAIL = 160
CHAR_BODY = 64  # read at each end of the body (the text between head and tail)
CHAR_CONTEXT = 300
_HT_ORDERS = (2, 3, 4)  # orders 2-4 lifted LOSO over 3 alone (classifiers/VARIANTS.md)
_BODY_ORDERS = (3,)
_CONTEXT_ORDERS = (3,)
# The last segment of a prompt that holds pasted material: its last line, or last sentence when that line is
# long, read as a namespace of its own. The question after a passage ("Who is retiring, and when?") or the
# instruction below it ("Copy the last sentence of the paragraph above.") decides the reply's shape whatever
# the passage says; in the tail window it is mixed with the passage's own words. The first segment, its
# character grams and its own head/tail weights for long prompts were measured too and lost on unseen
# sources (classifiers/VARIANTS.md).
LAST_MAX = 300  # a longer last segment is part of the passage, not an instruction
LAST_MIN_TEXT = CHAR_HEAD + CHAR_TAIL  # a shorter prompt has no pasted body to set its last segment apart
_SEGMENT_END = re.compile(r"(?<=[.!?;:])\s+|(?<=[\u3002\uff01\uff1f\uff1a])|\n")
_NONZERO_DIGIT = re.compile("[1-9]")  # ASCII digits only: other digits stay as they are in the char grams


@dataclass(slots=True)
class Features:
    """Sparse parts are namespaced sets of strings; dense cues are floats roughly in [0, 1].

    With ``extract(..., char_grams=False)`` the character namespaces' sets stay empty and ``chars`` holds
    their normalised window texts instead, for a model that counts the grams itself (``classifiers._grams``);
    with ``hashed_words=True`` the word namespaces' sets stay empty where ``words`` holds their grams' hashes.
    """

    sparse: dict[str, set[str]]  # namespace -> grams (see NAMESPACES)
    dense: dict[str, float]
    chars: dict[str, str] | None = None  # character namespace -> its window's text, grams not built
    # word namespace -> its distinct grams as packed hashes (``_grams.word_hashes``), sets not built
    words: dict[str, bytes] | None = None


# wh/wt: word unigrams+bigrams of the head and tail windows; f: first words; x: words of the chat context;
# ch/ct/cb/cx: character n-grams of the head, tail, body and chat context; wl: words of the last segment of
# a long prompt
NAMESPACES = ("wh", "wt", "f", "x", "ch", "ct", "cb", "cx", "wl")
# the character namespaces and the gram orders each is read with
CHAR_ORDERS = {"ch": _HT_ORDERS, "ct": _HT_ORDERS, "cb": _BODY_ORDERS, "cx": _CONTEXT_ORDERS}
# the word namespaces ``extract(..., hashed_words=True)`` hands over as hashes (the first words stay a set)
HASHED_NAMESPACES = ("wh", "wt", "wl", "x")


def window(text: str) -> str:
    if len(text) <= HEAD + TAIL:
        return text
    return text[:HEAD] + "\n" + text[-TAIL:]


def _norm_py(text: str) -> str:
    """Lower case, digits folded to 0, whitespace runs to one space: all C-speed ``str`` methods.

    The fold runs only on a text with a digit to fold: a regex search costs a tenth of ``str.translate``
    (which takes a per-character table lookup outside ASCII), and most windows hold none.
    """
    low = text.lower()
    if _NONZERO_DIGIT.search(low):
        low = _NONZERO_DIGIT.sub("0", low)
    return " ".join(low.split())


def _c_norm() -> Callable[[str], str]:
    """``classifiers._grams.norm`` where the package was built with it: the same text in one pass
    (``str.lower`` still lowers a text outside ASCII); otherwise the Python definition."""
    try:
        from classifiers._grams import norm
    except ImportError:
        return _norm_py
    return norm


_norm = _c_norm()


def _chars(text: str, orders: tuple[int, ...]) -> set[str]:
    """Every substring of each order in ``orders``.

    Grams are built by concatenating the shorter ones (``text[i:i+2] + text[i+2:i+4]``) rather than by
    slicing: ``map(operator.add, ...)`` runs in C without a slice object per gram, a third less time than
    ``map(text.__getitem__, slices)`` for the same set.
    """
    pairs = list(map(add, text, text[1:]))
    grams: set[str] = set()
    for n in orders:
        if n == 2:
            grams.update(pairs)
        elif n == 3:
            grams.update(map(add, pairs, text[2:]))
        elif n == 4:
            grams.update(map(add, pairs, itertools.islice(pairs, 2, None)))
        else:
            grams.update(text[i : i + n] for i in range(len(text) - n + 1))
    return grams


def char_windows(text: str) -> tuple[str, str, str]:
    """Head, tail and (sampled) body of ``text``. A short text is its own head and tail; its body is empty."""
    head = _norm(text[:CHAR_HEAD])
    if len(text) <= CHAR_HEAD:  # the whole text is both windows
        return head, head, ""
    tail = _norm(text[-CHAR_TAIL:])
    if len(text) <= CHAR_HEAD + CHAR_TAIL:
        return head, tail, ""
    if len(text) - CHAR_HEAD - CHAR_TAIL > 2 * CHAR_BODY:
        # the two ends of the body, sliced from the text (a copy of the whole body first would cost a
        # long prompt's length)
        body = text[CHAR_HEAD : CHAR_HEAD + CHAR_BODY] + "\n" + text[-CHAR_TAIL - CHAR_BODY : -CHAR_TAIL]
    else:
        body = text[CHAR_HEAD:-CHAR_TAIL]
    return head, tail, _norm(body)[: 2 * CHAR_BODY]


def last_segment(text: str) -> str:
    """The last line (or last sentence of a long last line) of a prompt with a pasted body; empty when the
    prompt is short or the segment too long to be an instruction."""
    if len(text) <= LAST_MIN_TEXT:
        return ""
    tail = text[-LAST_MAX - 1 :].rstrip()
    # a line break is a segment end, so only the last line needs the regex (the one scan of a long prompt)
    pieces = _SEGMENT_END.split(tail[tail.rfind("\n") + 1 :])
    # a CJK mark ends a zero-width split, so the final piece may be empty: the segment is the one before it
    last = (pieces[-1] or pieces[-2] if len(pieces) > 1 else pieces[-1]).strip()
    return last if len(last) < LAST_MAX else ""


def _ngrams(tokens: list[str]) -> set[str]:
    grams = set(tokens)
    grams.update(map(" ".join, itertools.pairwise(tokens)))
    return grams


def _tokens(text: str) -> list[str]:
    """Words, digit runs as ``#``, and single punctuation marks.

    In ASCII text the only digits are 0-9, whose runs are exactly the tokens that become ``#``, and a
    ``#`` is a token of its own: replacing the runs before tokenising gives the same list with no
    per-token Python loop (a third of the classifier's time on a long prompt). Other text may hold
    digits that ``\\d`` does not match (superscripts) and takes the token-by-token way.
    """
    if text.isascii():
        # the digit test is ten memchr scans; the substitution's regex scan costs ten times more
        if any(map(text.__contains__, "0123456789")):
            text = _DIGIT_RUN.sub("#", text)
        return _TOKEN_ASCII.findall(text)
    tokens = _TOKEN.findall(text)
    # ``any`` over ``map`` stays in C; the per-token Python loop runs only when a token is to be replaced
    if any(map(str.isdigit, tokens)):
        return ["#" if t.isdigit() else t for t in tokens]
    return tokens


def _word_grams_py(text: str) -> tuple[list[str], set[str]]:
    """The tokens of ``text`` and their unigrams and bigrams: the definition the C version is held to."""
    tokens = _tokens(text)
    return tokens, _ngrams(tokens)


def _c_word_grams() -> Callable[[str], tuple[list[str], set[str]]]:
    """``classifiers._grams.word_grams`` where the package was built with it: the same list and set in one
    pass without the regex engine (a third of the classifier's time on a long prompt); otherwise the
    Python definition."""
    try:
        from classifiers._grams import word_grams
    except ImportError:
        return _word_grams_py
    return word_grams


word_grams = _c_word_grams()


class _HashedWords:
    """The C word reader with the lexicons as tables of bits, where the extension is built.

    ``word_hashes`` gives a window's distinct word grams as packed hashes; a ``GramTable`` of the model's
    weights sums them (``classifiers/model.py``) and the tables below answer the cue lexicons (one bit
    each), the code keywords (a count) and the chat context's cues, so a window's words never become Python
    strings. The results are those of the sets (``tests/classifiers/test_grams.py``).
    """

    def __init__(self) -> None:
        from classifiers._grams import GramTable, word_hashes

        self.read = word_hashes
        self.cues = GramTable(_lexicon_bits([lex for _, lex in _CUE_KEYS]))
        self.context_cues = GramTable(_lexicon_bits([lex for _, lex in _CONTEXT_KEYS]))
        self.code = GramTable(dict.fromkeys(CODE_KEYWORDS, 1.0))


def _lexicon_bits(lexicons: list[frozenset[str]]) -> dict[str, float]:
    bits: dict[str, int] = {}
    for i, lex in enumerate(lexicons):
        for gram in lex:
            bits[gram] = bits.get(gram, 0) | 1 << i
    return {g: float(b) for g, b in bits.items()}


def _hashed_words() -> _HashedWords | None:
    """None where the extension is missing or refuses a lexicon (two of its grams share a hash)."""
    try:
        return _HashedWords()
    except (ImportError, ValueError):
        return None


HASHED = _hashed_words()


@lru_cache(maxsize=256)
def _flags(bits: int, n: int) -> tuple[float, ...]:
    """The cue values of a lexicon bit mask: 1.0 where the bit is set."""
    return tuple(1.0 if bits >> i & 1 else 0.0 for i in range(n))


def _cjk_grams(text: str) -> set[str]:
    grams: set[str] = set()
    budget = CJK_MAX
    for run in _CJK.findall(text):
        run = run[:budget]
        grams.update(run)
        grams.update(map(add, run, run[1:]))
        budget -= len(run)
        if budget <= 0:
            break
    return grams


def _log(x: float, scale: float) -> float:
    return math.log1p(x) / scale


_log1p = math.log1p


def _dense(
    text: str,
    scanned: str,
    n_tokens: int,
    hashes: int,
    code_kw: int,
    cues: Sequence[float],
    context_cues: Sequence[float] | None,
    view: RequestView,
) -> dict[str, float]:
    """The structural cues. Each scan, regex and count runs only where a cheap C-level test says it can find
    something (a regex that needs a ``:`` is not run on a text without one); what a skipped one would have
    given is the same 0 (tests/classifiers/test_fast_path.py holds it to the plain definition).

    The word-level inputs come counted: ``n_tokens`` tokens of the scanned window, ``hashes`` of them ``#``,
    ``code_kw`` distinct code keywords among its grams, and one 0/1 value per cue lexicon (``_CUE_KEYS``)
    and, with a chat context, per context lexicon (``_CONTEXT_KEYS``): from the sets or the hashed reader."""
    n = max(len(scanned), 1)
    multiline = "\n" in scanned
    if multiline:
        lines = [ln for ln in map(str.strip, scanned.split("\n")) if ln]
        distinct = len(set(lines))
        max_rep = (1 if lines else 0) if distinct == len(lines) else max(Counter(lines).values())
        tabular = sum(1 for ln in lines if ln.count(",") >= 2 or ln.count("|") >= 2 or ln.count("\t") >= 2)
    else:  # one line at most: no duplicates, no indent, no paragraphs
        line = scanned.strip()
        lines = [line] if line else []
        distinct = max_rep = len(lines)
        tabular = 1 if line and (line.count(",") >= 2 or line.count("|") >= 2 or line.count("\t") >= 2) else 0
    nl = max(len(lines), 1)
    # digit runs are "#" tokens (so is a literal "#"): without one, no regex that needs a digit can match
    # UTF-8 keeps ASCII symbols as single bytes and writes other characters with bytes >= 0x80: the symbols
    # are the bytes that a C-speed ``bytes.translate`` deletes (one pass instead of a ``count`` per symbol)
    encoded = scanned.encode()
    symbols = len(encoded) - len(encoded.translate(None, _SYMBOL_BYTES))
    # the text without its trailing white space, read from its tail: ``rstrip`` would copy a long prompt that
    # ends in a line break
    tail = text[-64:].rstrip()
    if tail or len(text) <= 64:
        stripped, end = tail, len(text) - (min(len(text), 64) - len(tail))
    else:  # 64 characters of white space or more at the end
        stripped = text.rstrip()
        end = len(stripped)
    colon = ":" in scanned or "：" in scanned
    head = scanned[:600]  # the whole window (at most HEAD + TAIL + 1 characters)
    if head.isascii():
        non_ascii = 0.0
    else:
        size = len(encoded) if head is scanned else len(head.encode())
        non_ascii = min(1.0, (size - len(head)) / (2 * max(len(head), 1)))
    numseq = 0.0
    if hashes:
        instruction = text[:HEAD_NS] + "\n" + text[-TAIL_NS:]
        # a sequence has three separators at least: without them the regex (tried at every digit) can't match
        if instruction.count(",") + instruction.count(";") >= 3 and _NUMSEQ.search(instruction):
            numseq = 1.0
    questions = scanned.count("?") + scanned.count("？")
    context = view.context
    out = {
        "len": _log1p(len(text)) / 9.0,
        "lines": _log1p(len(lines)) / 5.0,
        "dup_lines": (len(lines) - distinct) / nl,
        "max_rep": _log1p(max_rep - 1) / 3.0 if max_rep > 1 else 0.0,
        "fence": 1.0 if "```" in scanned else 0.0,
        "symbols": min(1.0, 12.0 * symbols / n) if symbols else 0.0,
        "indent": (scanned.count("\n    ") + scanned.count("\n\t")) / nl if multiline else 0.0,
        "json_keys": _log1p(scanned.count('":') + scanned.count("':")) / 3.0 if colon else 0.0,
        "kv_lines": len(_KV_LINE.findall(scanned)) / nl if colon or "=" in scanned else 0.0,
        "bullets": len(_BULLET.findall(scanned)) / nl
        if hashes or "-" in scanned or "*" in scanned or "•" in scanned
        else 0.0,
        "tabular": tabular / nl,
        "digits": min(1.0, 3.0 * hashes / max(n_tokens, 1)) if hashes else 0.0,
        "numseq": numseq,
        "code_kw": _log1p(code_kw) / 2.5,
        "question_end": 1.0 if stripped.endswith(("?", "？")) else 0.0,
        "questions": _log1p(questions) / 2.5 if questions else 0.0,
        "speakers": _log1p(len(_SPEAKER.findall(scanned))) / 2.5 if colon else 0.0,
        "paragraphs": _log1p(scanned.count("\n\n")) / 3.0 if multiline else 0.0,
        "non_ascii": non_ascii,
        "turns": _log1p(view.turns - 1) / 3.0,
        "system": 1.0 if view.has_system else 0.0,
        "context_len": _log1p(len(context)) / 9.0 if context else 0.0,
        "empty": 1.0 if not stripped else 0.0,
    }
    if multiline and end > CHAR_HEAD + CHAR_TAIL:
        out.update(_layout(text, end))
    out.update(zip(_CUE_NAMES, cues, strict=True))
    if context_cues is not None:
        out.update(zip(_CONTEXT_NAMES, context_cues, strict=True))
    return out


# the keys of ``_dense`` before the layout cues, in order, and the layout cues' keys (``_layout``): the C
# reader writes the same dict under these names
DENSE_BASE = (
    "len",
    "lines",
    "dup_lines",
    "max_rep",
    "fence",
    "symbols",
    "indent",
    "json_keys",
    "kv_lines",
    "bullets",
    "tabular",
    "digits",
    "numseq",
    "code_kw",
    "question_end",
    "questions",
    "speakers",
    "paragraphs",
    "non_ascii",
    "turns",
    "system",
    "context_len",
    "empty",
)
DENSE_LAYOUT = tuple(
    f"layout_{end}_{what}" for end in ("last", "first") for what in ("line", "question", "colon")
)
# ``DenseReader.read``: ``_dense``'s inputs with the view's fields it reads (turns, system prompt, context)
DenseRead = Callable[
    [str, str, int, int, int, Sequence[float], Sequence[float] | None, int, bool, int], dict[str, float]
]


def _c_dense_reader() -> DenseReader | None:
    """``classifiers._grams.DenseReader`` under the cues' names where the package was built with it."""
    try:
        from classifiers._grams import DenseReader
    except ImportError:
        return None
    return DenseReader(DENSE_BASE, DENSE_LAYOUT, tuple(_CUE_NAMES), tuple(_CONTEXT_NAMES))


def _c_dense() -> DenseRead | None:
    """``_dense`` in C (``classifiers._grams.DenseReader``) where the package was built with it: the same
    dict, key for key and float for float, in one pass over the window
    (tests/classifiers/test_grams_dense.py); None otherwise, and ``_dense`` computes them."""
    reader = _c_dense_reader()
    if reader is None:
        return None
    read: DenseRead = reader.read
    return read


# the reader itself hands its names to the C scorer (``classifiers/model.py``)
DENSE_READER = _c_dense_reader()
DENSE_READ: DenseRead | None = None if DENSE_READER is None else DENSE_READER.read


_QUESTION_ENDS = ("?", "？", "؟", ";", "\u037e", "।")  # Latin, CJK, Arabic, Greek, Devanagari question marks


def _layout(text: str, end: int | None = None) -> dict[str, float]:
    """Where the instruction sits around pasted material, in any language: a short first or last line set
    apart from a long body ("copy lines 2-4 from the text below:", a passage and then its question).

    Reads ``text[:end]`` without copying it: only the first and the last line are sliced out (``partition``
    would copy all the rest of a long prompt, twice).
    """
    if end is None:
        end = len(text)
    if end <= CHAR_HEAD + CHAR_TAIL:
        return {}
    cut = text.find("\n", 0, end)
    if cut < 0:
        return {}
    first = text[:cut].strip()
    last = text[text.rfind("\n", 0, end) + 1 : end].strip()
    out = {}
    if 0 < len(last) <= 300:
        out["layout_last_line"] = 1.0
        if last.endswith(_QUESTION_ENDS):
            out["layout_last_question"] = 1.0
        elif last.endswith((":", "：")):
            out["layout_last_colon"] = 1.0
    if 0 < len(first) <= 300:
        out["layout_first_line"] = 1.0
        if first.endswith(_QUESTION_ENDS):
            out["layout_first_question"] = 1.0
        elif first.endswith((":", "：")):
            out["layout_first_colon"] = 1.0
    return out


def extract(
    view: RequestView,
    namespaces: Collection[str] = NAMESPACES,
    char_grams: bool = True,
    hashed_words: bool = False,
) -> Features:
    """The request's features; the grams of a namespace not in ``namespaces`` are not computed (a model
    without weights for it, such as the body's character grams, would only pay for them).

    ``char_grams=False`` leaves the character namespaces' sets empty and hands over their window texts in
    ``Features.chars`` instead (a short text's head and tail window as one object, as its sets are).
    ``hashed_words=True`` does the same for the word namespaces where the C reader is built: their grams'
    hashes in ``Features.words`` (a short text's head and tail window as one object); a window that holds
    CJK characters, whose cues read character pairs too, keeps the sets.
    """
    text = view.text
    scanned = window(text)
    tail_text = text[-TAIL_NS:]
    head_text = text[:HEAD_NS]
    cjk = not scanned.isascii() and _FROM_KANA.search(scanned) is not None
    ctx = view.context
    with_context = bool(ctx) and ("x" in namespaces or "cx" in namespaces)
    last = last_segment(text)
    sparse: dict[str, set[str]]
    words_hashed: dict[str, bytes] | None = None
    if hashed_words and HASHED is not None and not cjk:
        read = HASHED.read
        scanned_h, n_tokens, hashes, first_words = read(scanned.lower(), True)
        # a short text is its own head and tail window: one object, as the sets are
        tail_h = scanned_h if len(text) <= TAIL_NS else read(tail_text.lower(), True)[0]
        head_h = scanned_h if len(text) <= HEAD_NS else read(head_text.lower(), True)[0]
        bits = HASHED.cues.bits(head_h)
        if tail_h is not head_h:
            bits |= HASHED.cues.bits(tail_h)
        cues = _flags(bits, len(_CUE_KEYS))
        code_kw = int(HASHED.code.sum(scanned_h))
        context_cues = None
        if ctx:
            ctx_h = read(ctx[:CONTEXT_HEAD_NS].lower(), True)[0]
            context_cues = _flags(HASHED.context_cues.bits(ctx_h), len(_CONTEXT_KEYS))
        words_hashed = {
            "wh": head_h,
            "wt": tail_h,
            "wl": read(last.lower(), True)[0] if last else b"",
            "x": read(ctx[:CONTEXT_WINDOW].lower(), False)[0] if with_context else b"",
        }
        sparse = {"wl": set(), "wh": set(), "wt": set(), "f": set(), "x": set()}
    else:
        tokens, words = word_grams(scanned.lower())
        tail = words if len(text) <= TAIL_NS else word_grams(tail_text.lower())[1]
        head = words if len(text) <= HEAD_NS else word_grams(head_text.lower())[1]
        first_words = tuple([t for t in tokens[:6] if t.isalpha()][:2])
        n_tokens, hashes = len(tokens), tokens.count("#")
        code_kw = len(words & CODE_KEYWORDS)
        # a new set only where it differs from both windows (``words`` itself is never changed)
        cue_grams = head if tail is head else tail | head
        if cjk:
            cue_grams = cue_grams | _cjk_grams(head_text + "\n" + tail_text)
        cues = tuple([0.0 if cue_grams.isdisjoint(lex) else 1.0 for _, lex in _CUE_KEYS])
        context_cues = None
        if ctx:
            # the head of the chat context holds the system prompt: "answer from these documents" or a persona
            ctx_grams = word_grams(ctx[:CONTEXT_HEAD_NS].lower())[1]
            context_cues = tuple([0.0 if ctx_grams.isdisjoint(lex) else 1.0 for _, lex in _CONTEXT_KEYS])
        sparse = {
            "wl": word_grams(last.lower())[1] if last else set(),
            "wh": head,
            "wt": tail,
            "f": set(),
            "x": set(word_grams(ctx[:CONTEXT_WINDOW].lower())[0]) if with_context else set(),
        }
    first = sparse["f"]  # filled in place: the namespaces keep their order
    first.update(first_words[:1])
    if len(first_words) == 2:
        first.add(" ".join(first_words))
    ch, ct, cb = char_windows(text)
    if len(text) <= CHAR_HEAD:
        ct = ch  # one window: one object, as the twin namespaces' sets are one object
    cx = _norm(ctx[:CHAR_CONTEXT]) if with_context else ""
    if DENSE_READ is None:
        dense = _dense(text, scanned, n_tokens, hashes, code_kw, cues, context_cues, view)
    else:
        dense = DENSE_READ(
            text,
            scanned,
            n_tokens,
            hashes,
            code_kw,
            cues,
            context_cues,
            view.turns,
            view.has_system,
            len(ctx),
        )
    if not char_grams:
        sparse.update(ch=set(), ct=set(), cb=set(), cx=set())
        chars = {"ch": ch, "ct": ct, "cb": cb if "cb" in namespaces else "", "cx": cx}
        return Features(sparse=sparse, dense=dense, chars=chars, words=words_hashed)
    char_head = _chars(ch, _HT_ORDERS)
    sparse["ch"] = char_head
    sparse["ct"] = char_head if ct is ch else _chars(ct, _HT_ORDERS)
    sparse["cb"] = _chars(cb, _BODY_ORDERS) if "cb" in namespaces else set()
    sparse["cx"] = _chars(cx, _CONTEXT_ORDERS)
    return Features(sparse=sparse, dense=dense, words=words_hashed)


def as_dict(f: Features) -> dict[str, float]:
    """Flat feature dict for training: each namespace scaled to unit length, dense cues as they are."""
    out: dict[str, float] = {}
    for ns, grams in f.sparse.items():
        if grams:
            v = 1.0 / math.sqrt(len(grams))
            for g in grams:
                out[f"{ns}:{g}"] = v
    for k, v in f.dense.items():
        if v:
            out[f"d:{k}"] = v
    return out
