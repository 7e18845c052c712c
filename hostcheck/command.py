"""``hostcheck`` / ``python -m hostcheck``: one command line, one parser, one ``main`` for every subcommand.

    hostcheck [check] [OPTIONS]          check this node and print a readiness score (the default command)
    hostcheck bench [OPTIONS]            measure what each CPU-side tuning buys on this node
    hostcheck fleet REPORT_DIR [...]     many nodes' ``--json`` reports -> fleet.md and fleet.html
    hostcheck job [OPTIONS] -- CMD ...   run a training command and say what holds its GPUs back
    hostcheck baseline [OPTIONS]         record what this known-good node has as the config's [baseline]

A subcommand is a package ``hostcheck/NAME/`` whose ``cli`` module has ``SUMMARY`` (its line in the command
list), ``DESCRIPTION`` and ``EPILOG`` (its ``--help``), ``add_arguments(parser)`` and ``run(args) -> int`` (its exit
code), with its renderers in ``NAME/render`` (tests/unit/test_structure.py holds the shape). To add one, write
such a package and name its ``cli`` in :data:`SUBCOMMANDS`. Only the command a line names is imported (check's,
the default, always: the top level takes its options); ``hostcheck --help`` imports them all for their lines. Slurm's
HealthCheckProgram starts ``hostcheck --profile passive`` every few minutes on every node: it pays for check alone.
What surrounds ``run`` is done here, the same for every subcommand:

- exit codes: ``0`` ready (or: it ran), ``1`` not ready (or: nothing measured), ``2`` usage or environment
  error, ``128 + N`` when signal N ended the run (SIGHUP 129, SIGINT 130, SIGTERM 143);
- usage errors: argparse's (:meth:`Parser.error` raises :class:`UsageError`) and a subcommand's, which raises
  ``argparse.ArgumentError(None, message)`` (the standard library's class, so that no subcommand imports this
  module, which imports them all), are one line ``<prog>: error: <message> (see --help)`` and exit 2. argparse
  never exits the process itself (:meth:`Parser.exit` raises);
- standard output: a write that fails (``>/dev/full``, a full disk), ``--help`` and ``--version`` included, is
  one line and exit 2; when its reader left (``| head``) the rest goes to /dev/null and the command's exit code
  stands. Standard output is flushed before the exit code is decided;
- SIGHUP, SIGINT and SIGTERM: raised in the main thread as :class:`Signalled`, a KeyboardInterrupt, so that what
  a subcommand cleans up on Ctrl-C it cleans up on SIGTERM and on a hang-up too (bench ends its workers and
  prints what it measured, job ends its command and removes its records folder). Then every child still running
  is killed (:func:`hostcheck.child.launch.kill_all`) and the run ends with ``128 + N``. SIGKILL cannot be
  caught: the children end then too, by the reaper (:mod:`hostcheck.child.reaper`);
- no memory left (a small ``ulimit -v``): ``out of memory`` with the address-space limit, exit 2; an error Python
  could not raise (a thread that died before it ran) is one line on stderr, never a traceback;
- internal errors: one sentence and exit 2; with ``--debug``, the traceback first.

Without a command the top level takes check's options, so ``hostcheck --json`` is ``hostcheck check --json``.
Options of check given before a command's name (``hostcheck --quick bench``) are refused: argparse would let
the command's own values replace them without a word.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import sys
import threading
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, NoReturn

from hostcheck import __version__
from hostcheck.child.launch import kill_all, release_private_root, reopen, signal_held
from hostcheck.exitcodes import EXIT_SIGNAL_BASE, EXIT_USAGE
from hostcheck.outfile import remove_pending

PROG = "hostcheck"
#: The subcommands by name, in the order of ``hostcheck --help``: the module of each one's ``cli``, imported by
#: :func:`load` when a command line names it.
SUBCOMMANDS: dict[str, str] = {
    "check": "hostcheck.check.cli",
    "bench": "hostcheck.bench.cli",
    "fleet": "hostcheck.fleet.cli",
    "job": "hostcheck.job.cli",
    "baseline": "hostcheck.baseline.cli",
    "sweep": "hostcheck.sweep.cli",
}
#: The command run when none is named.
DEFAULT = "check"
#: The namespace attribute that holds the command's name (None at the top level until one is named).
COMMAND_DEST = "command"
#: The signals that end a run of any command as Ctrl-C does (a closed terminal or ssh session: SIGHUP), exit 128 + N.
SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)
#: Options of every parser, the top level's and each command's: they may come before a command's name.
GLOBAL_DESTS = ("debug",)


class UsageError(Exception):
    """A command line argparse refused: one line on stderr, exit 2."""

    def __init__(self, message: str, prog: str = PROG) -> None:
        super().__init__(message)
        self.prog = prog


class ParserExit(Exception):
    """argparse is done (``--help``, ``--version``): the status to exit with, in place of sys.exit."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class OutputError(OSError):
    """What a command, or argparse, wrote to standard output did not reach it (a full disk, /dev/full).

    An OSError, so that a command that handles its own write errors (check's report) still does."""


class Signalled(KeyboardInterrupt):
    """SIGHUP, SIGINT or SIGTERM arrived: the run ends, its children with it.

    A KeyboardInterrupt so that a subcommand's Ctrl-C clean-up (bench: its workers ended, what was measured
    printed) runs for SIGTERM too."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises where argparse would print and exit, and notices a failed write."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The commands' parsers by name (on the top-level parser; see build_parser).
        self.commands: dict[str, Parser] = {}

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.prog)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            self._print_message(message, sys.stderr)
        raise ParserExit(status)

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse drops a failed write (--help >/dev/full would "succeed"): say so instead, and exit 2.
        if not message:
            return
        file = file or sys.stderr
        try:
            file.write(message)
            file.flush()
        except (AttributeError, OSError) as exc:
            error = OutputError(getattr(exc, "strerror", None) or str(exc))
            error.prog = self.prog  # type: ignore[attr-defined]
            raise error from None


#: Where _Namespace keeps the top level's options as they were when a command was named.
_TOP_LEVEL = "top_level_before_command"


class _Namespace(argparse.Namespace):
    """The parsed options; keeps what the top level held when a command was named.

    argparse sets the command's name, then copies the command's values (its defaults too) over the top
    level's. The top level's check options default to SUPPRESS, so what it holds at that moment is what was
    given before the name, which :func:`parse` refuses."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == COMMAND_DEST and value is not None:
            super().__setattr__(_TOP_LEVEL, dict(vars(self)))
        super().__setattr__(name, value)


def _add_global_options(parser: argparse.ArgumentParser, version: bool = True) -> None:
    # SUPPRESS: a command's parser must not reset a --debug given before the command's name.
    parser.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks of internal errors"
    )
    if version:
        parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")


def load(name: str) -> ModuleType:
    """The ``cli`` module of the command ``name`` (imported now if it was not yet)."""
    # __import__, not importlib.import_module: only an import through it is timed by ``python -X importtime``,
    # which is how benchmarks/passive_profile.py shows what a run loads.
    return __import__(SUBCOMMANDS[name], fromlist=["run"])


def build_parser(names: Iterable[str] | None = None, finding: bool = False) -> Parser:
    """The one parser: check's options at the top level (the default command) and a parser per command.

    The commands in ``names`` (None: every one) get their own options; the others are a name that takes
    anything, enough for argparse to see which command a line names. ``finding``: a parser that only finds
    that name (:func:`named_command`): no --help or --version, which would print."""
    default = load(DEFAULT)
    parser = Parser(
        prog=PROG,
        add_help=not finding,
        description=f"{default.DESCRIPTION} Without a COMMAND, hostcheck runs `{DEFAULT}` with the options given.",
        epilog="Exit codes: 0 ready, 1 not ready, 2 usage or environment error, 129/130/143 SIGHUP/SIGINT/SIGTERM. "
        "Docs: docs/hostcheck.md. "
        "`hostcheck bench --help`: measure what each CPU-side tuning buys (docs/bench.md). "
        "`hostcheck fleet --help`: one page from many nodes' reports (docs/fleet.md). "
        "`hostcheck job --help`: what holds a training job's GPUs back (docs/job.md). "
        "`hostcheck baseline --help`: record a known-good node for the baseline checks (docs/baseline.md).",
    )
    default.add_arguments(parser)
    # The top level's copies of check's options are in the namespace only when given (see _Namespace; parse
    # fills in check's defaults). set_defaults would put the SUPPRESS marker itself into the namespace, and
    # argparse has no public list of a parser's options: hence _actions.
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    _add_global_options(parser, version=not finding)
    commands = parser.add_subparsers(dest=COMMAND_DEST, metavar="COMMAND", title="commands")
    wanted = set() if finding else set(SUBCOMMANDS) if names is None else {DEFAULT, *names}
    for name in SUBCOMMANDS:
        if name not in wanted:  # a name only: what follows it is left to the full parser
            parser.commands[name] = commands.add_parser(name, prog=f"{PROG} {name}", add_help=False)
            continue
        module = load(name)
        sub = commands.add_parser(
            name,
            prog=f"{PROG} {name}",
            help=module.SUMMARY,
            description=module.DESCRIPTION,
            epilog=module.EPILOG,
        )
        module.add_arguments(sub)
        _add_global_options(sub)
        parser.commands[name] = sub
    return parser


def named_command(argv: Sequence[str]) -> set[str] | None:
    """The command ``argv`` names ({} for the default), read by a parser that loads no other command; None
    when that parser cannot tell (a usage error, ``--help`` or ``--version`` at the top level): then every
    command is loaded and the full parser says what it says today."""
    parser = build_parser((), finding=True)
    try:
        namespace, unknown = parser.parse_known_args(list(argv), namespace=_Namespace())
    except (UsageError, ParserExit, OutputError):
        return None
    name = getattr(namespace, COMMAND_DEST, None)
    if name is None:
        return None if unknown else set()
    return {name}


@dataclass(frozen=True)
class Invocation:
    """A parsed command line: the command, its options, and how its messages begin."""

    command: str
    args: argparse.Namespace
    prog: str
    debug: bool

    @property
    def run(self) -> Callable[[argparse.Namespace], int]:
        return load(self.command).run


def parse(argv: Sequence[str], parser: Parser | None = None) -> Invocation:
    """Parse a command line (raises UsageError, ParserExit, OutputError)."""
    parser = parser or build_parser(named_command(argv))
    namespace, unknown = parser.parse_known_args(list(argv), namespace=_Namespace())
    parsed = vars(namespace)
    name = parsed.pop(COMMAND_DEST)
    given_before = [k for k in parsed.pop(_TOP_LEVEL, {}) if k not in (COMMAND_DEST, *GLOBAL_DESTS)]
    args = argparse.Namespace(**parsed)
    if name is None:  # the default command: what the top level was given, check's defaults for the rest
        parser.commands[DEFAULT].parse_args([], namespace=args)
        prog = PROG
    elif given_before:
        flags = ", ".join("--" + dest.replace("_", "-") for dest in given_before)
        raise UsageError(f"{flags} given before {name!r}: a command's options go after its name", PROG)
    else:
        prog = parser.commands[name].prog
    if unknown:  # argparse would say so as the top level; the command they were given to says so here
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}", prog)
    args.command = name or DEFAULT
    args.debug = bool(getattr(args, "debug", False))
    return Invocation(args.command, args, prog, args.debug)


class _Stdout:
    """sys.stdout while a command runs. A write that fails (a full disk, /dev/full) raises OutputError, told
    apart from the command's other OSErrors; a reader that left (``| head``, EPIPE) sends the rest to
    /dev/null and the command goes on to its exit code. The rest is the stream's own."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _guarded(self, op: Callable[[], Any], fallback: Any) -> Any:
        try:
            return op()
        except BrokenPipeError:
            _stdout_to_devnull()
            return fallback
        except OutputError:
            raise
        except OSError as exc:
            raise OutputError(exc.strerror or str(exc)) from None

    def write(self, text: str) -> int:
        return self._guarded(lambda: self._stream.write(text), len(text))

    def flush(self) -> None:
        self._guarded(self._stream.flush, None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _Signals:
    """SIGHUP, SIGINT and SIGTERM for one run: remembered, and raised as Signalled while ``armed``."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.armed = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = self.received or signum
        # Held while the main thread starts a child: raised again once the child is registered (kill_all's).
        if self.armed and not signal_held(signum):
            raise Signalled(signum)

    def install(self) -> None:
        for sig in SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (tests): leave the signals alone
                break

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``hostcheck`` command: parse, run the command, and turn whatever happened into the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    signals = _Signals()
    signals.install()
    hook, threading.excepthook = threading.excepthook, _thread_failed
    unraisable, sys.unraisablehook = sys.unraisablehook, _unraisable
    try:
        return _main(argv, signals)
    finally:
        threading.excepthook = hook
        sys.unraisablehook = unraisable
        signals.restore()
        release_private_root()
        remove_pending()  # a file write a signal cut short leaves no temporary file


def _thread_failed(args: Any) -> None:
    """A worker thread that failed outside its own handler (no memory left to record its error): what it
    was doing is an error in the report already; one line on stderr, never a traceback."""
    with contextlib.suppress(BaseException):
        name = getattr(args.thread, "name", "?")
        sys.stderr.write(f"{PROG}: error: thread {name} ended with {args.exc_type.__name__}\n")


def _unraisable(args: Any) -> None:
    """An error Python could not raise anywhere (a thread that died before it ran, for want of memory under a
    small ulimit -v; its starter says so): one line on stderr, never a traceback."""
    with contextlib.suppress(BaseException):
        sys.stderr.write(f"{PROG}: error: {args.exc_type.__name__} ({args.err_msg or 'Exception ignored'})\n")


def entry_point() -> NoReturn:
    """The ``hostcheck`` console script and ``python -m hostcheck``: :func:`main`, then leave the process.

    A daemon thread still alive here (a gatherer or check abandoned at its deadline) may wake while the
    interpreter finalizes; CPython then ends it with pthread_exit, for which glibc loads libgcc_s, and under
    a tight address-space limit (ulimit -v) that load fails and glibc aborts the process (exit -6). With such
    a thread alive, the streams are flushed and the process leaves without finalizing: the exit code stands.
    """
    code = main()
    if any(t.daemon and t.is_alive() for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # closed or broken: main already said what it could
                if stream is not None:
                    stream.flush()
        os._exit(code)
    sys.exit(code)


def _main(argv: list[str], signals: _Signals) -> int:
    reopen()
    prog, debug = PROG, False
    code: int | None = None
    stdout = sys.stdout
    if stdout is not None:  # None: closed (`>&-`); a command that prints a report says so itself
        sys.stdout = _Stdout(stdout)
    signals.armed = True
    try:
        invocation = parse(argv)
        prog, debug = invocation.prog, invocation.debug
        code = invocation.run(invocation.args)
        if sys.stdout is not None:  # here, where a failure is still an exit code (at exit: a traceback)
            sys.stdout.flush()
    except KeyboardInterrupt:  # Signalled, or Ctrl-C where no handler could be installed: below
        signals.received = signals.received or signal.SIGINT
    except UsageError as exc:
        code = _usage_error(exc.prog, str(exc))
    except argparse.ArgumentError as exc:  # a command's own usage or environment error
        code = _usage_error(prog, str(exc))
    except ParserExit as exc:
        code = exc.status
    except OutputError as exc:
        _stdout_to_devnull()
        code = _error(getattr(exc, "prog", prog), f"writing to standard output: {exc}")
    except BrokenPipeError:  # written past _Stdout (a stream kept from before the run): the reader left
        _stdout_to_devnull()
        code = EXIT_USAGE if code is None else code
    except MemoryError:  # the run cannot go on here: an environment error, not hostcheck's
        if debug:
            with contextlib.suppress(Exception):
                traceback.print_exc()
        code = _error(prog, _out_of_memory())
    except Exception as exc:
        if debug:
            traceback.print_exc()
        code = _error(prog, f"internal error: {type(exc).__name__}: {exc} (re-run with --debug)", "")
    finally:
        signals.armed = False  # a second signal during the clean-up below is remembered, not raised
        if isinstance(sys.stdout, _Stdout):
            sys.stdout = stdout
    if signals.received:
        return _interrupted(prog, signals.received, finished=code is not None)
    return EXIT_USAGE if code is None else code


def _stdout_to_devnull() -> None:
    # Whatever is still buffered goes nowhere, so the flush at interpreter exit cannot fail again.
    with contextlib.suppress(AttributeError, OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)


def _out_of_memory() -> str:
    """Why the run could not go on, with the address-space limit when one is set: the usual cause."""
    try:
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return "out of memory"
        return f"out of memory (the address-space limit, ulimit -v, is {limit >> 20} MiB)"
    except Exception:  # no memory to say more
        return "out of memory"


def _error(prog: str, message: str, kind: str = "error: ") -> int:
    with contextlib.suppress(OSError, ValueError, MemoryError):
        print(f"{prog}: {kind}{message}", file=sys.stderr)
    return EXIT_USAGE


def _usage_error(prog: str, message: str) -> int:
    return _error(prog, message if "(see --" in message else f"{message} (see --help)")


def _interrupted(prog: str, signum: int, finished: bool) -> int:
    """SIGHUP/SIGINT/SIGTERM ended the run: every child still running killed (the threads that started them may never
    get to it), one line, 128 + the signal's number."""
    killed = kill_all()
    name = signal.Signals(signum).name
    # finished: the command caught the interrupt and reported what it had (bench's partial table).
    tail = "" if finished else ", no report"
    _error(prog, f"interrupted by {name}; {killed} child process(es) killed{tail}", "")
    return EXIT_SIGNAL_BASE + signum
