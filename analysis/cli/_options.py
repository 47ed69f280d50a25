"""The options several ``bia`` commands take, each spelled once: the V3 policy's, --offline, and how dumps are placed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

PolicyFile = Annotated[Path | None, typer.Option("--policy", help="A TOML or JSON file of V3 policy fields.")]
ModelPrefix = Annotated[str | None, typer.Option(help="S1: the blessed model's file-name prefix.")]
ModelLabel = Annotated[str | None, typer.Option(help="The model's name in the S1 reason.")]
Bands = Annotated[str | None, typer.Option(metavar="C,C,...", help="S2: the bands, comma separated, e.g. 1,4,8,16.")]
Epsilon = Annotated[float | None, typer.Option(help="S5: the near-tie epsilon (margin < epsilon).")]
Cap = Annotated[int | None, typer.Option(help="How many batched bands may pass by near-tie.")]
Floor = Annotated[int | None, typer.Option(help="The floor under declared_min.")]
S7Ratio = Annotated[float | None, typer.Option(help="S7: least decode-rate ratio of c=4 to c=1.")]
Offline = Annotated[bool, typer.Option("--offline", help="Read URL sources from the cache only; never the network.")]

MappingFile = Annotated[
    Path | None,
    typer.Option(
        "--mapping",
        help="Dumps: a JSON or CSV file saying which file is which (source, prompt_id, role, c, slot, repeat).",
    ),
]
BandPerFile = Annotated[
    bool,
    typer.Option(
        "--band-per-file",
        help="Dumps: each file is one band of the requests it holds (c their count); "
        "a file of one request is an m=1 reference.",
    ),
]
