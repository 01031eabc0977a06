"""``piebald.api`` loads each name from its module on first use (PEP 562), from a table
of where each name lives: the table, ``__all__`` and the modules must agree, or a name
would fail only when first used."""

from __future__ import annotations

import importlib

import piebald.api as api


def test_every_exported_name_has_one_home_that_defines_it() -> None:
    homes = api._HOMES
    named = [name for names in homes.values() for name in names]
    assert len(named) == len(set(named)), "a name listed under two modules"
    assert set(named) == set(api.__all__)
    for module_name, names in homes.items():
        module = importlib.import_module(module_name)
        for name in names:
            assert hasattr(module, name), f"{module_name} has no {name}"
            assert getattr(api, name) is getattr(module, name)


def test_each_api_module_exports_what_the_table_says_it_holds() -> None:
    for module_name, names in api._HOMES.items():
        if module_name.startswith("piebald.api."):
            module = importlib.import_module(module_name)
            assert set(names) <= set(module.__all__), module_name
