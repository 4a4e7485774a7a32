"""Pinned downloads resume and retry, against a real HTTP server on loopback that drops
connections part-way (provision/download.py)."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.download import DownloadError, download

PAYLOAD = bytes(range(256)) * 8192  # 2 MiB
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class Flaky(http.server.BaseHTTPRequestHandler):
    """Serves PAYLOAD with Range support; the first `drops` responses stop after `cut` bytes."""

    drops = 0
    cut = 300_000
    ranges = True
    requests: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        cls = type(self)
        if self.path != "/file.tar":
            self.send_error(404)
            return
        cls.requests.append(self.headers.get("Range"))
        start = 0
        rng = self.headers.get("Range") if cls.ranges else None
        if rng:
            start = int(rng.split("=")[1].split("-")[0])
            if start >= len(PAYLOAD):
                self.send_response(416)
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
        else:
            self.send_response(200)
        body = PAYLOAD[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if cls.drops > 0:
            cls.drops -= 1
            self.wfile.write(body[: cls.cut])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Flaky.drops, Flaky.ranges, Flaky.requests = 0, True, []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/file.tar"
    finally:
        httpd.shutdown()


def test_drops_are_resumed_from_where_they_stopped(server: str, tmp_path: Path) -> None:
    Flaky.drops = 2
    dest = tmp_path / "file.tar"
    lines: list[str] = []
    download(server, dest, SHA, echo=lines.append, sleep=lambda s: None)
    assert dest.read_bytes() == PAYLOAD and not (tmp_path / "file.tar.part").exists()
    assert Flaky.requests == [None, "bytes=300000-", "bytes=600000-"]
    assert sum("retrying" in line for line in lines) == 2


def test_a_part_left_by_an_earlier_run_is_resumed(server: str, tmp_path: Path) -> None:
    (tmp_path / "file.tar.part").write_bytes(PAYLOAD[:1000])
    download(server, tmp_path / "file.tar", SHA, sleep=lambda s: None)
    assert Flaky.requests == ["bytes=1000-"]
    assert (tmp_path / "file.tar").read_bytes() == PAYLOAD


def test_a_server_without_ranges_starts_over(server: str, tmp_path: Path) -> None:
    Flaky.ranges = False
    (tmp_path / "file.tar.part").write_bytes(b"x" * 5000)  # would be wrong if appended to
    download(server, tmp_path / "file.tar", SHA, sleep=lambda s: None)
    assert (tmp_path / "file.tar").read_bytes() == PAYLOAD


def test_wrong_bytes_are_refused_and_nothing_is_kept(server: str, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="expected 0+"):
        download(server, tmp_path / "file.tar", "0" * 64, sleep=lambda s: None)
    assert list(tmp_path.iterdir()) == []


def test_gives_up_after_the_attempts_with_the_part_kept(server: str, tmp_path: Path) -> None:
    Flaky.drops = 10
    waits: list[float] = []
    with pytest.raises(DownloadError, match="after 3 attempt"):
        download(server, tmp_path / "file.tar", SHA, attempts=3, sleep=waits.append)
    assert waits == [1.0, 2.0]  # backoff doubles
    assert not (tmp_path / "file.tar").exists()
    assert (tmp_path / "file.tar.part").stat().st_size == 900_000  # the next run resumes


def test_not_found_is_not_retried(server: str, tmp_path: Path) -> None:
    waits: list[float] = []
    with pytest.raises(DownloadError, match="404"):
        download(server.replace("file.tar", "missing"), tmp_path / "x", SHA, sleep=waits.append)
    assert waits == []
