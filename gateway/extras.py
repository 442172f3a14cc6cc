"""Optional dependencies: which extra a command needs, and a one-line refusal when it is not installed.

``pip install specroute`` installs what serving needs and nothing more; the benchmarks and training bring
heavy libraries of their own (matplotlib, numpy, scikit-learn). A command that needs one of them says
which extra to install before it starts, instead of failing half-way with ``ModuleNotFoundError``.
"""

from __future__ import annotations

from importlib.util import find_spec

# The modules each extra provides (import names, as pyproject's [project.optional-dependencies] lists them).
EXTRAS: dict[str, tuple[str, ...]] = {
    "bench": ("tqdm", "matplotlib", "psutil"),
    "train": ("numpy", "scipy", "sklearn", "psutil"),
}


class MissingExtra(Exception):
    """A command's optional dependencies are not installed; the message says what to install."""


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here."""
    return [name for name in EXTRAS[extra] if find_spec(name) is None]


def require(extra: str, command: str) -> None:
    """Raise :class:`MissingExtra` naming the ``pip install`` line when ``extra`` is not installed."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(
            f"`{command}` needs the {extra} extra: pip install 'specroute[{extra}]'"
            f" (from a clone of its repository: pip install '.[{extra}]'; missing: {', '.join(absent)})"
        )
