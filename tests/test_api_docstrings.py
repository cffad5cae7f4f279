"""The API reference's objects (``docs/api.md``) carry Google-style docstrings: every public
function and method that takes named arguments has an ``Args:`` section naming each, and one
that returns something has ``Returns:``; a dataclass lists its fields under ``Attributes:``."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest
from docstrings import args_entries

API = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _object(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    for part in parts[i:]:
        obj = getattr(obj, part)
    return obj


def _documented() -> list[tuple[str, object]]:
    """Every function and public method (defined in hpccollect) the API reference shows."""
    found = []
    for kind, path in re.findall(r"\.\. auto(class|function):: (\S+)", API.read_text()):
        obj = _object(path)
        if kind == "function":
            found.append((path, obj))
            continue
        for name, member in vars(obj).items():
            if isinstance(member, (classmethod, staticmethod)):
                member = member.__func__
            if name.startswith("_") or not inspect.isfunction(member):
                continue
            if (member.__module__ or "").startswith("hpccollect"):
                found.append((f"{path}.{name}", member))
    return found


def _named(fn) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in params if p.name not in ("self", "cls") and p.kind not in skip]


@pytest.mark.parametrize(
    ("path", "fn"), _documented(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_every_public_call_says_its_arguments_and_what_it_returns(path, fn) -> None:
    doc = inspect.getdoc(fn) or ""
    assert doc, f"{path} has no docstring"
    missing = set(_named(fn)) - {name.lstrip("*") for name in args_entries(doc)}
    assert not missing, f"{path}: no Args entry for {sorted(missing)}"
    returned = inspect.signature(fn).return_annotation
    if returned not in ("None", "NoReturn", None, inspect.Signature.empty):
        assert re.search(r"^(Returns|Yields):", doc, flags=re.M), f"{path} has no Returns:"


def test_every_dataclass_in_the_reference_lists_its_fields() -> None:
    for kind, path in re.findall(r"\.\. auto(class):: (\S+)", API.read_text()):
        cls = _object(path)
        if not dataclasses.is_dataclass(cls):
            continue
        doc = inspect.getdoc(cls) or ""
        assert "\nAttributes:\n" in doc, f"{path} lists no Attributes"
        listed = set(re.findall(r"^ {4}(\w+)", doc.split("\nAttributes:\n", 1)[1], flags=re.M))
        fields = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        assert fields <= listed, f"{path}: {sorted(fields - listed)} not listed"
