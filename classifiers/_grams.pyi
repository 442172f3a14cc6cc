class GramTable:
    """A model namespace's gram -> weight table, keyed by the grams' hashes (classifiers/_grams.c)."""

    def __init__(self, weights: dict[str, float]) -> None: ...
    def __len__(self) -> int: ...
    def score(self, text: str, orders: tuple[int, ...], /) -> tuple[float, int]:
        """The summed weights of the distinct n-grams of ``text`` and how many distinct grams there are."""
