"""The `capplan` command. Each sub-command lives in capplan/commands/<name>.py and exposes a
click command named ``cmd``; this module only wires them and turns CapplanError into a
readable message with exit code 2 (never a traceback)."""

from __future__ import annotations

import gc
import importlib
import sys
import warnings

import click

from .version import __version__
from .errors import CapplanError, SLOUnitWarning, write_error

#: name -> (module under capplan.commands, which defines `cmd`; the line `capplan --help` shows).
#: The lines live here so that the help lists every command without importing any of them
#: (each pulls in pandas, DuckDB, plotly… when it runs): `capplan --help` starts in the time of
#: `import click`. ``LazyGroup`` gives a loaded command the same line.
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("validate", "Check a study against the study contract; list every problem."),
    "summarize": ("summarize", "Per-run funnel, offered rate, throughput and latency percentiles."),
    "synth": ("synth", "Simulate a load sweep against LLM-serving replicas into a study."),
    "envelope": ("envelope", "Fit the SLO capacity envelope (C_SLO, interval, lower bound)."),
    "plan": ("plan", "Size replicas, GPUs, nodes and cost for a demand; finance export."),
    "telemetry": ("telemetry", "GPU telemetry and the serving engine's /metrics."),
    "import": ("importcmd", "Import GuideLLM, vLLM, AIPerf, inference-perf… output as a study."),
    "report": ("report", "Render the offline HTML report of a study (default: the demo)."),
    "whatif": ("whatif", "Serve the what-if panel for a study on 127.0.0.1."),
    "compare": ("compare", "Compare a candidate against a baseline on the same trace and SLO."),
    "timeline": ("timeline", "What each failure, rollout or scale event did to the SLO."),
    "kv": ("kv", "KV-memory bound of one replica: sequences of a context that fit."),
    "mix": ("mix", "C_SLO at a production mix, from the tested per-cell attainment."),
    "twin": ("twin", "Fit, check and run a calibrated twin of the measured system."),
    "design": ("design", "Propose the next runs of a sweep (rates, repeats, durations)."),
    "loadtest": ("loadtest", "Run the load tool until the planning number is honest."),
    "cache": ("cache", "The measured prefix-cache effect of a study."),
    "fanout": ("fanout", "Root (agent / RAG) requests per second from per-call C_SLO."),
}


class LazyGroup(click.Group):
    """Commands imported when run; the listing comes from ``COMMANDS`` alone."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        return self._load(name)

    def format_commands(self, ctx, formatter):
        rows = [(name, line) for name, (_, line) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    @staticmethod
    def _load(name):
        entry = COMMANDS.get(name)
        if entry is None:
            return None
        module = importlib.import_module(f"capplan.commands.{entry[0]}")
        cmd = getattr(module, "cmd")
        cmd.short_help = entry[1]
        return cmd


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
    except Exception as exc:
        said = _fault(exc)
        if said is None:
            raise
        click.echo(said.format(), err=True)
        return said.exit_code
    return 0


def _fault(exc: Exception) -> CapplanError | None:
    """The faults of the machine or the data that no command caught itself, as the one
    message each has: a DuckDB / pyarrow read error of an unreadable file of an opened study
    (``capplan.study.read_failure``: exit 2, the file named), an OS error of writing
    (``capplan.errors.write_error``: exit 1 or 2, the path named). None: a bug, raised."""
    if "capplan.study" in sys.modules:
        from .study import read_failure

        err = read_failure(exc)
        if err is not None:
            return err
    return write_error(exc)


def run() -> None:  # console entry point
    _keep_freed_memory()
    rc = main()
    # The interpreter's exit runs the cyclic garbage collector over every object the command
    # left (pandas, scipy, the fit): 0.3–0.4 s of `capplan envelope` on 12 runs × 10^6
    # requests. Frozen objects are not walked (0.08–0.1 s); memory and files go back to the
    # system with the process, and atexit handlers still run (benchmarks/README.md, issue 29).
    gc.freeze()
    sys.exit(rc)


def _keep_freed_memory() -> None:
    """Ask the allocators to keep the memory the command frees for its next arrays: glibc's
    malloc (numpy's arrays; a command's own process only; nothing where MALLOC_* or
    GLIBC_TUNABLES is set, or off glibc) and DuckDB's own jemalloc (nothing where
    DUCKDB_JE_MALLOC_CONF is set).

    The reduction makes and drops 1–8 MB numpy arrays run after run. glibc's defaults hand
    such blocks back to the kernel (mmap'ed, or trimmed off the heap top) and take them again
    on the next allocation, so every one is faulted in and zeroed anew: `capplan envelope` on
    12 runs × 10^6 requests took ≈ 300 000 page faults and 1.3–1.6 s of system time. Blocks up to
    32 MB (the largest mmap threshold glibc accepts) from the heap, no trimming under 1 GB
    free, and the heap grown 256 MB at a time: ≈ 170 000 faults and 0.85–1.1 s
    (benchmarks/README.md, issue 29). The price: peak resident memory +5 % there, and a
    long-lived command (`capplan whatif`) keeps up to 1 GB it freed until it exits.

    DuckDB's jemalloc hands pages freed for 1 s back to the kernel (DuckDB sets
    ``dirty_decay_ms:1000``), and each run's scan buffers and Arrow result are faulted in
    again: 10 s instead, for the DuckDB library loaded after this (an environment variable
    jemalloc reads when DuckDB first allocates; child processes inherit it). The reduction
    alone, six fresh processes each: faults 114 000 → 94 000, CPU 5.07 → 4.90 s median."""
    import os

    if "DUCKDB_JE_MALLOC_CONF" not in os.environ:
        os.environ["DUCKDB_JE_MALLOC_CONF"] = "dirty_decay_ms:10000"
    if "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") for k in os.environ):
        return  # the user tunes malloc
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    for param, value in ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 1 << 30),
                         (M_TOP_PAD, 256 << 20)):
        mallopt(param, value)


if __name__ == "__main__":
    run()
