"""The measures: parity of two streams (:mod:`analysis.parity`), its columnar form for whole runs, and per-c counts."""
