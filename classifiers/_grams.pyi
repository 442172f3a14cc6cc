from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

class GramTable:
    """A model namespace's gram -> weight table, keyed by the grams' hashes (classifiers/_grams.c)."""

    def __init__(self, weights: dict[str, float]) -> None: ...
    def __len__(self) -> int: ...
    def score(self, text: str, orders: tuple[int, ...], /) -> tuple[float, int]:
        """The summed weights of the distinct n-grams of ``text`` and how many distinct grams there are."""
    def sum(self, hashes: bytes, /) -> float:
        """The summed weights of the grams packed by ``word_hashes``."""
    def bits(self, hashes: bytes, /) -> int:
        """The bitwise or of the (whole-number) weights of the packed grams in the table."""

def word_grams(text: str, /) -> tuple[list[str], set[str]]:
    """The tokens of ``text`` (letter runs, ``#`` for digit runs, single marks) and the set of the tokens and
    of each two neighbours joined by a space: ``features._tokens`` and ``features._ngrams`` in one pass."""

def word_hashes(text: str, bigrams: bool, /) -> tuple[bytes, int, int, tuple[str, ...]]:
    """The distinct word grams of ``text`` (tokens, and with ``bigrams`` each two neighbours joined by a
    space) as packed 8-byte hashes; the number of tokens; how many are ``#``; the first two all-letter
    tokens of the first six."""

class DenseReader:
    """The structural cues of ``features._dense`` under these names (classifiers/_grams.c): 23 base cues, the
    6 layout cues, then the cue lexicons' and the chat context's lexicons' names."""

    def __init__(
        self, base: tuple[str, ...], layout: tuple[str, ...], cues: tuple[str, ...], context: tuple[str, ...]
    ) -> None: ...
    def read(
        self,
        text: str,
        scanned: str,
        n_tokens: int,
        hashes: int,
        code_kw: int,
        cues: Sequence[float],
        context_cues: Sequence[float] | None,
        turns: int,
        has_system: bool,
        context_len: int,
        /,
    ) -> dict[str, float]:
        """``features._dense`` with the view's fields it reads: the same keys in the same order, the same
        floats."""

def weighted_sum(weights: dict[str, float], values: dict[str, float], /) -> float:
    """``sum(map(mul, map(weights.get, values, repeat(0.0)), values.values()))``, added as the running
    interpreter's ``sum`` adds floats; TypeError where a weight or a value read is not a float."""

def norm(text: str, /) -> str:
    """``text`` lower-cased, the ASCII digits 1-9 folded to 0, white space runs to one space, stripped:
    ``features._norm_py``."""

_P = TypeVar("_P")

class Scorer(Generic[_P]):
    """A classifier's whole prediction after the request's view (classifiers/_grams.c): ``extract``,
    ``score``, ``calibrated``, the shift, the sigmoid, the label and ``kind_of`` in one call, the same
    floats."""

    def __init__(
        self,
        bias: float,
        chars: list[tuple[int, tuple[int, ...], GramTable, int, GramTable | None]],
        # (namespace, table, twin, merged table, the table as a dict, the merged one as a dict)
        words: list[tuple[int, GramTable, int, GramTable | None, dict[str, float], dict[str, float] | None]],
        first: dict[str, float] | None,
        dense: dict[str, float],
        reader: DenseReader,
        cues: GramTable,
        context_cues: GramTable,
        code: GramTable,
        calibration: tuple[tuple[float, ...], tuple[float, ...]] | None,
        p_floor: float,
        threshold: float,
        prediction: Callable[..., _P],  # called with (p, label, kind)
        labels: tuple[str, str],
        kinds: tuple[str, ...],
        kind_cues: tuple[int, ...],
    ) -> None: ...
    def predict(
        self,
        text: str,
        context: str,
        turns: int,
        has_system: bool,
        tools: bool,
        constrained: float,
        shift: float,
        /,
    ) -> _P | None:
        """The prediction of a view with these fields and the request fields' ``shift``: ``prediction(p,
        label, kind)``. A scanned window with a character from U+3040 on sums its word grams over the sets
        ``features.extract`` builds, in their order; None where such a window meets a word weight that is
        not a float."""
