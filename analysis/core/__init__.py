"""The lowest layer: strict JSON, field errors, frames, output files, HTML rendering, cells for people, the version."""
