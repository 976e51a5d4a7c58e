"""The judge contract: turn (sample, model output) into judge requests, and replies into a verdict."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gage_eval.api.backend import ModelOutput, Request


@dataclass(frozen=True)
class Verdict:
    """A judge's structured verdict for one sample.

    ``score`` is a number in the judge's own scale (usually 0..1); ``error``
    is set when the reply could not be parsed: the sample then counts as a
    judge error, never as a silent 0.
    """

    score: float | None
    label: str | None = None
    reason: str | None = None
    raw: str | None = None
    error: str | None = None
    details: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


class Judge:
    """Base class for judges. The engine batches every judge request of a window
    on the judge backend, then hands each sample its replies."""

    name: str = "judge"

    def requests(self, sample: Mapping[str, Any], model_output: Mapping[str, Any]) -> list[Request]:
        """The judge requests for one sample (several for a per-criterion rubric)."""
        raise NotImplementedError

    def verdict(self, sample: Mapping[str, Any], model_output: Mapping[str, Any],
                replies: Sequence[ModelOutput]) -> Verdict:
        """Combine the replies to :meth:`requests` into one verdict."""
        raise NotImplementedError
