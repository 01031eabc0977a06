"""Which documents go to the validation split: whole documents, chosen by position alone.

With N documents of which V are for validation (``--validation-documents V``, or
``--validation-fraction F`` with V = F x N rounded half up), document i (0-based, in input
order) is a validation document exactly when floor((i + 1) V / N) > floor(i V / N): the last
document of each run of N / V, so exactly V of them, spread evenly over the corpus (not all
from its first or last file) and the same on every run, with no seed. Both splits keep their
documents in input order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from piebald.errors import SpecError

__all__ = ["ValidationSplit", "is_validation"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationSplit:
    fraction: float | None = None  # of the documents, in (0, 1)
    num_documents: int | None = None

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.num_documents is None):
            raise SpecError(
                source="--validation-fraction/--validation-documents",
                field="",
                has_value=False,
                expected="exactly one of the two",
            )
        if self.fraction is not None and not 0.0 < self.fraction < 1.0:
            raise SpecError(
                source="--validation-fraction",
                field="",
                value=self.fraction,
                expected="a fraction strictly between 0 and 1",
            )
        if self.num_documents is not None and self.num_documents < 1:
            raise SpecError(
                source="--validation-documents",
                field="",
                value=self.num_documents,
                expected="at least 1",
            )

    def num_validation(self, num_documents: int) -> int:
        """Validation documents among ``num_documents``; both splits must keep at least one."""
        if self.fraction is not None:
            count = math.floor(self.fraction * num_documents + 0.5)
            source, value = "--validation-fraction", self.fraction
            note = f" ({value} x {num_documents} rounds to {count})"
        else:
            assert self.num_documents is not None
            count, source, value = self.num_documents, "--validation-documents", self.num_documents
            note = ""
        if not 1 <= count <= num_documents - 1:
            raise SpecError(
                source=source,
                field="",
                value=value,
                expected=f"between 1 and {num_documents - 1} validation documents: the inputs "
                f"hold {num_documents} and training keeps at least one{note}",
            )
        return count


def is_validation(index: int, *, num_validation: int, num_documents: int) -> bool:
    """Whether document ``index`` (0-based, input order) is a validation document."""
    return (index + 1) * num_validation // num_documents > index * num_validation // num_documents
