class GramTable:
    """A model namespace's gram -> weight table, keyed by the grams' hashes (classifiers/_grams.c)."""

    def __init__(self, weights: dict[str, float]) -> None: ...
    def __len__(self) -> int: ...
    def score(self, text: str, orders: tuple[int, ...], /) -> tuple[float, int]:
        """The summed weights of the distinct n-grams of ``text`` and how many distinct grams there are."""

def word_grams(text: str, /) -> tuple[list[str], set[str]]:
    """The tokens of ``text`` (letter runs, ``#`` for digit runs, single marks) and the set of the tokens and
    of each two neighbours joined by a space: ``features._tokens`` and ``features._ngrams`` in one pass."""
