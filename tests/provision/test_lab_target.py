"""The board lab's `Target` (scripts/lab/vm.target), against a real loopback sshd."""

from __future__ import annotations

import shutil

import pytest

from provision.target import TargetError
from scripts.lab import vm


def _lab_state(sshd, tmp_path, trust: bool = True) -> vm.LabInfo:
    """A lab state dir as `lab.up` leaves it: the client key and the pinned host key."""
    if sshd.user != "root":
        pytest.skip("the lab logs in as root; this sshd serves another user")
    state = tmp_path / "run"
    state.mkdir()
    shutil.copy(sshd.user_key, state / "id_ed25519")
    (state / "id_ed25519").chmod(0o600)
    key = " ".join(sshd.host_pub.split()[:2])
    (state / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {key}\n" if trust else "")
    return vm.LabInfo(pid=0, port=sshd.port, page_size="64k", state_dir=state)


def test_lab_target_runs_and_copies(sshd, tmp_path):
    info = _lab_state(sshd, tmp_path)
    assert vm._answers(info)
    board = vm.target(info)
    try:
        assert board.run("echo $((6 * 7)); echo err >&2; exit 3") == (3, "42\n", "err\n")
        local = tmp_path / "payload"
        local.write_bytes(b"\x00\x01lab")
        board.put(local, str(tmp_path / "remote" / "payload"))
        board.get(str(tmp_path / "remote" / "payload"), tmp_path / "back")
        assert (tmp_path / "back").read_bytes() == b"\x00\x01lab"
    finally:
        board.close()


def test_lab_target_refuses_an_unpinned_host_key(sshd, tmp_path):
    info = _lab_state(sshd, tmp_path, trust=False)
    with pytest.raises(TargetError, match="cannot connect"):
        vm.target(info)
    assert not vm._answers(info)
