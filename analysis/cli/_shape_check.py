"""``bia shape-check``: aprender's V3 serving-shape check of one witness, with its exit code."""

from __future__ import annotations

from typing import Annotated

import typer

from ..verdicts import EXIT_MISSING, shape_check
from ._args import EXIT_UNREACHABLE, _go_offline, _policy
from ._options import Bands, Cap, Epsilon, Floor, ModelLabel, ModelPrefix, Offline, PolicyFile, S7Ratio


def shape_check_command(
    path: Annotated[str, typer.Argument(metavar="WITNESS", help="A witness file or http(s) URL.")],
    policy_file: PolicyFile = None,
    model_prefix: ModelPrefix = None,
    model_label: ModelLabel = None,
    bands: Bands = None,
    epsilon: Epsilon = None,
    cap: Cap = None,
    floor: Floor = None,
    s7_ratio: S7Ratio = None,
    offline: Offline = False,
) -> None:
    """aprender's V3 serving-shape check. Exit 0 admissible, 5 not, 3 no such file, 4 unreadable, 6 a URL not fetched."""
    from ..io import SourceError

    _go_offline(offline)
    policy = _policy(policy_file, model_prefix, model_label, bands, epsilon, cap, floor, s7_ratio)
    try:
        verdict = shape_check(path, policy=policy)
    except IsADirectoryError:
        typer.echo(f"RED: cannot read witness {path}: Is a directory", err=True)
        raise typer.Exit(EXIT_MISSING) from None
    except FileNotFoundError:
        typer.echo(f"RED: cannot read witness {path}: No such file or directory", err=True)
        raise typer.Exit(EXIT_MISSING) from None
    except SourceError as exc:
        typer.echo(f"RED: cannot read witness {path}: {exc}", err=True)
        raise typer.Exit(EXIT_UNREACHABLE) from None
    if verdict.status == "RED":
        typer.echo(verdict.reasons[0], err=True)
    for line in verdict.stdout_lines():
        typer.echo(line)
    raise typer.Exit(verdict.exit_code)
