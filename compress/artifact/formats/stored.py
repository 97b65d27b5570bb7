"""A stored linear as the quantizers' own QuantizedWeight: what every codec decodes to."""

from __future__ import annotations

from compress.quantizers.scheme import QuantizedWeight, QuantScheme


def stored(q, scale, zero_point, group: int, bits: int, index=None, outlier=None):
    scheme = QuantScheme(bits, group, zero_point is not None)
    return QuantizedWeight(q, scale, zero_point, scheme, group, index, outlier)
