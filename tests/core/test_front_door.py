"""The front door is small and true (issue 24): every name of ``gage_eval.api`` has one spelling.

A helper family is a namespace (``loglikelihood``, ``paths``, ``secrets``, ``stats``, ``events``,
``jsonio``, ``running``, ...): its members are reached through it and are not also names of the API; no two names
of the API are the same object; and ``gage_eval`` itself re-exports none of them.
"""
from __future__ import annotations

import types

import gage_eval
import gage_eval.api as api


def _names() -> dict[str, object]:
    return {name: getattr(api, name) for name in api.__all__}


def test_no_object_has_two_names():
    seen: dict[int, str] = {}
    twice = []
    for name, value in _names().items():
        if isinstance(value, (str, int, float, bool, frozenset, tuple)):
            continue  # equal constants are not one object spelled twice
        if id(value) in seen:
            twice.append((seen[id(value)], name))
        seen[id(value)] = name
    assert not twice, f"gage_eval.api names one object twice: {twice}"


def test_a_namespace_member_is_not_also_a_name_of_the_api():
    names = _names()
    namespaces = {n: v for n, v in names.items() if isinstance(v, types.ModuleType)}
    assert {"loglikelihood", "paths", "secrets"} <= set(namespaces), sorted(namespaces)
    flat = {id(v): n for n, v in names.items() if not isinstance(v, types.ModuleType)}
    doubled = [f"{ns}.{attr} is also gage_eval.api.{flat[id(value)]}"
               for ns, module in namespaces.items() for attr, value in vars(module).items()
               if not attr.startswith("_") and getattr(value, "__module__", None) == module.__name__
               and id(value) in flat]
    assert not doubled, doubled


def test_the_package_itself_reexports_nothing_of_the_api():
    assert gage_eval.__all__ == ["__version__"]
    assert not hasattr(gage_eval, "hookimpl")  # one spelling: gage_eval.api.hookimpl


def test_the_checks_above_can_fail():
    """Had the API kept loglikelihood's helpers beside the namespace, the second check would fail."""
    names = _names()
    module = names["loglikelihood"]
    assert module.encode_pair.__module__ == module.__name__
    assert "encode_pair" not in api.__all__


def test_the_api_has_forty_to_fifty_names():
    """Issue 24's bound on the front door: about 40 to 50 names. A family of helpers joins a
    namespace (jsonio, running, ...) rather than adding its members one by one."""
    assert 40 <= len(api.__all__) <= 50, (len(api.__all__), api.__all__)
    assert {"jsonio", "running"} <= {n for n, v in _names().items() if isinstance(v, types.ModuleType)}
