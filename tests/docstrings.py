"""Reading a Google-style docstring's ``Args:`` section, for the tests that check the public
API's docstrings (``test_api_docstrings.py``, ``collectors/torchrl_api/test_keyword_docs.py``)."""

from __future__ import annotations

import re


def args_entries(doc: str) -> list[str]:
    """The names of the entries of ``doc``'s ``Args:`` section, in order, with the ``*`` or
    ``**`` of a variadic one (``[]`` where ``doc`` has no such section). ``doc`` is cleaned
    (``inspect.cleandoc``): entries are indented by four spaces."""
    if "\nArgs:\n" not in f"\n{doc}":
        return []
    section = f"\n{doc}".split("\nArgs:\n", 1)[1]
    section = re.split(r"\n\S", section, maxsplit=1)[0]  # up to the next section
    return re.findall(r"^ {4}(\*{0,2}\w+):", section, flags=re.M)
