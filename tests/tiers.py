"""Which cases the default suite runs and which only CI's step of long runs does (the ``ci`` marker).

The default suite answers in under a minute on 2 cores: of a long parametrised test it runs the first
case, and CI's ``pytest -m ci`` step runs the rest, so every case is still guarded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from _pytest.mark.structures import ParameterSet

CI = pytest.mark.ci


def parametrize_first_by_default(
    argnames: str | Sequence[str], cases: Iterable[Any], **kwargs: Any
) -> pytest.MarkDecorator:
    """``pytest.mark.parametrize`` whose first case runs in the default suite and whose other cases carry
    the ``ci`` marker (their ids are unchanged)."""
    several = len(argnames.split(",") if isinstance(argnames, str) else argnames) > 1
    marked = []
    for index, case in enumerate(cases):
        if index == 0:
            marked.append(case)
        elif isinstance(case, ParameterSet):
            marked.append(pytest.param(*case.values, marks=[*case.marks, CI], id=case.id))
        else:
            marked.append(pytest.param(*(case if several else (case,)), marks=CI))
    return pytest.mark.parametrize(argnames, marked, **kwargs)
