"""A hung board is power-cycled through its place's power resource, then provisioned.

The "power switch" is a small HTTP relay (labgrid's `simplerest` power model talks to it): off
stops the board's sshd, on starts it again on the same port.
"""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import farm_yaml

from tests.support.sshd import SSHD


class Relay:
    """Relay 0 powers one sshd "board"; every switch is recorded."""

    def __init__(self, server) -> None:
        self.server = server
        self.switches: list[str] = []
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                parts = self.path.strip("/").split("/")
                if len(parts) == 3 and parts[:2] == ["relay", "0"] and parts[2] in ("0", "1"):
                    relay.switch(parts[2] == "1")
                    body = parts[2]
                else:
                    body = "1" if relay.on else "0"
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/relay/{{index}}/{{value}}"

    @property
    def on(self) -> bool:
        return self.server.proc.poll() is None

    def switch(self, on: bool) -> None:
        self.switches.append("on" if on else "off")
        if on and not self.on:
            self.server.log = open(self.server.root / "sshd.log", "a")
            self.server.proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.server.root / "sshd_config")],
                stdout=self.server.log, stderr=self.server.log,
            )  # fmt: skip
        elif not on and self.on:
            self.server.stop()

    def close(self) -> None:
        self.http.shutdown()


def test_hung_board_is_power_cycled_then_provisioned(ssh_boards, farm_factory, farm_cli, tmp_path):
    server = ssh_boards.add("s0")
    relay = Relay(server)
    try:
        board = ssh_boards.board(server, "b0")
        board.extra = {"NetworkPowerPort": {"model": "simplerest", "host": relay.url, "index": 0}}
        farm = farm_factory([board])
        cfg = farm_yaml(
            tmp_path / "farm.yaml", farm, {"b0": {"identity": str(server.user_key)}},
            ssh_boards.known_hosts(),
        )  # fmt: skip
        server.stop()  # the board hangs: nothing answers on its SSH port
        out = tmp_path / "out"
        res = farm_cli("provision", "--farm-config", str(cfg), "--place", "b0",
                       "--boot-timeout", "60", "--out", str(out))  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        (place,) = json.loads((out / "farm.json").read_text())["places"]
        assert place["power"] and place["power_cycled"], place
        assert relay.switches[-2:] == ["off", "on"], relay.switches
        assert place["provision"]["status"] == "ok"
        assert (server.remote / "config" / "torch-fl" / "env").is_file()
        assert farm.client.reservations() == []
    finally:
        relay.close()
        if relay.on:
            server.stop()


def test_board_that_stays_dead_after_a_power_cycle_fails(ssh_boards, farm_factory, farm_cli,
                                                         tmp_path):  # fmt: skip
    server = ssh_boards.add("s0")
    relay = Relay(server)
    relay.switch = lambda on: relay.switches.append("on" if on else "off")  # a dead board
    try:
        board = ssh_boards.board(server, "b0")
        board.extra = {"NetworkPowerPort": {"model": "simplerest", "host": relay.url, "index": 0}}
        farm = farm_factory([board])
        cfg = farm_yaml(
            tmp_path / "farm.yaml", farm, {"b0": {"identity": str(server.user_key)}},
            ssh_boards.known_hosts(),
        )  # fmt: skip
        server.stop()
        out = tmp_path / "out"
        res = farm_cli("provision", "--farm-config", str(cfg), "--place", "b0",
                       "--boot-timeout", "3", "--out", str(out))  # fmt: skip
        assert res.returncode == 1, res.stdout + res.stderr
        (row,) = json.loads((out / "farm.json").read_text())["rows"]
        assert row["verdict"] == "infra-error" and "after a power cycle" in row["why"]
        assert "off" in relay.switches and "on" in relay.switches
        assert farm.client.reservations() == []
    finally:
        relay.close()
