"""Views for people: plots, the terminal tables, the review cards and the report's detail tables."""

from ._cards import run_card

__all__ = ["run_card"]
