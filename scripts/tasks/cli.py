"""Shared command-line conventions of the invoke tasks.

- Short flags follow pyinvoke/Fabric habits: `-H` is `--host`, `-l` is `--list`; no other task
  flag has one (no guessed letters that mean one flag here and another there), and none takes
  `-h` (so `invoke TASK -h` can never swallow the next word as a value).
- Typed flags are checked in one place; bad values exit 2 with the flag, the value and the fix.
- Reporting tasks write JSON with one flag, `--json PATH` (`-` for standard output), and a closed
  pipe (`... --json - | head`) ends quietly instead of in a BrokenPipeError traceback.
- SIGTERM is turned into the same KeyboardInterrupt as Ctrl-C, so one `except` handles both;
  an interrupt a task does not handle itself ends it with 130 and one line (invoke alone would
  exit 1 without a word), and so does an OSError it did not expect (exit 1, 2 for a name too
  long), never a traceback.
"""

from __future__ import annotations

import difflib
import errno
import json
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from invoke import Task
from invoke.exceptions import Exit, ParseError
from invoke.parser.parser import ParseMachine

from provision.floor import exitcodes, light, outpaths, progress, signals

INTERRUPTED_CODE = exitcodes.INTERRUPTED  # the task modules' name for it


HELP_WORDS = ("-h", "--help")


class CliTask(Task):
    """A Task whose short flags are chosen, not guessed: `@task(klass=CliTask, short={...})`.

    Two guards every task gets, because its body never sees them otherwise:
    - `-h`/`--help` where invoke hands it over as a value (a positional argument or a flag that
      takes one: `invoke ship-cache -h`) prints the task's help and does nothing else;
    - invoke's `--dry` only turns `c.run` into an echo, and a task that works in Python would
      still delete and write: unless the task honours dry runs itself (`honours_dry=True`, it
      then reads `c.config.run.dry`), `--dry` runs nothing and says so.
    """

    def __init__(
        self,
        *args: Any,
        short: dict[str, str] | None = None,
        honours_dry: bool = False,
        **kwargs: Any,
    ) -> None:
        self.short = dict(short or {})
        self.honours_dry = honours_dry
        super().__init__(*args, **kwargs)
        # invoke pops each flag's text out of self.help while it builds the parser; `TASK -h`
        # (the -h taken as a positional) prints them from this copy.
        self.flag_help = dict(self.help or {})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        values = [*args[1:], *kwargs.values()]
        if any(isinstance(v, str) and v.strip() in HELP_WORDS for v in values):
            print(self.help_text())
            raise Exit(code=0)
        context = args[0] if args else None
        dry = bool(getattr(getattr(getattr(context, "config", None), "run", None), "dry", False))
        if dry and not self.honours_dry:
            print(
                f"--dry: {self.cli_name} was not run (it works in Python, not through c.run, so a "
                "dry run cannot show its steps); nothing was changed"
            )
            return None
        # invoke itself turns Ctrl-C into a silent exit 1 and lets SIGTERM kill the process
        # mid-write; every task instead ends on one line with 130, and an OSError a task did not
        # expect (a name too long, a full disk) is one line, not a traceback.
        name = self.cli_name
        del _RECEIVED[:]
        try:
            with _signals_as_interrupt():
                return super().__call__(*args, **kwargs)
        except (Exit, SystemExit):
            raise  # the task's own ending (a flag error, its own 130), as it chose
        except KeyboardInterrupt:
            raise _interrupted(name) from None
        except BrokenPipeError:
            raise  # a reader that stopped early (`| head`): quiet, see _quiet_broken_pipe
        except Exception as err:
            if _RECEIVED:
                # A Ctrl-C inside an import can come out as another error (numpy, half
                # imported, ends in a RecursionError): it is still the interrupt.
                raise _interrupted(name) from None
            if isinstance(err, OSError):
                raise os_error_exit(name, err) from None
            raise

    @property
    def cli_name(self) -> str:
        """The name typed on the command line (`farm.test`, not `test`): see name_tasks()."""
        return self.__dict__.get("_cli_name") or self.name.replace("_", "-")

    def help_text(self) -> str:
        """What `invoke --help TASK` prints, in short: usage, the docstring, the flags."""
        name = self.cli_name
        lines = [f"Usage: invoke [--core-opts] {name} [--options]", ""]
        lines += [f"  {line}".rstrip() for line in (self.__doc__ or "").strip().splitlines()]
        if self.flag_help:
            lines += ["", "Options:"]
            for arg, text in self.flag_help.items():
                lines.append(f"  --{arg.replace('_', '-'):<24} {text}")
        return "\n".join(lines)

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        # No guessed short flags: invoke would give each task the first free letter of each
        # flag, so `-a` meant --lane, --artifacts, --accelerator or --march depending on the
        # task, and `-e` (invoke's own --echo) or `-n` could be taken. Only the letters chosen
        # in `short` exist, and they mean the same flag on every task that has one.
        reserved = {"h", "e", *self.short.values()}
        opts = super().arg_opts(name, default, set(taken_names) | reserved)
        long_name = next(n for n in opts["names"] if len(n) > 1)
        opts["names"] = [long_name] + ([self.short[name]] if name in self.short else [])
        return opts


class FlagError(ParseError, Exit):
    """A command line invoke cannot parse: exit 2 (usage error), like every other bad flag.

    invoke exits 1 for its own parse errors, and a list flag given no value (`provision -H`)
    was taken as not given at all, which provisioned this machine instead of a board.
    Being both a ParseError (invoke prints it) and an Exit (invoke takes its code) is what
    makes invoke's own handler exit 2 with the message once."""

    def __init__(self, msg: str, context: Any = None) -> None:
        ParseError.__init__(self, msg, context)
        self.text = msg
        self.message = None  # printed once, as the ParseError
        self._code = exitcodes.USAGE

    def __str__(self) -> str:
        return self.text


def _suggest(msg: str, context: Any) -> str:
    unknown = re.match(r"No idea what '(.+)' is!", msg)
    if not unknown:
        return msg if msg.startswith("error:") else f"error: {msg}"
    token = unknown.group(1)
    flags = sorted(getattr(context, "flags", {}) or {}) if context is not None else []
    close = difflib.get_close_matches(token, flags, n=1) if token.startswith("-") else []
    where = f"invoke {context.name} -h" if getattr(context, "name", None) else "invoke --list"
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"error: unknown flag or task {token!r}.{hint} ({where} lists what exists)"


def _parse_error(self: ParseMachine, msg: str) -> None:
    raise FlagError(_suggest(msg, self.context), self.context)


_complete_flag = ParseMachine.complete_flag


def _complete_flag_needing_a_value(self: ParseMachine) -> None:
    flag = self.flag
    if flag is not None and flag.kind is list and not self.flag_got_value:
        name = flag.name.replace("_", "-")
        self.error(f"error: --{name} needs a value and was given none (invoke TASK -h)")
    _complete_flag(self)


def _quiet_broken_pipe(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    # invoke's own output (`invoke TASK -h | head -2`, `invoke --list | head`) hits a closed
    # pipe outside any task: the reader has what it wanted, which is no traceback's business.
    if issubclass(kind, BrokenPipeError):
        _quiet_stdout()
        return
    _excepthook(kind, value, tb)


# Installed when the task modules load, i.e. in the invoke process only (tasks.py imports this).
ParseMachine.error = _parse_error
ParseMachine.complete_flag = _complete_flag_needing_a_value
_excepthook = sys.excepthook
sys.excepthook = _quiet_broken_pipe


def name_tasks(ns: Any) -> None:
    """Tell each CliTask its full command-line name, collection included (a task object only
    knows its own: `test` for both `test` and `farm.test`)."""
    for name in ns.task_names:
        task = ns[name]
        if isinstance(task, CliTask):
            task.__dict__["_cli_name"] = name


def bad_flag(flag: str, value: object, fix: str) -> Exit:
    """The one shape of a flag error: exit 2, the flag, the value as given, what to do."""
    return Exit(f"error: {flag} {outpaths.shown(value)}: {fix}", code=exitcodes.USAGE)


def os_error_exit(name: str, err: OSError) -> Exit:
    """One line for an OSError: what failed, on which path. A name too long can only have come
    from a value given (a flag, an environment variable): exit 2 like other bad values."""
    where = f": {outpaths.shown(err.filename)}" if err.filename is not None else ""
    if err.filename2 is not None:
        where += f" -> {outpaths.shown(err.filename2)}"
    if err.errno == errno.ENAMETOOLONG:
        return Exit(
            f"error: {name}: a path is too long{where}; use a shorter one", code=exitcodes.USAGE
        )
    return Exit(f"error: {name}: {err.strerror or err}{where}", code=exitcodes.FAILED)


def int_flag(flag: str, value: object, minimum: int = 1, maximum: int | None = None) -> int | None:
    """An optional integer flag (invoke hands over strings); None (not given) stays None.

    An empty value is an error, not "not given": `--workers "$UNSET"` must not run the default.
    """
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise bad_flag(flag, value, f"use a whole number >= {minimum}") from None
    if number < minimum:
        raise bad_flag(flag, value, f"use a whole number >= {minimum}")
    if maximum is not None and number > maximum:
        raise bad_flag(flag, value, f"use a whole number from {minimum} to {maximum}")
    return number


def number_flag(flag: str, value: object, minimum: float = 0.0) -> float | None:
    """An optional non-negative (or >= minimum) finite number; empty is an error, not None
    (`cache.clean --older-than-days "$UNSET"` must not clean everything)."""
    if value is None:
        return None
    try:
        number = float(str(value).strip())
    except ValueError:
        raise bad_flag(flag, value, f"use a number >= {minimum:g}") from None
    if not math.isfinite(number) or number < minimum:
        raise bad_flag(flag, value, f"use a number >= {minimum:g}")
    return number


def check_output_file(flag: str, value: str | None) -> Path | None:
    """Refuse an output file that cannot be written before any work starts (exit 2)."""
    if value is None or value == "-":
        return None
    path = Path(value).expanduser()
    problem = outpaths.file_problem(path) if str(value).strip() else "is empty; give a file path"
    if problem:
        raise bad_flag(flag, value, problem)
    return path


def _quiet_stdout() -> None:
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot raise.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def write_json(doc: Any, dest: str) -> None:
    """Write `doc` as JSON to the file `dest` (atomically) or to stdout when dest is `-`."""
    text = json.dumps(doc, indent=1, sort_keys=False, default=str) + "\n"
    if dest == "-":
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            _quiet_stdout()  # the reader (head, less) has enough: not an error
        return
    light.load("atomic").write_text(Path(dest).expanduser(), text)


def print_lines(lines: list[str]) -> None:
    """Print to stdout; a reader that closed the pipe early ends the output quietly."""
    try:
        for line in lines:
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()


_RECEIVED: list[int] = []  # the interrupting signals the running task got, in order


def _interrupted(name: str) -> Exit:
    how = "SIGTERM" if signal.SIGTERM in _RECEIVED else "Ctrl-C"
    print(f"{name}: interrupted ({how}); stopped", file=sys.stderr)
    return Exit(code=INTERRUPTED_CODE)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt like Ctrl-C does."""
    with signals.as_interrupt((signal.SIGTERM,), on_signal=_RECEIVED.append):
        yield


@contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM both raise KeyboardInterrupt, and are recorded in _RECEIVED."""
    with signals.as_interrupt((signal.SIGINT, signal.SIGTERM), on_signal=_RECEIVED.append):
        yield


def heartbeat(label: str, **kwargs: Any) -> Any:
    """A torch_fl._progress.Heartbeat, loaded without importing torch."""
    return progress.heartbeat(label, **kwargs)


def split_names(values: list[str] | str | None) -> list[str]:
    """`a,b` and repeated flags alike -> ['a', 'b']; blanks dropped."""
    if values is None:
        return []
    items = [values] if isinstance(values, str) else values
    return [n.strip() for v in items for n in v.split(",") if n.strip()]


def exit_interrupted(summary: Callable[[], None] | None = None) -> Exit:
    """Print what is known (via `summary`) and return the Exit for an interrupted task."""
    if summary is not None:
        summary()
    return Exit(code=INTERRUPTED_CODE)
