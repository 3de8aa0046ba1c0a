"""`launch [plan] [OPTIONS] SCRIPT [-- ARGS...]`: the click command that splits off the script's
own arguments.

Everything after the first ``--`` is the script's, passed on verbatim as a list of strings (the
command's ``script_args``); launch's options come before it. click itself would refuse them
(``No such option``, ``Got unexpected extra arguments``), and does still without ``--``: then the
usage line's hint is the user's own command with ``--`` put in where it belongs. Imports nothing
heavy: `launch --help` builds it.
"""

from __future__ import annotations

import shlex

import click

from launcher.status import UsageError


class ScriptCommand(click.Command):
    """`launch [plan] [OPTIONS] SCRIPT [-- ARGS...]`: what follows the first ``--`` is the
    script's own, verbatim (the callback's ``script_args``: a tuple, None without ``--``). An
    option launch does not know, or a second positional, is one usage line whose hint is the
    command with ``--`` put in before it."""

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- ARGS]..."]

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        cut = args.index("--") if "--" in args else len(args)
        own, tail = args[:cut], args[cut + 1:]
        try:
            rest = super().parse_args(ctx, list(own))  # click's parser consumes its list
        except click.UsageError as exc:
            if not isinstance(exc, click.NoSuchOption) and "extra argument" not in exc.message:
                raise
            raise UsageError(exc.format_message(), self._hint(ctx, own, tail)) from None
        ctx.params["script_args"] = tuple(tail) if cut < len(args) else None
        return rest

    def _hint(self, ctx: click.Context, own: list[str], tail: list[str]) -> str:
        def read(args: list[str]) -> tuple[bool, bool]:
            """Whether click refuses ``args`` (an unknown option, a second positional), and
            whether they hold the SCRIPT."""
            try:
                values, extra, _order = self.make_parser(ctx).parse_args(list(args))
            except click.NoSuchOption:
                return True, False
            except click.UsageError:  # an option whose value would come next
                return False, False
            return bool(extra), isinstance(values.get("script"), str)

        at = next((i for i in range(len(own)) if read(own[:i + 1])[0]), len(own))
        prog = ["launch", *(["plan"] if self.name == "plan" else [])]
        example = (shlex.join([*prog, *own[:at], "--", *own[at:], *tail])
                   if read(own[:at])[1]  # the SCRIPT came before it: the user's own command
                   else shlex.join([*prog, "train.py", "--", "--train_file", "data.txt"]))
        return f"if it is the script's own, put the script's arguments after --: {example}"
