"""JSON answers that always render: a non-finite float (a diverged loss, an ``"lr": NaN``
echoed back in a validation error) is not JSON, and Starlette's ``JSONResponse`` would raise
while rendering it, turning a 200 or a 422 into a 500. Here it becomes ``null`` in a record
and its text (``"NaN"``) in an error's ``input``."""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi.responses import JSONResponse


def finite(value: Any, replacement: Any = None) -> Any:
    """``value`` with every NaN or infinity replaced by ``replacement`` (``str`` to keep its
    text), recursively through dicts, lists and tuples."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value) if replacement is str else replacement
    if isinstance(value, dict):
        return {k: finite(v, replacement) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v, replacement) for v in value]
    return value


class FiniteJSONResponse(JSONResponse):
    """The gateway's JSON answer: strict JSON even when the content holds NaN or infinity."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:  # "Out of range float values are not JSON compliant"
            return json.dumps(
                finite(content), ensure_ascii=False, allow_nan=False, separators=(",", ":")
            ).encode("utf-8")
