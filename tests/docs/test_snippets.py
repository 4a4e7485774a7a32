"""Every code block in README.md and docs/*.md runs as written.

- ```python blocks run in a fresh interpreter; ```sh / ```bash blocks run command by command
  with `.venv/bin` first on PATH. Both run in the repository with HOME, the XDG directories and
  the BPU cache in a temp dir, so a snippet never touches the developer's own files.
- A block that cannot run here (it needs a board, the vendor's wheels, or runs the whole matrix)
  says so on the line above its fence: `<!-- snippet: skip: REASON -->`. Its invoke command lines
  are still parsed by invoke's real parser against this repository's tasks, so a documented flag
  that does not exist (or lost its value) fails here.
- ```yaml blocks must parse; ```text blocks are output or diagrams. A block without a language
  is an error: nothing is left out silently.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from invoke import Program

REPO = Path(__file__).resolve().parents[2]  # tests/docs/ -> the repository
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)\s*$")
SKIP = re.compile(r"^<!--\s*snippet:\s*skip:\s*(?P<reason>.*?)\s*-->\s*$")
RUNNABLE = {"python", "sh", "bash"}
KNOWN = RUNNABLE | {"yaml", "text"}
MAX_SKIPPED = 14  # skips need a reason and must stay few


@dataclass
class Snippet:
    path: Path
    line: int
    lang: str
    text: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def extract(path: Path) -> list[Snippet]:
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Snippet] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, lang = i, match.group(1)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{path}:{i + 1}: unclosed code block"
        marker = SKIP.match(lines[start - 1]) if start else None
        text = "\n".join(lines[start + 1 : end]) + "\n"
        out.append(Snippet(path, start + 1, lang, text, marker["reason"] if marker else None))
        i = end + 1
    return out


SNIPPETS = [s for path in DOCS for s in extract(path)]


def commands(text: str) -> list[str]:
    """Shell command lines: continuations joined, comments and blank lines dropped."""
    joined = text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split()
        if words:
            out.append(line.split(" #", 1)[0].strip())
    return out


def sandbox_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FLAGOS_BPU_"))}
    env.update(
        HOME=str(root / "home"),
        XDG_DATA_HOME=str(root / "data"),
        XDG_CONFIG_HOME=str(root / "config"),
        XDG_CACHE_HOME=str(root / "cache"),
        FLAGOS_BPU_CACHE=str(root / "bpu-cache"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=str(REPO),
    )
    (root / "home").mkdir(parents=True, exist_ok=True)
    return env


def run_in_group(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a snippet as the leader of its own process group; whatever stops the test (its
    timeout, Ctrl-C) stops the snippet and everything it started."""
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _by(lang: set[str], skipped: bool | None = None) -> list[Snippet]:
    return [
        s
        for s in SNIPPETS
        if s.lang in lang and (skipped is None or (s.skip is not None) == skipped)
    ]


def test_every_block_has_a_known_language_and_skips_say_why() -> None:
    assert SNIPPETS, "no code blocks found"
    unknown = [f"{s.id} ```{s.lang}" for s in SNIPPETS if s.lang not in KNOWN]
    assert not unknown, f"label these blocks ({', '.join(sorted(KNOWN))}): {unknown}"
    skipped = [s for s in SNIPPETS if s.skip is not None]
    assert all(len(s.skip or "") >= 10 for s in skipped), [s.id for s in skipped]
    assert all(s.lang in RUNNABLE for s in skipped), "only runnable blocks can be skipped"
    assert len(skipped) <= MAX_SKIPPED, [s.id for s in skipped]


def _built() -> bool:
    return bool(list((REPO / "torch_fl").glob("_C*.so")))


@pytest.mark.parametrize("snippet", _by({"python"}, skipped=False), ids=lambda s: s.id)
def test_python_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    if not _built():
        pytest.skip("torch_fl._C is not built (invoke build --accelerator bpu)")
    script = tmp_path / "snippet.py"
    script.write_text(snippet.text)
    proc = run_in_group([sys.executable, str(script)], sandbox_env(tmp_path))
    assert proc.returncode == 0, f"{snippet.id}:\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize("snippet", _by({"sh", "bash"}, skipped=False), ids=lambda s: s.id)
def test_shell_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    env = sandbox_env(tmp_path)
    for command in commands(snippet.text):
        proc = run_in_group(["bash", "-c", command], env)
        assert proc.returncode == 0, f"{snippet.id}: `{command}`:\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, f"{snippet.id}: `{command}`:\n{proc.stderr}"


def _invoke_argvs(text: str) -> list[list[str]]:
    argvs = []
    for command in commands(text):
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token in ("&&", "||", ";", "|", "&", ";;", "(", ")"):
                if words and Path(words[0]).name in ("invoke", "inv"):
                    argvs.append(["invoke", *words[1:]])
                words = []
            else:
                words.append(token)
    return argvs


@pytest.mark.parametrize("snippet", _by({"sh", "bash"}), ids=lambda s: s.id)
def test_invoke_lines_parse(snippet: Snippet) -> None:
    from tasks import ns

    for argv in _invoke_argvs(snippet.text):
        program = Program(namespace=ns, name="invoke", binary="invoke")
        program.create_config()
        program.parse_core(argv)
        program.parse_collection()
        program.parse_tasks()  # raises ParseError for an unknown flag or a missing value
        assert program.tasks, f"{snippet.id}: {' '.join(argv)} names no task"


@pytest.mark.parametrize("snippet", _by({"yaml"}), ids=lambda s: s.id)
def test_yaml_snippet_parses(snippet: Snippet) -> None:
    assert yaml.safe_load(snippet.text) is not None


def test_a_skip_marker_is_honoured_and_parse_checks_still_apply() -> None:
    text = "<!-- snippet: skip: needs a board somewhere -->\n```sh\ninvoke provision --bogus\n```\n"
    path = REPO / "docs" / "_probe.md"
    try:
        path.write_text(text)
        (snippet,) = extract(path)
    finally:
        path.unlink()
    assert snippet.skip == "needs a board somewhere"
    from invoke.exceptions import ParseError

    with pytest.raises(ParseError):
        test_invoke_lines_parse(snippet)


def test_a_stopped_snippet_leaves_nothing_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    def stop(signum: int, frame: object) -> None:
        raise TimeoutError("the test's time is up")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(5)  # long enough for bash to start on a busy host
    try:
        with pytest.raises(TimeoutError):
            run_in_group(["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], dict(os.environ))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    stat = Path(f"/proc/{int(pid_file.read_text())}/stat")

    def running() -> bool:
        # Gone, or a zombie waiting to be collected: either way no longer running.
        try:
            return stat.read_text().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    # SIGKILL is delivered asynchronously: give the kernel a moment (a busy host) to finish it.
    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(), f"the snippet's child {stat.parent.name} still runs"
