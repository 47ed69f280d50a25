"""One plot per function (``ax=None`` in, Axes out) for witnesses and runs.

The public name of ``analysis.views.plots``, where the code lives.
"""

from .views.plots import *  # noqa: F403
from .views.plots import __all__  # noqa: F401
