"""The shipped classifier: a linear model over ``features`` with its calibration folded into the weights.

Inference is plain Python over dicts and sets (no scikit-learn, no numpy) because a single scikit-learn
call costs more than the whole per-request budget; the character n-grams, half of that work in Python, are
counted by a small C extension where it was built (``classifiers/_grams.c``), to the same sums, and the words
of the windows read and looked up by it as hashes (``features.HASHED``). The artefact
is gzipped JSON: feature -> weight.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import repeat
from operator import mul
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from classifiers.calibration import P_FLOOR, Calibration, logit
from classifiers.features import (
    CHAR_ORDERS,
    CUES,
    DENSE_READER,
    HASHED,
    HASHED_NAMESPACES,
    NAMESPACES,
    Features,
    extract,
)
from classifiers.kinds import KIND_CUES, KINDS, kind_of
from classifiers.request import RequestView, record, view

if TYPE_CHECKING:
    from classifiers._grams import GramTable, Scorer


def _gram_table() -> type[GramTable] | None:
    """The C gram counter, or None where the package was built without a C compiler (the character grams
    then go through Python sets, about twice as slowly, to the same sums)."""
    try:
        from classifiers._grams import GramTable
    except ImportError:
        return None
    return GramTable


GRAM_TABLE = _gram_table()


def _python_weighted_sum(weights: dict[str, float], values: dict[str, float]) -> float:
    """The dense cues times their weights, in the cues' order: map/sum run in C; a missing weight is 0.0."""
    total: float = sum(map(mul, map(weights.get, values, repeat(0.0, len(values))), values.values()))
    return total


def _c_weighted_sum() -> Callable[[dict[str, float], dict[str, float]], float] | None:
    """``classifiers._grams.weighted_sum``: the same products added in the same order by the interpreter's
    own ``sum`` rules, without an iterator or a float object per cue; None where the extension is missing."""
    try:
        from classifiers._grams import weighted_sum
    except ImportError:
        return None
    c_sum: Callable[[dict[str, float], dict[str, float]], float] = weighted_sum
    return c_sum


WEIGHTED_SUM = _c_weighted_sum()


def _c_scorer() -> type[Scorer[Prediction]] | None:
    """``classifiers._grams.Scorer``: the whole prediction after the request's view in one call, the same
    floats as ``extract``, ``score``, ``calibrated`` and ``kind_of`` (tests/classifiers/test_grams_scorer.py);
    None where the extension is missing."""
    try:
        from classifiers._grams import Scorer
    except ImportError:
        return None
    return Scorer


MODEL_FILE = Path(__file__).parent / "model" / "model.json.gz"
FORMAT_VERSION = 3  # 3 added the calibration table; 2 (without it) still loads
READABLE_FORMATS = (2, 3)

Label = Literal["structured", "open-ended"]

# Request fields the prompt corpus cannot teach (every training row is a bare prompt): their effect is a
# fixed shift of the log-odds, sized by what they do to draft acceptance.
CONSTRAINED_SHIFT = 4.0  # JSON schema / regex / grammar: output is dictated by the constraint
TOOLS_SHIFT = 3.0  # the reply is likely a function call with JSON arguments
# a system prompt that asks for JSON or defines functions: less certain than the request fields (it may ask
# for JSON only some of the time), as strong as a guided choice
SYSTEM_JSON_SHIFT = 2.0
STOP_SHIFT = 0.3  # stop sequences at code or line ends go with templated output
TEMPERATURE_SLOPE = 1.2  # acceptance falls as temperature rises; 0.8 is neutral
SHORT_OUTPUT_SHIFT = -0.3  # a handful of tokens leaves little for the draft model to win


@record
class Prediction:
    p_structured: float
    label: Label
    kind: str


NEUTRAL = Prediction(0.5, "open-ended", "qa")
SCORER = _c_scorer()


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def request_shift(v: RequestView) -> dict[str, float]:
    """Log-odds shifts from request fields, by name (for ``explain``)."""
    out: dict[str, float] = {}
    if v.constrained:
        out["request:constrained"] = CONSTRAINED_SHIFT * v.constrained
    if v.tools:
        out["request:tools"] = TOOLS_SHIFT
    elif v.system_json:
        out["request:system_json"] = SYSTEM_JSON_SHIFT
    if v.stop_structured:
        out["request:stop"] = STOP_SHIFT
    if v.temperature is not None:
        out["request:temperature"] = max(-1.5, min(1.0, -TEMPERATURE_SLOPE * (v.temperature - 0.8)))
    if v.max_tokens is not None and 0 < v.max_tokens < 32:
        out["request:max_tokens"] = SHORT_OUTPUT_SHIFT
    return out


def _shift(v: RequestView) -> float:
    """The sum of ``request_shift``; no dict when no field applies (most requests)."""
    if (
        v.constrained
        or v.tools
        or v.system_json
        or v.stop_structured
        or v.temperature is not None
        or v.max_tokens is not None
    ):
        return sum(request_shift(v).values())
    return 0.0


# Namespaces that hold the same set on a short prompt (``extract`` passes one object for both): the
# head and tail word windows within HEAD_NS characters, the character windows within CHAR_HEAD.
TWINS = (("wh", "wt"), ("ch", "ct"))
# one namespace's share of the score: (namespace, its weights, twin namespace, merged twin table)
_Step = tuple[str, dict[str, float], str | None, dict[str, float] | None]


@dataclass(slots=True)
class Classifier:
    bias: float
    sparse: dict[str, dict[str, float]]  # namespace -> gram -> weight
    dense: dict[str, float]
    threshold: float = 0.5
    meta: dict[str, Any] = field(default_factory=dict)
    calibration: Calibration | None = None  # without it the log-odds are read through the sigmoid
    used: frozenset[str] = field(init=False)  # the namespaces with weights: the others are not extracted
    # (namespace, table, twin namespace, merged table) per namespace with weights, in NAMESPACES order; built
    # from ``sparse`` at construction, like ``used``
    _plan: list[_Step] = field(init=False, repr=False, compare=False)
    # ``_plan`` without the namespaces whose grams come as texts or hashes rather than sets, by (character
    # windows given as texts, words given as hashes): their sets are empty then, so ``score`` skips them
    _set_plans: dict[tuple[bool, bool], list[_Step]] = field(init=False, repr=False, compare=False)
    # per character namespace with weights: (namespace, gram orders, its table hashed for
    # ``classifiers._grams``, twin namespace, merged twin table); None where that module is missing or
    # refuses a table, and the character grams then go through Python sets
    _char_plan: list[tuple[str, tuple[int, ...], GramTable, str | None, GramTable | None]] | None = field(
        init=False, repr=False, compare=False
    )
    # the same per word namespace read as hashes (``features.HASHED``): (namespace, table, twin namespace,
    # merged twin table); None where the reader is missing or a table is refused, and the words then go
    # through Python sets
    _word_plan: list[tuple[str, GramTable, str | None, GramTable | None]] | None = field(
        init=False, repr=False, compare=False
    )

    # ``WEIGHTED_SUM`` where every dense weight is a float (those of a loaded model are); None otherwise
    _weighted_sum: Callable[[dict[str, float], dict[str, float]], float] | None = field(
        init=False, repr=False, compare=False
    )
    # the whole prediction in C (``classifiers._grams.Scorer``) where the gram tables, the hashed words, the
    # dense reader and float weights are all there; None otherwise, and ``predict`` goes through ``extract``
    # and ``score``
    _scorer: Scorer[Prediction] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.used = frozenset(ns for ns, table in self.sparse.items() if table)
        self._weighted_sum = WEIGHTED_SUM if all(type(w) is float for w in self.dense.values()) else None
        twin_of: dict[str, tuple[str, dict[str, float] | None]] = {}
        for a, b in TWINS:
            ta, tb = self.sparse.get(a), self.sparse.get(b)
            if ta and tb:
                # one lookup per gram instead of two when both windows are the same set
                merged = dict.fromkeys(ta.keys() | tb.keys(), 0.0)
                for t in (ta, tb):
                    for g, w in t.items():
                        merged[g] += w
                twin_of[a] = (b, merged)
                twin_of[b] = (a, None)  # counted with its twin, through the merged table
        self._plan = [
            (ns, self.sparse[ns], *twin_of.get(ns, (None, None))) for ns in NAMESPACES if self.sparse.get(ns)
        ]
        self._set_plans = {
            (chars, words): [
                entry
                for entry in self._plan
                if not (chars and entry[0] in CHAR_ORDERS) and not (words and entry[0] in HASHED_NAMESPACES)
            ]
            for chars in (False, True)
            for words in (False, True)
        }
        self._char_plan = None
        if GRAM_TABLE is not None:
            try:
                self._char_plan = [
                    (ns, CHAR_ORDERS[ns], GRAM_TABLE(table), twin, GRAM_TABLE(merged) if merged else None)
                    for ns, table, twin, merged in self._plan
                    if ns in CHAR_ORDERS
                ]
            except ValueError:  # two of the model's grams share a hash
                self._char_plan = None
        self._word_plan = None
        if GRAM_TABLE is not None and HASHED is not None:
            try:
                self._word_plan = [
                    (ns, GRAM_TABLE(table), twin, GRAM_TABLE(merged) if merged else None)
                    for ns, table, twin, merged in self._plan
                    if ns in HASHED_NAMESPACES
                ]
            except ValueError:
                self._word_plan = None
        self._scorer = self._c_scorer()

    def _c_scorer(self) -> Scorer[Prediction] | None:
        first = self.sparse.get("f")
        if (
            SCORER is None
            or self._char_plan is None
            or self._word_plan is None
            or self._weighted_sum is None
            or DENSE_READER is None
            or HASHED is None
            or (first and not all(type(w) is float for w in first.values()))
            or (
                self.calibration is not None
                and not (
                    self.calibration.z
                    and all(type(x) is float for x in self.calibration.z + self.calibration.p)
                )
            )
        ):
            return None
        chars, words = list(CHAR_ORDERS), list(HASHED_NAMESPACES)
        cues = list(CUES)
        # the word tables as dicts too: a window with CJK characters sums them over ``extract``'s sets
        dicts = {ns: (table, merged) for ns, table, _, merged in self._plan}
        return SCORER(
            self.bias,
            [
                (chars.index(ns), orders, table, -1 if twin is None else chars.index(twin), merged)
                for ns, orders, table, twin, merged in self._char_plan
            ],
            [
                (words.index(ns), table, -1 if twin is None else words.index(twin), merged, *dicts[ns])
                for ns, table, twin, merged in self._word_plan
            ],
            first or None,
            self.dense,
            DENSE_READER,
            HASHED.cues,
            HASHED.context_cues,
            HASHED.code,
            None if self.calibration is None else (self.calibration.z, self.calibration.p),
            P_FLOOR,
            float(self.threshold),
            Prediction,
            ("structured", "open-ended"),
            KINDS,
            tuple(cues.index(name) for name in KIND_CUES),
        )

    def _parts(self, f: Features) -> list[tuple[str, set[str], dict[str, float]]]:
        empty: dict[str, float] = {}
        return [(ns, f.sparse[ns], self.sparse.get(ns, empty)) for ns in NAMESPACES]

    def score(self, f: Features) -> float:
        """Calibrated log-odds of the prompt alone: the bias, each namespace's weights summed over its grams
        and scaled by 1 / sqrt(grams), and the dense cues times their weights.

        Where two namespaces hold the very same set (the head and tail windows of a short prompt), their
        grams are looked up once in a table of the summed weights: the same sum, half the lookups (equal to
        the plain sum up to the rounding of float additions, tests/classifiers/test_fast_path.py).
        """
        z = self.bias
        sparse = f.sparse
        if f.chars is not None:
            z += self._char_score(f.chars)
        if f.words is not None:
            z += self._word_score(f.words)
        for ns, table, twin, merged in self._set_plans[f.chars is not None, f.words is not None]:
            grams = sparse[ns]
            if not grams:
                continue
            if twin is not None and sparse[twin] is grams:
                if merged is None:
                    continue
                table = merged
            # map/sum run in C; a miss adds 0.0
            z += sum(map(table.get, grams, repeat(0.0, len(grams)))) / math.sqrt(len(grams))
        if self._weighted_sum is None:
            return z + _python_weighted_sum(self.dense, f.dense)
        try:
            return z + self._weighted_sum(self.dense, f.dense)
        except TypeError:  # a cue or a weight that is not a float: the interpreter's arithmetic
            return z + _python_weighted_sum(self.dense, f.dense)

    def _char_score(self, chars: dict[str, str]) -> float:
        """The character namespaces' share of ``score``, counted from their window texts by the gram tables.

        The same sum as the sets give (tests/classifiers/test_grams.py): each namespace's known grams'
        weights over the square root of its distinct grams, a short text's one window once, through the
        merged table.
        """
        assert self._char_plan is not None, "window texts without gram tables"
        z = 0.0
        for ns, orders, table, twin, merged in self._char_plan:
            text = chars[ns]
            if not text:
                continue
            if twin is not None and chars[twin] is text:
                if merged is None:
                    continue
                table = merged
            total, distinct = table.score(text, orders)
            if distinct:
                z += total / math.sqrt(distinct)
        return z

    def _word_score(self, words: dict[str, bytes]) -> float:
        """The word namespaces' share of ``score`` from their grams' hashes: the same sum as the sets give
        (tests/classifiers/test_grams.py), a short text's one window once, through the merged table."""
        assert self._word_plan is not None, "word hashes without word tables"
        z = 0.0
        for ns, table, twin, merged in self._word_plan:
            hashes = words[ns]
            if not hashes:
                continue
            if twin is not None and words[twin] is hashes:
                if merged is None:
                    continue
                table = merged
            z += table.sum(hashes) / math.sqrt(len(hashes) >> 3)  # 8 bytes a distinct gram
        return z

    def predict(self, body: Mapping[str, Any]) -> Prediction:
        """Never raises: anything unreadable gives the neutral prediction."""
        try:
            v = view(body)
            text, context = v.text, v.context
            # ``isspace`` is ``not strip()`` without a copy of a long text
            if (not text or text.isspace()) and (not context or context.isspace()):
                z = _shift(v)
                kind = "tools" if v.tools else "data-format" if v.constrained else "qa"
                return self._prediction(z, kind)
            scorer = self._scorer
            if scorer is not None:
                # in C, but where a window with CJK characters meets a word weight that is not a float (None)
                out = scorer.predict(text, context, v.turns, v.has_system, v.tools, v.constrained, _shift(v))
                if out is not None:
                    return out
            f = extract(
                v, self.used, char_grams=self._char_plan is None, hashed_words=self._word_plan is not None
            )
            z = self.calibrated(self.score(f)) + _shift(v)
            return self._prediction(z, kind_of(v, f))
        except Exception:
            return NEUTRAL

    def calibrated(self, z: float) -> float:
        """The prompt's log-odds after the calibration table (the identity without one)."""
        return z if self.calibration is None else logit(self.calibration(z))

    def _prediction(self, z: float, kind: str) -> Prediction:
        p = _sigmoid(z)
        return Prediction(p, "structured" if p > self.threshold else "open-ended", kind)

    def explain(self, body: Mapping[str, Any], top: int = 10) -> list[tuple[str, float]]:
        """The largest contributions to the log-odds, signed (positive pushes towards structured)."""
        try:
            v = view(body)
            f = extract(v)
        except Exception:
            return []
        contrib: dict[str, float] = dict(request_shift(v))
        for ns, grams, table in self._parts(f):
            if grams:
                scale = 1.0 / math.sqrt(len(grams))
                for g in table.keys() & grams:
                    contrib[f"{ns}:{g}"] = table[g] * scale
        for k, x in f.dense.items():
            w = self.dense.get(k, 0.0)
            if x and w:
                contrib[f"d:{k}"] = w * x
        ranked = sorted(contrib.items(), key=lambda kv: -abs(kv[1]))
        return [(k, round(c, 4)) for k, c in ranked[: max(top, 0)]]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "bias": self.bias,
            "threshold": self.threshold,
            "dense": self.dense,
            "sparse": self.sparse,
            "meta": self.meta,
            "calibration": None
            if self.calibration is None
            else {"z": list(self.calibration.z), "p": list(self.calibration.p)},
        }

    def save(self, path: Path = MODEL_FILE) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = json.dumps(self.to_json(), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        # mtime=0 keeps the file byte-identical across retrains with the same data
        with open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
            gz.write(raw.encode("utf-8"))

    @classmethod
    def load(cls, path: Path = MODEL_FILE) -> Classifier:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            d = json.load(fh)
        if d.get("format") not in READABLE_FORMATS:
            raise ValueError(f"{path}: unsupported model format {d.get('format')!r}")
        table = d.get("calibration")
        return cls(
            bias=float(d["bias"]),
            sparse={ns: {k: float(w) for k, w in t.items()} for ns, t in d["sparse"].items()},
            dense={k: float(w) for k, w in d["dense"].items()},
            threshold=float(d.get("threshold", 0.5)),
            meta=dict(d.get("meta", {})),
            calibration=None
            if not table
            else Calibration(z=tuple(map(float, table["z"])), p=tuple(map(float, table["p"]))),
        )


@lru_cache(maxsize=1)
def load_default() -> Classifier:
    """The artefact shipped in the package, loaded once per process."""
    return Classifier.load(MODEL_FILE)
