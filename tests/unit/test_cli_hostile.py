"""Every task against a hostile user: empty, huge and unicode values, a FIFO or a device where a
file is expected, Ctrl-C and SIGTERM half-way, two runs at once. Each ends on one clear line
(exit 2 for a bad value, 130 for an interrupt), never a traceback, and loses nothing on disk."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision.floor import outpaths

REPO = Path(__file__).resolve().parents[2]
INVOKE = [sys.executable, "-m", "invoke", "-r", str(REPO)]
HUGE = "x" * 5000


def _tree(root: Path) -> list[tuple[str, int, int, int]]:
    """Every path under root with its type, size and mtime: what "nothing changed" compares."""
    rows = []
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        rows.append((str(p.relative_to(root)), stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns))
    return rows


def _invoke(argv: list[str], home: Path, *, env: dict[str, str] | None = None, timeout: float = 60):
    """`invoke ARGV` in a scratch cwd and HOME; on a timeout the whole process group goes (a task
    that started heavy work on a bad value must not keep running after the test)."""
    cwd = home / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "TORCH_FL_"))}
    full_env.update(HOME=str(home), TORCH_DEVICE_BACKEND_AUTOLOAD="0", CI="true",
                    FLAGOS_BPU_CACHE=str(home / "bpu"))  # fmt: skip
    full_env.update(env or {})
    proc = subprocess.Popen(
        [*INVOKE, *argv], cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"invoke {argv[:3]} still ran after {timeout} s")
    return proc.returncode, out, err


@pytest.fixture
def scratch(tmp_path: Path) -> dict[str, Path]:
    home = tmp_path / "home"
    (home / "cwd").mkdir(parents=True)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "cache" / "artifacts" / ("a" * 64)).mkdir(parents=True)
    return {"tmp": tmp_path, "home": home, "fifo": fifo, "cache": tmp_path / "cache"}


# -- bad values: exit 2, one line, nothing changed ----------------------------------------------

FARM = ["--coordinator", "127.0.0.1:9", "--place", "p1", "--reserve-timeout", "5"]

BAD_VALUES = [
    # a FIFO as an output file: it was replaced by a regular file (the pipe destroyed)
    (["cache.list", "--cache-dir", "{cache}", "--json", "{fifo}"], "named pipe (FIFO)"),
    (["lab.status", "--json", "{fifo}"], "named pipe (FIFO)"),
    (["test", "--lane", "lint", "--json", "{fifo}"], "named pipe (FIFO)"),
    (["--dry", "provision", "--only", "envfile", "--json", "{fifo}"], "named pipe (FIFO)"),
    (["--dry", "provision", "--only", "envfile", "--report", "{fifo}"], "named pipe (FIFO)"),
    # a 5000-character value: OSError (File name too long) tracebacks, an idna UnicodeError
    (["cache.list", "--cache-dir", HUGE], "(5000 characters): cannot be used as a path"),
    (["cache.list", "--json", HUGE], "(5000 characters): cannot be used as a path"),
    (["cache.clean", "--cache-dir", HUGE], "(5000 characters): cannot be used as a path"),
    (["ship-cache", HUGE, "--cache-dir", "{cache}"], "(5000 characters): cannot be used as a path"),
    (["ship-cache", "{tmp}/d", "--cache-dir", HUGE], "(5000 characters): cannot be used as a path"),
    (["matrix-update", "--junit-dir", HUGE], "(5000 characters): cannot be used as a path"),
    (["test", "--lane", "lint", "--json", HUGE], "(5000 characters): cannot be used as a path"),
    (["test", "--lane", "lint", "--junit-dir", HUGE], "(5000 characters): cannot be used"),
    (["--dry", "provision", "--host", HUGE], "a host name has at most 253"),
    (["--dry", "provision", "--artifacts", HUGE], "cannot be used as a path"),
    (["--dry", "provision", "--oe-wheels", HUGE], "cannot be used as a path"),
    (["--dry", "provision", "--json", HUGE], "cannot be used as a path"),
    (["farm.provision", *FARM, "--artifacts", HUGE], "cannot be used as a path"),
    (["farm.provision", *FARM, "--out", HUGE], "cannot be used as a path"),
    (["farm.test", "--lane", "unit", *FARM, "--matrix-file", HUGE], "cannot be used as a path"),
    # a FIFO or a non-directory where a directory is read
    (["matrix-update", "--junit-dir", "{fifo}"], "is not a directory"),
    # empty values taken as "not given": the default ran (a lab build of many minutes, a board's
    # interpreter, a tag filter dropped unseen)
    (["lab.up", "--page-size", ""], "--page-size '': use 64k or 16k"),
    (["farm.provision", *FARM, "--tag", ""], "--tag '' is empty"),
    (["farm.test", "--lane", "unit", *FARM, "--board-python", " "], "--board-python ' '"),
    (
        ["farm.test", "--lane", "unit", *FARM, "--matrix-file", "/etc/hostname"],
        "outside the checkout",
    ),
    # compile-host: every value checked before torch imports and before hbdk4 is looked for
    (["compile-host", "no-colon"], "MODEL 'no-colon': give module:callable"),
    (["compile-host", "m:f", "--shape", ""], "--shape '': give the input shape"),
    (["compile-host", "m:f", "--shape", "1,0,3"], "whole numbers >= 1"),
    (["compile-host", "m:f", "--calibration", "{fifo}"], "is not a regular file"),
    (["compile-host", "m:f", "--state-dict", "{tmp}/none.pt"], "does not exist"),
    (["compile-host", "m:f", "--march", "é✓日本"], "use one of nash-e"),
]


@pytest.mark.parametrize(
    ("argv", "needle"), BAD_VALUES, ids=[" ".join(a)[:70] for a, _ in BAD_VALUES]
)
def test_a_bad_value_exits_2_on_one_line_and_changes_nothing(
    scratch: dict[str, Path], argv: list[str], needle: str
) -> None:
    argv = [a.format(**{k: str(v) for k, v in scratch.items()}) for a in argv]
    before = _tree(scratch["tmp"])
    started = time.monotonic()
    code, out, err = _invoke(argv, scratch["home"])
    assert code == 2, (out[-500:], err[-500:])
    assert needle in err and "Traceback" not in err + out, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and len(lines[0]) < 400, lines  # one line, the value cut short
    assert stat.S_ISFIFO(scratch["fifo"].stat().st_mode)  # still a FIFO, never replaced
    assert _tree(scratch["tmp"]) == before
    assert time.monotonic() - started < 30  # refused before any work (torch, lanes, a build)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root; root is who /dev/null was lost to")
def test_a_device_as_report_is_refused_not_replaced(scratch: dict[str, Path]) -> None:
    # As root, `--json /dev/null` renamed a regular file over /dev/null; a copy stands in here.
    null = scratch["tmp"] / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    for argv in (["cache.list", "--json", str(null)], ["lab.status", "--json", str(null)]):
        code, _, err = _invoke(argv, scratch["home"])
        assert code == 2 and "is a device, not a regular file" in err and "Traceback" not in err
        assert stat.S_ISCHR(null.stat().st_mode)


def test_a_huge_environment_value_is_one_line(scratch: dict[str, Path]) -> None:
    for argv, env in (
        (["cache.list"], {"FLAGOS_BPU_CACHE": HUGE}),
        (["lab.status"], {"TORCH_FL_LAB_CACHE": HUGE}),
    ):
        code, out, err = _invoke(argv, scratch["home"], env=env)
        assert code == 2 and "Traceback" not in err + out, err
        assert len(err.strip().splitlines()) == 1 and "characters)" in err, err


def test_help_into_a_closed_pipe_prints_no_traceback() -> None:
    cmd = f"{' '.join(INVOKE)} farm.test -h | head -c 20"
    run = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.stdout.startswith("Usage: inv") and "farm.test" not in run.stderr
    assert "Traceback" not in run.stderr and "BrokenPipe" not in run.stderr, run.stderr


# -- nothing lost ---------------------------------------------------------------------------------


def test_lab_clean_keeps_what_the_lab_cache_did_not_write(tmp_path: Path) -> None:
    # TORCH_FL_LAB_CACHE pointed at one's own directory: lab.clean removed every file in it.
    own = tmp_path / "mine"
    (own / "photos").mkdir(parents=True)
    (own / "thesis.tex").write_text("years of work")
    (own / "kernel-0123456789abcdef").mkdir()
    (own / ".kernel-0123456789abcdef.lock").write_text("")
    (own / "run").mkdir()  # a plain word: kept, since the directory is not the cache's alone
    code, out, err = _invoke(["lab.clean"], tmp_path / "home", env={"TORCH_FL_LAB_CACHE": str(own)})
    assert code == 0 and "Traceback" not in err, err
    assert sorted(p.name for p in own.iterdir()) == ["photos", "run", "thesis.tex"]
    assert "kept" in out and "removed" in out


def test_lab_cache_clean_removes_its_own_entries(tmp_path: Path, monkeypatch) -> None:
    from scripts.lab import cache

    monkeypatch.setenv("TORCH_FL_LAB_CACHE", str(tmp_path))
    for name in ("kernel-0123456789abcdef", "rootfs-0123456789abcdef.x1y2", "apt", "run"):
        (tmp_path / name).mkdir()
    (tmp_path / ".x86python-0123456789abcdef.lock").write_text("")
    removed, kept = cache.clean()
    assert kept == [] and len(removed) == 5 and list(tmp_path.iterdir()) == []


def test_a_corrupt_lab_state_file_is_one_warning(tmp_path: Path) -> None:
    run_dir = tmp_path / "home" / ".cache" / "torch-fl" / "lab" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "lab.json").write_text('{"pid": "abc"')
    for task, code_expected in (("lab.status", 0), ("lab.down", 0), ("lab.ssh", 2)):
        code, out, err = _invoke([task], tmp_path / "home")
        assert code == code_expected and "Traceback" not in err + out, err
        assert "ignored the unreadable state file" in err


def test_cache_clean_of_a_directory_that_is_no_cache_removes_nothing(tmp_path: Path) -> None:
    # ArtifactCache.clean() removed DIR/index wholesale: `--cache-dir ~` lost ~/index.
    own = tmp_path / "mine"
    (own / "index").mkdir(parents=True)
    (own / "index" / "notes.txt").write_text("mine")
    code, out, err = _invoke(["cache.clean", "--cache-dir", str(own)], tmp_path / "home")
    assert code == 0 and "removed 0 artifact(s)" in out and "Traceback" not in err
    assert (own / "index" / "notes.txt").read_text() == "mine"


def test_cache_sweep_removes_only_what_the_cache_wrote(tmp_path: Path) -> None:
    from scripts.tasks import bpu

    key = "b" * 64
    (tmp_path / "artifacts" / f".trash-{key}-999999999-1").mkdir(parents=True)  # no such pid
    (tmp_path / "artifacts" / f".trash-{key}-{os.getpid()}-1").mkdir()  # a live clean's
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / f"{key}.json").write_text("{}")
    (tmp_path / "index" / f".{key}.json.12.ab.tmp").write_text("")
    (tmp_path / "index" / "notes.txt").write_text("mine")
    bpu._sweep(tmp_path, index_too=True)
    assert [p.name for p in (tmp_path / "artifacts").iterdir()] == [f".trash-{key}-{os.getpid()}-1"]
    assert [p.name for p in (tmp_path / "index").iterdir()] == ["notes.txt"]


def _cache_with(root: Path, count: int, size: int = 1000) -> None:
    for i in range(count):
        key = hashlib.sha256(str(i).encode()).hexdigest()
        entry = root / "artifacts" / key
        entry.mkdir(parents=True)
        data = os.urandom(size)
        (entry / "model.hbm").write_bytes(data)
        files = {"model.hbm": {"sha256": hashlib.sha256(data).hexdigest(), "size": size}}
        meta = {"key": key, "created": time.time() - 86400, "files": files}
        (entry / "manifest.json").write_text(json.dumps(meta))
    (root / "index").mkdir(parents=True, exist_ok=True)


def test_ship_cache_interrupted_leaves_no_half_entry(tmp_path: Path, monkeypatch) -> None:
    import tarfile

    from scripts.tasks import ship

    src = tmp_path / "src"
    _cache_with(src, 5)
    bundle = tmp_path / "b.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(src / "artifacts", arcname="artifacts")
    dest = tmp_path / "dest"
    moved = []
    real_move = ship._move_into_place

    def move_then_interrupt(entry: Path, final: Path, staging: Path) -> None:
        if len(moved) == 2:
            raise KeyboardInterrupt
        real_move(entry, final, staging)
        moved.append(final.name)

    monkeypatch.setattr(ship, "_move_into_place", move_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        ship._unpack_whole(bundle, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["artifacts"]  # no staging left
    entries = list((dest / "artifacts").iterdir())
    assert sorted(e.name for e in entries) == sorted(moved)
    assert all(
        sorted(p.name for p in e.iterdir()) == ["manifest.json", "model.hbm"] for e in entries
    )
    monkeypatch.setattr(ship, "_move_into_place", real_move)
    for _ in range(2):  # again, over what is there: each entry replaced whole, never nested
        ship._unpack_whole(bundle, dest)
    assert len(list((dest / "artifacts").iterdir())) == 5
    assert all(not (e / e.name).exists() for e in (dest / "artifacts").iterdir())
    assert sorted(p.name for p in dest.iterdir()) == ["artifacts"]


def test_ship_cache_remote_script_unpacks_whole_entries(tmp_path: Path) -> None:
    """The script ship-cache runs on a board, run here by sh: a directory with spaces and `;`
    under ~, twice (the second replaces, never nests), the tarball removed."""
    import shutil
    import tarfile

    from provision import cache_ship

    src = tmp_path / "src"
    _cache_with(src, 2)
    (src / "index" / f"{'c' * 64}.json").write_text("{}")
    for _ in range(2):
        tarball = tmp_path / "b.tar.gz"
        with tarfile.open(tarball, "w:gz") as tar:
            tar.add(src / "artifacts", arcname="artifacts")
            tar.add(src / "index", arcname="index")
        script = cache_ship.remote_unpack_script("~/my cache; x", str(tarball))
        env = {"HOME": str(tmp_path / "board"), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        (tmp_path / "board").mkdir(exist_ok=True)
        subprocess.run(["sh", "-c", script], env=env, check=True, timeout=60)
        assert not tarball.exists()
    dest = tmp_path / "board" / "my cache; x"
    assert sorted(p.name for p in dest.iterdir()) == ["artifacts", "index"]
    for entry in (dest / "artifacts").iterdir():
        assert sorted(p.name for p in entry.iterdir()) == ["manifest.json", "model.hbm"]
    shutil.rmtree(tmp_path / "board")


@pytest.mark.parametrize(
    ("dest", "remote"),
    [("root@board", True), ("board:/srv/c", True), ("u@b:~/c", True),
     ("/backups/cache@2024", False), ("./a:b", False), ("~/c@x", False), ("plain", False)],
)  # fmt: skip
def test_ship_cache_tells_a_board_from_a_local_directory(dest: str, remote: bool) -> None:
    from scripts.tasks import ship

    assert ship.is_remote(dest) is remote  # `/x/cache@2024` went to SSH as a host


# -- Ctrl-C and SIGTERM: 130 and one line ---------------------------------------------------------


def _cli_task(body):
    from invoke import task

    from scripts.tasks.cli import CliTask

    return task(klass=CliTask)(body)


def test_ctrl_c_in_any_task_is_130_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from invoke import Context
    from invoke.exceptions import Exit

    def interrupted(c):
        raise KeyboardInterrupt

    def terminated(c):
        os.kill(os.getpid(), signal.SIGTERM)  # turned into KeyboardInterrupt for the task
        time.sleep(5)

    for body, how in ((interrupted, "Ctrl-C"), (terminated, "SIGTERM")):
        with pytest.raises(Exit) as info:
            _cli_task(body)(Context())
        assert info.value.code == 130
        assert capsys.readouterr().err.strip() == f"{body.__name__}: interrupted ({how}); stopped"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back


def test_an_unexpected_os_error_is_one_line() -> None:
    from invoke import Context
    from invoke.exceptions import Exit

    def full(c):
        raise OSError(28, "No space left on device", "/data/out.json")

    with pytest.raises(Exit) as info:
        _cli_task(full)(Context())
    assert info.value.code == 1
    assert info.value.message == "error: full: No space left on device: '/data/out.json'"


@pytest.mark.slow
def test_cache_clean_interrupted_half_way_keeps_every_entry_whole(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _cache_with(cache, 3000)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "HOME": str(tmp_path), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = subprocess.Popen(
        [*INVOKE, "cache.clean", "--cache-dir", str(cache)], cwd=cwd, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    # Interrupt once entries are going (not at a fixed time: on a loaded machine torch may still
    # be importing at any fixed delay, which is another case, tested elsewhere).
    artifacts = cache / "artifacts"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if sum(1 for _ in artifacts.iterdir()) < 3000:
            break
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode in (0, -signal.SIGINT) and not err:
        # the clean finished before the interrupt arrived (after it, Ctrl-C ends the exit)
        pytest.skip("the clean finished before the interrupt arrived")
    assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err)
    assert len(err.strip().splitlines()) == 1 and "cache.clean: interrupted" in err
    for entry in (cache / "artifacts").iterdir():
        if entry.name.startswith(".trash-"):
            continue  # moved aside whole before its removal began: the cache never reads these
        assert sorted(p.name for p in entry.iterdir()) == ["manifest.json", "model.hbm"]
    again = subprocess.run(
        [*INVOKE, "cache.clean", "--cache-dir", str(cache)], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert list((cache / "artifacts").iterdir()) == []  # the rest, and the dead run's trash


# -- two runs at once -----------------------------------------------------------------------------


def test_a_second_provisioning_run_of_one_target_exits_2(tmp_path: Path) -> None:
    """Two `invoke provision` of this machine at once ran apt and builds side by side."""
    locks = tmp_path / "home" / ".cache" / "torch-fl" / "provision" / "locks"
    locks.mkdir(parents=True)
    with open(locks / "local.lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # the first run
        env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
        code, out, err = _invoke(
            ["provision", "--only", "envfile", "--json", str(tmp_path / "r.json")],
            tmp_path / "home", env=env,
        )  # fmt: skip
    assert code == 2, (out, err)
    assert "another provisioning run of local is in progress" in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "cfg").exists()


# -- the checks themselves ------------------------------------------------------------------------


def test_outpaths_names_the_problem(tmp_path: Path) -> None:
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    assert "named pipe" in (outpaths.file_problem(fifo) or "")
    assert "is 5000 bytes long" in (outpaths.file_problem(Path(HUGE)) or "")
    assert "is 300 bytes long" in (outpaths.dir_problem(tmp_path / "n" / ("y" * 300)) or "")
    assert "NUL" in (outpaths.lookup_problem("a\0b") or "")
    assert outpaths.lookup_problem(tmp_path / "absent" / "f") is None
    assert outpaths.shown("abc") == "'abc'" and outpaths.shown(HUGE).endswith("(5000 characters)")


@pytest.mark.parametrize("host", [HUGE, "a." + "b" * 64, "root@" + "c" * 254])
def test_parse_host_refuses_names_dns_cannot_hold(host: str) -> None:
    from provision.target import parse_host

    with pytest.raises(ValueError, match="a host name has at most 253"):
        parse_host(host)
