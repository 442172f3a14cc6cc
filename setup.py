"""The C extensions; everything else is in pyproject.toml.

- ``classifiers/_grams.c``: the classifier's character n-gram counter, word reader, structural cues and
  their weighted sum;
- ``gateway/routing/_slots.c``: the per-request acceptance model's word slots and weighted sums.

Both are optional: without a C compiler the package builds without them and the same values come from
the Python definitions, more slowly. Both add floats as the interpreter does, one rounding per operation:
``-ffp-contract=off`` keeps a compiler from fusing a multiply and an add where the machine has an FMA
instruction (aarch64 always does), which would change the last bit of a score.
"""

from setuptools import Extension, setup

_EXACT = ["-ffp-contract=off"]

setup(
    ext_modules=[
        Extension("classifiers._grams", ["classifiers/_grams.c"], optional=True, extra_compile_args=_EXACT),
        Extension(
            "gateway.routing._slots", ["gateway/routing/_slots.c"], optional=True, extra_compile_args=_EXACT
        ),
    ]
)
