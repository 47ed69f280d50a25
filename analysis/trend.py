"""The trend report: a history of runs, witnesses and release markers over time.

The public name of ``analysis.report.trend``, where the code lives.
"""

from .report.trend import *  # noqa: F403
from .report.trend import __all__  # noqa: F401
