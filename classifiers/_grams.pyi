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
