"""The Python API's examples run as written: every ``>>>`` line in ``piebald.api``'s
docstrings is executed by doctest and must print what the docstring shows (examples that
need files, a GPU or minutes say ``# doctest: +SKIP``)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import piebald.api

pytestmark = pytest.mark.slow

MODULES = ["piebald.api"] + [
    f"piebald.api.{info.name}" for info in pkgutil.iter_modules(piebald.api.__path__)
]


@pytest.mark.parametrize("name", MODULES)
def test_examples_in_the_docstrings_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"


def test_the_api_has_examples() -> None:
    attempted = 0
    for name in MODULES:
        finder = doctest.DocTestFinder()
        for test in finder.find(importlib.import_module(name)):
            attempted += sum(
                1 for example in test.examples if not example.options.get(doctest.SKIP)
            )
    assert attempted >= 10, f"only {attempted} runnable examples in piebald.api"
