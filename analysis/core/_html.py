"""One jinja2 environment for every HTML fragment bia renders: autoescape always on, because
witness fields and model output are untrusted text."""

from __future__ import annotations

from typing import Any

import jinja2

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("analysis", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(template: str, **context: Any) -> str:
    """Render ``templates/<template>`` with every interpolated value HTML-escaped.

    Parameters
    ----------
    template : str
        The template's file name under ``analysis/templates``.
    **context : Any
        The template's variables; an undefined one is an error.

    Returns
    -------
    str
    """
    return _ENV.get_template(template).render(**context)
