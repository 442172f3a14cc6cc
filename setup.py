"""The C extensions; everything else is in pyproject.toml.

- ``classifiers/_grams.c``: the classifier's character n-gram counter and word reader;
- ``gateway/routing/_slots.c``: the per-request acceptance model's word slots and weighted sums.

Both are optional: without a C compiler the package builds without them and the same values come from
the Python definitions, more slowly.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("classifiers._grams", ["classifiers/_grams.c"], optional=True),
        Extension("gateway.routing._slots", ["gateway/routing/_slots.c"], optional=True),
    ]
)
