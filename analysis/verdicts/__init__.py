"""Verdicts: aprender's V3 serving-shape check, the witness rules of each version, and the trend's regression rules."""
