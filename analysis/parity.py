"""Parity of two streams, token by token: divergence, bitwise prefix, ULP, near-tie margins, KL, decode rates.

The public name of ``analysis.metrics.parity``, where the code lives.
"""

from .metrics.parity import *  # noqa: F403
from .metrics.parity import __all__  # noqa: F401
