"""The `capplan` command. Each sub-command lives in capplan/commands/<name>.py and exposes a
click command named ``cmd``; this module only wires them and turns CapplanError into a
readable message with exit code 2 (never a traceback)."""

from __future__ import annotations

import importlib
import sys
import warnings

import click

from .version import __version__
from .errors import CapplanError, SLOUnitWarning

# name -> module under capplan.commands (each defines `cmd`)
COMMANDS: dict[str, str] = {
    "validate": "validate",
    "summarize": "summarize",
    "synth": "synth",
    "envelope": "envelope",
    "plan": "plan",
    "telemetry": "telemetry",
    "import": "importcmd",
    "report": "report",
    "whatif": "whatif",
    "compare": "compare",
    "timeline": "timeline",
    "kv": "kv",
    "mix": "mix",
    "twin": "twin",
    "design": "design",
    "cache": "cache",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return [n for n in COMMANDS if self._load(n) is not None]

    def get_command(self, ctx, name):
        return self._load(name)

    @staticmethod
    def _load(name):
        mod = COMMANDS.get(name)
        if mod is None:
            return None
        full = f"capplan.commands.{mod}"
        try:
            module = importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name == full:
                return None  # not built yet
            raise
        return getattr(module, "cmd", None)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="capplan")
def app():
    """capplan: SLO capacity envelopes and capacity plans for LLM serving."""


def _say_warnings(show):
    """A ``warnings.showwarning`` that prints capplan's input warnings (an implausible SLO unit)
    as ``WARNING:`` lines on stderr, once each, and leaves the others to ``show``."""
    said: set[str] = set()

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, SLOUnitWarning):
            if str(message) not in said:
                said.add(str(message))
                click.echo(f"WARNING: {message}", err=True)
        else:
            show(message, category, filename, lineno, file, line)
    return showwarning


def main(argv: list[str] | None = None) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("always", SLOUnitWarning)  # said once per message: _say_warnings
        warnings.showwarning = _say_warnings(warnings.showwarning)
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        args = list(sys.argv[1:] if argv is None else argv)
        # the exact command, for provenance (capplan report records it)
        rv = app.main(args=args, prog_name="capplan", standalone_mode=False,
                      obj={"argv": ["capplan", *args]})
        if isinstance(rv, int):
            return rv
    except CapplanError as exc:
        click.echo(exc.format(), err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 1
    except click.ClickException as exc:
        exc.show()
        return 2
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    return 0


def run() -> None:  # console entry point
    sys.exit(main())


if __name__ == "__main__":
    run()
