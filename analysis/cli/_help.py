"""click's plain help for bia: option values named in words (PATH, URL, C,C,...), not as Python types, and each command's
whole first sentence in ``bia --help``."""

from __future__ import annotations

from typing import Any, cast

import click
from typer.core import TyperArgument, TyperCommand, TyperGroup

# what typer's own help shows as <int>, <path>, <list[str]>: the words click's help uses
_PLAIN = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "path": "PATH", "bool": "BOOLEAN"}


def _metavar(param: Any, ctx: Any) -> str:
    """An option's or argument's value in words: its metavar, else its type's plain name (``<int>`` is INTEGER)."""
    if param.metavar:
        name = param.metavar
    else:
        shown = (param.display_type(ctx) or "").strip("<>")
        shown = shown.removeprefix("list[").removesuffix("]").removesuffix(" range")
        name = _PLAIN.get(shown, shown.upper() or "VALUE")
    return f"{name}..." if param.nargs != 1 and not name.endswith("...") else name


class Command(TyperCommand):
    """A command whose help names values as its options' metavars say, else by click's plain type names."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The usage line's pieces: the options' metavar, then each argument's value in words (in brackets when
        optional).

        Parameters
        ----------
        ctx : click.Context
            The command's context.

        Returns
        -------
        list of str
        """
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(_metavar(param, ctx) if param.required else f"[{_metavar(param, ctx)}]")
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """Write the Arguments and Options sections, each value named in words.

        Parameters
        ----------
        ctx : click.Context
            The command's context.
        formatter : click.HelpFormatter
            The help being written.
        """
        arguments = [
            (_metavar(p, ctx), (cast(TyperArgument, p).help or "") + ("" if p.required else "  [optional]"))
            for p in self.get_params(ctx)
            if p.param_type_name == "argument"
        ]
        options = []
        for param in self.get_params(ctx):
            option = cast(click.Option, param)  # read as one only when its type name says it is
            if param.param_type_name == "option" and not option.hidden:
                if not option.is_flag and param.metavar is None:
                    param.metavar = _metavar(param, ctx)  # typer's help takes an option's metavar as given
                options.append(param.get_help_record(ctx))
        for title, rows in (("Arguments", arguments), ("Options", [r for r in options if r])):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


class Group(TyperGroup):
    """bia's command list: each command's first sentence, whole (wrapped, never cut with "..."); and Ctrl-C in any command
    ends with one line and exit 130 (typer's own handling says nothing)."""

    def invoke(self, ctx: Any) -> Any:
        """Run the command ``ctx`` names; Ctrl-C ends it with one line on stderr and exit 130.

        Parameters
        ----------
        ctx : click.Context
            The group's context.

        Returns
        -------
        object
            What the command returns.
        """
        import typer

        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            command = ctx.invoked_subcommand or "bia"
            typer.echo(
                f"interrupted: bia {command} stopped before it finished; what it writes is written whole or not at all",
                err=True,
            )
            raise typer.Exit(130) from None

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """Write the Commands section: each command that is not hidden, with its whole first sentence.

        Parameters
        ----------
        ctx : click.Context
            The group's context.
        formatter : click.HelpFormatter
            The help being written.
        """
        rows = [
            (name, command.get_short_help_str(limit=10_000))
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
