"""The Sample v1 checks JSON Schema cannot express; they live in :mod:`gage_eval.schemas`
(kept importable from here). legal_eval_v1's moved to ``gage_plugins_builtin.legal.schema``,
registered through the ``gage_register_schemas`` hook."""
from __future__ import annotations

from gage_eval.schemas import (SAMPLE_REQUIRED, sample_v1_required_errors, sample_v1_row_errors,
                               sample_v1_warnings)

__all__ = ["SAMPLE_REQUIRED", "sample_v1_required_errors", "sample_v1_row_errors", "sample_v1_warnings"]
