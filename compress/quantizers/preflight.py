"""Checks a weight-quantizing stage makes before any work: can every target take the scheme?"""

from __future__ import annotations

import re

from compress.errors import LlmpressError
from compress.quantizers.scheme import QuantScheme
from compress.stage import Workspace


def check_layers(ws: Workspace, scheme: QuantScheme) -> None:
    """Refuse layers whose width no allowed group size divides, naming them and the fixes."""
    bad = {}
    for name in ws.target_linears():
        width = ws.weight_shape(name)[1]
        if scheme.group_for(width) is None:
            pattern = re.sub(r"\.\d+\.", ".*.", name, count=1)
            bad.setdefault(pattern, width)
    if bad:
        pattern, width = next(iter(bad.items()))
        more = f" (and {len(bad) - 1} more kinds)" if len(bad) > 1 else ""
        raise LlmpressError(
            f"{pattern}: input width {width} has no group size <= {scheme.group_size} that "
            f"divides it{more}; pass --ignore '{pattern}' or a group size that divides {width}"
        )
