from array import array

def word_slots(window: str, max_words: int, mask: int, /) -> tuple[int, ...] | None:
    """The slots of ``"w=" + gram`` for each of the window's first ``max_words`` words and each two
    neighbours joined by a space (words first), as ``features.slot`` hashes them; None where the window
    holds a surrogate."""

def weighted(
    slots: tuple[int, ...],
    values: tuple[float, ...],
    mean: array[float],
    var: array[float],
    stamp: array[float],
    start: float,
    now: float,
    horizon: float,
    /,
) -> tuple[float, float, float] | None:
    """``start + Σ x·mean[s]``, ``Σ x²·var[s]`` and ``Σ x²`` in the slots' order; None when a slot was last
    touched more than ``horizon`` before ``now``."""
