"""Conventions every invoke task follows: short flags, one JSON flag, checked numbers, pipes,
and the heartbeat that long work prints."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision.floor import progress
from tasks import ns

REPO = Path(__file__).resolve().parents[2]
INVOKE = [sys.executable, "-m", "invoke"]


def _flags(task_name: str) -> dict[str, list[str]]:
    task = ns[task_name]
    return {arg.name: sorted(arg.names) for arg in task.get_arguments()}


def test_no_task_flag_takes_h_and_the_chosen_short_flags() -> None:
    for name in ns.task_names:
        for arg in ns[name].get_arguments():
            assert "h" not in arg.names, f"{name} --{arg.name} took -h (help)"
    for name in ("provision", "test", "cache.list", "cache.clean", "bench", "build"):
        for arg in ns[name].get_arguments():
            assert "e" not in arg.names, f"{name} --{arg.name} took -e (invoke's --echo)"
    assert _flags("provision")["host"] == ["H", "host"]
    assert _flags("test")["list"] == ["l", "list"]


def test_reporting_tasks_share_one_json_flag() -> None:
    for name in ("test", "provision", "cache.list", "bench", "lab.status"):
        assert "json" in _flags(name), f"{name} has no --json"
    assert "json_out" not in _flags("cache.list") and "json_path" not in _flags("bench")


def _corrupt_cache(root: Path, count: int) -> Path:
    artifacts = root / "cache" / "artifacts"
    for i in range(count):
        (artifacts / f"entry-{i:05d}").mkdir(parents=True)
    return root / "cache"


@pytest.mark.slow
def test_cache_list_json_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    cache = _corrupt_cache(tmp_path, 3000)  # far more JSON than a pipe buffer holds
    proc = subprocess.Popen(
        [*INVOKE, "cache.list", "--cache-dir", str(cache), "--json", "-"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    head = proc.stdout.read(64)  # `| head -c 64`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert head.startswith(b"[") and "BrokenPipe" not in err and "Traceback" not in err


@pytest.mark.slow
def test_cache_list_json_to_a_file_and_bad_paths(tmp_path: Path) -> None:
    cache = _corrupt_cache(tmp_path, 2)
    out = tmp_path / "entries.json"
    run = subprocess.run(
        [*INVOKE, "cache.list", "--cache-dir", str(cache), "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert '"corrupt": true' in out.read_text()
    run = subprocess.run(
        [*INVOKE, "cache.list", "--cache-dir", str(cache), "--json", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "is a directory" in run.stderr


@pytest.mark.parametrize("value", ["-5", "abc"])
def test_cache_clean_rejects_bad_ages_and_removes_nothing(tmp_path: Path, value: str) -> None:
    cache = _corrupt_cache(tmp_path, 3)
    run = subprocess.run(
        [*INVOKE, "cache.clean", "--cache-dir", str(cache), f"--older-than-days={value}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"--older-than-days '{value}': use a number >= 0" in run.stderr
    assert "Traceback" not in run.stderr
    assert len(list((cache / "artifacts").iterdir())) == 3


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "", " ", " 2x"])
def test_number_flag_refuses_what_is_not_a_finite_non_negative_number(value: str) -> None:
    from invoke.exceptions import Exit

    from scripts.tasks.cli import number_flag

    assert number_flag("--n", None) is None  # not given
    # An empty value (`--older-than-days "$UNSET"`) is not "no limit": that would clean all.
    with pytest.raises(Exit) as info:
        number_flag("--n", value)
    assert info.value.code == 2 and "use a number >= 0" in str(info.value.message)


# -- heartbeat ----------------------------------------------------------------------------------


def test_heartbeat_in_a_log_prints_one_line_per_interval() -> None:
    out = io.StringIO()
    with progress.heartbeat("lane x", stream=out, interval=0.2, live=False) as beat:
        beat.update(done=3, total=10, note="tests/t.py::test_a")
        time.sleep(0.75)
    lines = out.getvalue().splitlines()
    assert 2 <= len(lines) <= 4, lines
    assert lines[0] == "[lane x] 0s elapsed, 3/10 done: tests/t.py::test_a"
    assert "\r" not in out.getvalue()


def test_heartbeat_on_a_terminal_redraws_one_line_and_clears_it() -> None:
    out = io.StringIO()
    with progress.heartbeat("build", stream=out, interval=0.1, live=True):
        time.sleep(0.35)
    text = out.getvalue()
    assert "\n" not in text and text.count("\r[build] 0s elapsed") >= 2
    assert text.endswith("\r")  # the status line is erased when the work ends


def test_heartbeat_defaults_quiet_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv(progress.load().INTERVAL_ENV, raising=False)
    monkeypatch.setenv("CI", "true")
    beat = progress.heartbeat("x", stream=Tty())
    assert beat.live is False and beat.interval == 30.0
    monkeypatch.delenv("CI")
    beat = progress.heartbeat("x", stream=Tty())
    assert beat.live is True and beat.interval == 1.0


def test_heartbeat_survives_a_closed_stream() -> None:
    out = io.StringIO()
    beat = progress.heartbeat("x", stream=out, interval=0.05, live=False).start()
    out.close()
    time.sleep(0.2)
    beat.stop()
    assert beat._stop.is_set()


def test_progress_loads_without_torch() -> None:
    code = (
        "import sys; from provision.floor import progress; progress.load(); "
        "assert 'torch' not in sys.modules, 'the heartbeat imported torch'"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, timeout=60)


@pytest.mark.parametrize(
    "argv",
    [
        ["--older-than-days", ""],
        ["--cache-dir", ""],
        ["--cache-dir", "FILE"],
    ],
)
def test_cache_clean_empty_or_file_values_exit_2_and_remove_nothing(
    tmp_path: Path, argv: list[str]
) -> None:
    cache = _corrupt_cache(tmp_path, 3)
    (tmp_path / "FILE").write_text("")
    argv = [str(tmp_path / "FILE") if a == "FILE" else a for a in argv]
    if "--cache-dir" not in argv:
        argv += ["--cache-dir", str(cache)]
    env = {**os.environ, "FLAGOS_BPU_CACHE": str(cache)}  # where an ignored flag would lead
    run = subprocess.run(
        [*INVOKE, "cache.clean", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "error: --" in run.stderr and "Traceback" not in run.stderr
    assert len(list((cache / "artifacts").iterdir())) == 3


def test_int_flag_refuses_an_empty_value() -> None:
    from invoke.exceptions import Exit

    from scripts.tasks.cli import int_flag

    assert int_flag("--workers", None) is None
    with pytest.raises(Exit) as info:
        int_flag("--workers", "")
    assert info.value.code == 2


class _BenchContext:
    """Stands in for invoke's Context: records each command, writes the JSON a bench would."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, object]] = []

    def cd(self, path: str):  # noqa: ANN201 - a context manager, like Context.cd
        import contextlib

        return contextlib.nullcontext()

    def run(self, command: str, **kwargs: object) -> None:
        self.runs.append((command, kwargs.get("out_stream")))
        if "bench_eager.py" in command and "--json " in command:  # the JSON bench --json shows
            path = command.split("--json ", 1)[1].split()[0].strip("'")
            Path(path).write_text('{"ratio": 1.5}\n')


def test_bench_json_dash_prints_only_the_json_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scripts.tasks import build as build_tasks

    monkeypatch.chdir(tmp_path)
    ctx = _BenchContext()
    build_tasks.bench.body(ctx, json="-")
    out = capsys.readouterr().out
    assert out.strip() == '{"ratio": 1.5}' and not (tmp_path / "-").exists()
    # every benchmark's own output goes to stderr, so stdout stays valid JSON
    assert ctx.runs and all(stream is sys.stderr for _, stream in ctx.runs)


def test_bench_json_is_the_users_path_and_never_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from invoke.exceptions import Exit

    from scripts.tasks import build as build_tasks

    monkeypatch.chdir(tmp_path)
    ctx = _BenchContext()
    build_tasks.bench.body(ctx, json="mine.json", quick=True)
    eager = next(cmd for cmd, _ in ctx.runs if "bench_eager.py" in cmd)
    assert f"--json {tmp_path / 'mine.json'}" in eager  # where the user ran it, not the repo
    assert (tmp_path / "mine.json").exists()
    with pytest.raises(Exit) as info:
        build_tasks.bench.body(_BenchContext(), json="")
    assert info.value.code == 2


def _tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


def _positional(name: str) -> list[str]:
    """A value for each positional argument of task `name` (what a user would type)."""
    return ["somewhere" for arg in ns[name].get_arguments() if arg.positional]


@pytest.mark.slow
def test_every_task_help_and_dry_run_change_nothing(tmp_path: Path) -> None:
    """Walking `invoke --list`: `TASK -h` (also where a positional would take it as a value)
    prints help and exits 0; `invoke --dry TASK` exits 0 and leaves the disk as it was."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / ".cache" / "torch-fl" / "bpu" / "artifacts" / "a").mkdir(parents=True)
    env = {**os.environ, "HOME": str(home), "FLAGOS_BPU_CACHE": str(home / ".cache/torch-fl/bpu")}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    before = _tree(tmp_path)
    for name in sorted(ns.task_names):
        for argv in (
            [name, "-h"],
            [name, "--help"],
            [name, *(["-h"] if _positional(name) else [])],
        ):
            if argv == [name]:
                continue
            run = subprocess.run(
                [*INVOKE, "-r", str(REPO), *argv], cwd=work, env=env, capture_output=True,
                text=True, timeout=120,
            )  # fmt: skip
            assert run.returncode == 0, (argv, run.stdout[-500:], run.stderr[-500:])
            assert "Usage:" in run.stdout and name.split(".")[-1] in run.stdout, (argv, run.stdout)
        if name in ("provision", "bench"):
            continue  # they honour --dry themselves (provision lane; bench only runs c.run)
        dry = subprocess.run(
            [*INVOKE, "-r", str(REPO), "--dry", name, *_positional(name)], cwd=work, env=env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert dry.returncode == 0 and "nothing was changed" in dry.stdout, (name, dry)
    assert _tree(tmp_path) == before


def test_readme_task_table_lists_every_task() -> None:
    import re

    table = (REPO / "README.md").read_text(encoding="utf-8").split("## Tasks", 1)[1]
    table = table.split("\n## ", 1)[0]
    for name in ns.task_names:
        shown = re.search(r"(invoke |`)" + re.escape(name) + r"[ `]", table)
        assert shown, f"README's task table does not list `{name}` (invoke --list has it)"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["test", "--lnae", "unit"], "Did you mean '--lane'?"),
        (["provision", "-H"], "--host needs a value"),
        (["test", "--lane"], "--lane needs a value"),
        (["cache.list", "--bogus"], "unknown flag or task '--bogus'"),
    ],
)
def test_unknown_flags_and_missing_values_exit_2(tmp_path: Path, argv, needle) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    run = subprocess.run(
        [*INVOKE, "-r", str(REPO), *argv], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert needle in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert list(tmp_path.iterdir()) == []  # nothing ran: no report, no cache


def test_no_guessed_short_flags() -> None:
    for name in ns.task_names:
        for arg in ns[name].get_arguments():
            shorts = [n for n in arg.names if len(n) == 1]
            assert shorts in ([], ["H"], ["l"]), f"{name} --{arg.name} has short flag {shorts}"
            if shorts:
                assert (shorts[0], arg.name) in (("H", "host"), ("l", "list"))


def test_ship_cache_to_an_empty_destination_unpacks_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "artifacts" / "a").mkdir(parents=True)
    work = tmp_path / "work"
    work.mkdir()
    for dest in ("", "  "):
        run = subprocess.run(
            [*INVOKE, "-r", str(REPO), "ship-cache", dest, "--cache-dir", str(cache)],
            cwd=work, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 2 and "DEST" in run.stderr, (run.stdout, run.stderr)
    assert list(work.iterdir()) == []  # Path("") is the cwd: nothing was unpacked there


def test_dash_h_as_a_positional_still_lists_the_flags() -> None:
    """`ship-cache -h` takes -h as DEST; invoke had popped the flag texts while parsing."""
    run = subprocess.run(
        [*INVOKE, "-r", str(REPO), "ship-cache", "-h"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "--insecure-host-key" in run.stdout and "--dir" in run.stdout, run.stdout
