"""`invoke ship-cache` to a board over the project's SSH target: a real sshd on loopback."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from provision import cache_ship
from scripts.tasks import ship

REPO = Path(__file__).resolve().parents[2]


def _cache(root: Path) -> None:
    key = "a" * 64
    entry = root / "artifacts" / key
    entry.mkdir(parents=True)
    data = b"hbm bytes"
    (entry / "model.hbm").write_bytes(data)
    files = {"model.hbm": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}}
    (entry / "manifest.json").write_text(json.dumps({"key": key, "files": files}))
    (root / "index").mkdir()
    (root / "index" / f"{key}.json").write_text("{}")


def _ship(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(REPO), "ship-cache", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_ship_cache_reaches_the_board_on_its_port_with_its_host_key(sshd, iso) -> None:
    root, env = iso
    sshd.client_home(Path(env["HOME"]))
    cache = root / "cache-here"
    _cache(cache)
    board_dir = sshd.remote / "bpu cache"  # a space: quoted on the board
    # `user@host:PORT` is the port (it was taken for a directory named after it)
    res = _ship(env, sshd.host, "--dir", str(board_dir), "--cache-dir", str(cache))
    assert res.returncode == 0, res.stdout + res.stderr
    entry = board_dir / "artifacts" / ("a" * 64)
    assert sorted(p.name for p in entry.iterdir()) == ["manifest.json", "model.hbm"]
    assert (board_dir / "index" / f"{'a' * 64}.json").is_file()
    assert not (REPO / str(sshd.port)).exists() and not (REPO / sshd.host).exists()


def test_ship_cache_refuses_a_board_whose_host_key_is_unknown(sshd, iso) -> None:
    root, env = iso
    sshd.client_home(Path(env["HOME"]), trust=False)
    cache = root / "cache-here"
    _cache(cache)
    board_dir = sshd.remote / "bpu"
    res = _ship(env, sshd.host, "--dir", str(board_dir), "--cache-dir", str(cache))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "known_hosts" in res.stderr and "Traceback" not in res.stderr
    assert not board_dir.exists()  # nothing reached a board that could be an impostor
    ok = _ship(env, sshd.host, "--dir", str(board_dir), "--cache-dir", str(cache),
               "--insecure-host-key")  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (board_dir / "artifacts" / ("a" * 64) / "model.hbm").is_file()


@pytest.mark.parametrize(
    ("dest", "address", "directory"),
    [
        ("root@board", "root@board:22", cache_ship.BOARD_CACHE),
        ("root@board:2222", "root@board:2222", cache_ship.BOARD_CACHE),
        ("root@board:2222:/data/c", "root@board:2222", "/data/c"),
        ("board:/srv/c", "board:22", "/srv/c"),
        ("u@b:~/c", "u@b:22", "~/c"),
        ("root@[fe80::2]:22", "root@[fe80::2]:22", cache_ship.BOARD_CACHE),
    ],
)
def test_board_destinations(dest: str, address: str, directory: str) -> None:
    assert ship.parse_board(dest, None) == ship.BoardDest(address, directory)
