"""The one C extension, the classifier's character n-gram counter and word reader; everything else is in
pyproject.toml.

It is optional: without a C compiler the package builds without it and the classifier counts the same grams
with Python sets and regexes, about twice as slowly (``classifiers/_grams.c``).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("classifiers._grams", ["classifiers/_grams.c"], optional=True)])
