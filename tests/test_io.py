"""Atomic writes: all or nothing, with ordinary permissions."""

from __future__ import annotations

import os
import stat

import pytest
from pathlib import Path

from bertology.io import atomic_directory, atomic_write


def test_atomic_write_replaces_or_keeps(tmp_path):
    path = tmp_path / "out.txt"
    with atomic_write(path, "w", encoding="utf-8") as handle:
        handle.write("first")
    with pytest.raises(RuntimeError):
        with atomic_write(path, "w", encoding="utf-8") as handle:
            handle.write("second, half written")
            raise RuntimeError("killed")
    assert path.read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_permissions_follow_the_umask(tmp_path):
    mask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "f", "w") as handle:
            handle.write("x")
        with atomic_directory(tmp_path / "d") as directory:
            (directory / "a").write_text("x")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755


def test_atomic_directory_replaces_whole(tmp_path):
    with atomic_directory(tmp_path / "d") as directory:
        (directory / "old").write_text("1")
    with atomic_directory(tmp_path / "d") as directory:
        (directory / "new").write_text("2")
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


# ------------------------------------------------------------------------------------------ killed writers
import subprocess  # noqa: E402
import sys  # noqa: E402

from bertology import io  # noqa: E402
from bertology.io import clean_stale, recover  # noqa: E402


def dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def leftover(directory, target, pid, kind="file", host=None, suffix="x1y2z3ab.tmp"):
    """What a writer of ``target`` with ``pid`` leaves when killed: a temporary file/dir or a moved-aside .old."""
    host = host or io._HOST
    path = directory / (f".{target}.{pid}-{host}.old" if kind == "old" else f".{target}.{pid}-{host}.{suffix}")
    if kind == "file":
        path.write_text("half written")
    else:
        path.mkdir()
        (path / "inside").write_text("x")
    return path


def names(directory):
    return sorted(p.name for p in directory.iterdir())


def test_next_write_removes_temporaries_of_dead_writers(tmp_path):
    pid = dead_pid()
    leftover(tmp_path, "out.txt", pid)
    leftover(tmp_path, "out.txt", pid, suffix="other123.tmp")
    leftover(tmp_path, "other.txt", pid)  # another target's: not this write's business
    with atomic_write(tmp_path / "out.txt", "w") as handle:
        handle.write("new")
    assert names(tmp_path) == [f".other.txt.{pid}-{io._HOST}.x1y2z3ab.tmp", "out.txt"]
    assert (tmp_path / "out.txt").read_text() == "new"


def test_temporaries_of_live_writers_are_kept(tmp_path):
    live = [
        leftover(tmp_path, "out.txt", os.getppid()),  # another live process (a concurrent writer)
        leftover(tmp_path, "out.txt", os.getpid(), suffix="samepid1.tmp"),  # this process, another thread
        leftover(tmp_path, "out.txt", dead_pid(), host="0badc0de"),  # another host: its PIDs mean nothing here
    ]
    with atomic_write(tmp_path / "out.txt", "w") as handle:
        handle.write("new")
    assert names(tmp_path) == sorted([p.name for p in live] + ["out.txt"])


def test_reused_pid_does_not_protect_a_leftover(tmp_path, monkeypatch):
    # The killed writer had the PID this process has now (common in containers): the leftover predates us.
    stale = leftover(tmp_path, "out.txt", os.getpid())
    monkeypatch.setattr(io, "_process_start", lambda pid: stale.stat().st_ctime + 60)
    with atomic_write(tmp_path / "out.txt", "w") as handle:
        handle.write("new")
    assert names(tmp_path) == ["out.txt"]


def test_leftovers_of_earlier_versions_are_removed_if_older_than_this_process(tmp_path, monkeypatch):
    (tmp_path / ".d.abcd_123.tmp").mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / ".d.old").mkdir()
    monkeypatch.setattr(io, "_process_start", lambda pid: (tmp_path / ".d.old").stat().st_ctime + 60)
    assert sorted(p.name for p in clean_stale(tmp_path / "d")) == [".d.abcd_123.tmp", ".d.old"]
    assert names(tmp_path) == ["d"]


def test_atomic_directory_cleans_its_dead_temporaries_and_old(tmp_path):
    pid = dead_pid()
    with atomic_directory(tmp_path / "d") as directory:
        (directory / "v1").write_text("1")
    leftover(tmp_path, "d", pid, kind="dir")
    leftover(tmp_path, "d", pid, kind="old")  # killed after the new one was renamed in, before removing the old
    with atomic_directory(tmp_path / "d") as directory:
        (directory / "v2").write_text("2")
    assert names(tmp_path) == ["d"] and names(tmp_path / "d") == ["v2"]


def killed_between_renames(tmp_path, pid):
    """The state a writer of ``d`` leaves when killed after moving ``d`` aside, before renaming the new one in."""
    old = tmp_path / f".d.{pid}-{io._HOST}.old"
    old.mkdir()
    (old / "v1").write_text("1")
    new = leftover(tmp_path, "d", pid, kind="dir")
    return old, new


def test_recover_moves_the_old_directory_back(tmp_path):
    pid = dead_pid()
    killed_between_renames(tmp_path, pid)
    assert recover(tmp_path / "d")
    assert names(tmp_path / "d") == ["v1"]
    assert not recover(tmp_path / "d")  # nothing (more) to do
    # The next write removes the dead writer's temporary directory and replaces the recovered one.
    with atomic_directory(tmp_path / "d") as directory:
        (directory / "v2").write_text("2")
    assert names(tmp_path) == ["d"] and names(tmp_path / "d") == ["v2"]


def test_failed_write_after_a_kill_between_renames_keeps_the_old_directory(tmp_path):
    killed_between_renames(tmp_path, dead_pid())
    with pytest.raises(RuntimeError):
        with atomic_directory(tmp_path / "d") as directory:
            (directory / "v2").write_text("2")
            raise RuntimeError("failed")
    assert names(tmp_path) == ["d"] and names(tmp_path / "d") == ["v1"]


def test_recover_leaves_a_live_writers_old_directory(tmp_path):
    old = tmp_path / f".d.{os.getppid()}-{io._HOST}.old"  # a live writer between its two renames
    old.mkdir()
    assert not recover(tmp_path / "d")
    assert old.is_dir() and not (tmp_path / "d").exists()


def test_failed_rename_in_puts_the_old_directory_back(tmp_path, monkeypatch):
    with atomic_directory(tmp_path / "d") as directory:
        (directory / "v1").write_text("1")
    real = os.replace

    def replace(src, dst):
        if Path(src).name.endswith(".tmp") and Path(dst).name == "d":
            raise OSError("rename failed (simulated)")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="simulated"):
        with atomic_directory(tmp_path / "d") as directory:
            (directory / "v2").write_text("2")
    monkeypatch.setattr(os, "replace", real)
    assert names(tmp_path) == ["d"] and names(tmp_path / "d") == ["v1"]


def test_every_file_in_an_atomic_directory_follows_the_umask(tmp_path):
    import tempfile

    mask = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "d") as directory:
            fd, _ = tempfile.mkstemp(dir=directory)  # libraries writing this way create 0600 files
            os.close(fd)
            (directory / "sub").mkdir(mode=0o700)
            (directory / "sub" / "deep").write_text("x")
            os.chmod(directory / "sub" / "deep", 0o600)
            (directory / "tool").write_text("#!/bin/sh\n")
            os.chmod(directory / "tool", 0o700)
    finally:
        os.umask(mask)
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "d").rglob("*")}
    assert modes.pop("d/sub") == 0o755 and modes.pop("d/tool") == 0o755
    assert modes and set(modes.values()) == {0o644}, modes


def test_stricter_umask_is_honoured(tmp_path):
    mask = os.umask(0o077)
    try:
        with atomic_write(tmp_path / "f", "w") as handle:
            handle.write("x")
        with atomic_directory(tmp_path / "d") as directory:
            (directory / "a").write_text("x")
    finally:
        os.umask(mask)
    for path, mode in (("f", 0o600), ("d", 0o700), ("d/a", 0o600)):
        assert stat.S_IMODE((tmp_path / path).stat().st_mode) == mode, path


def test_parent_directory_is_synced_after_the_rename(tmp_path, monkeypatch):
    events = []
    real_replace, real_sync = os.replace, io._fsync_dir
    monkeypatch.setattr(os, "replace", lambda src, dst: (events.append(("rename", Path(dst))),
                                                          real_replace(src, dst)))
    monkeypatch.setattr(io, "_fsync_dir", lambda d: (events.append(("sync", Path(d))), real_sync(d)))
    with atomic_write(tmp_path / "f", "w") as handle:
        handle.write("x")
    assert events[-2:] == [("rename", tmp_path / "f"), ("sync", tmp_path)]
    events.clear()
    with atomic_directory(tmp_path / "d") as directory:
        (directory / "a").write_text("x")
    assert events[-2:] == [("rename", tmp_path / "d"), ("sync", tmp_path)]
    assert ("sync", directory) in events  # the new directory's entries are synced before it is renamed in


# ------------------------------------------------------------------------------------------ fault points
WRITER = """
from bertology.io import atomic_directory, atomic_write
with atomic_write({file!r}, "w") as handle:
    handle.write("1")
for text in ("a", "b"):
    with atomic_directory({directory!r}) as tmp:
        with atomic_write(tmp / "inner.txt", "w") as handle:
            handle.write(text)
"""


def run_writer(tmp_path, fault=None, log=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTOLOGY_FAULT")}
    if fault:
        env["BERTOLOGY_FAULT"] = fault
    if log:
        env["BERTOLOGY_FAULT_LOG"] = str(log)
    script = WRITER.format(file=str(tmp_path / "f.txt"), directory=str(tmp_path / "d"))
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)


def test_fault_log_names_every_phase(tmp_path):
    log = tmp_path.parent / f"{tmp_path.name}.log"
    assert run_writer(tmp_path, log=log).returncode == 0
    points = log.read_text().split()
    assert points[:3] == ["write-created:f.txt", "write-written:f.txt", "write-renamed:f.txt"]
    second = points[3 + len(points[3:]) // 2:]
    assert second == ["dir-created:d", "write-created:d/inner.txt", "write-written:d/inner.txt",
                      "write-renamed:d/inner.txt", "dir-written:d", "dir-synced:d/inner.txt", "dir-before-rename:d",
                      "dir-moved-aside:d", "dir-renamed:d", "dir-done:d"]


@pytest.mark.parametrize("fault,expected", [
    ("write-written:f.txt", None),  # killed before the first file exists
    ("dir-synced:d/inner.txt", None),  # the first directory write killed: no directory yet
    ("dir-moved-aside:d", "a"),  # the second write (the first replaced nothing): old aside, new not in
    ("dir-renamed:d@2", "b"),
])
def test_killed_writer_leaves_state_the_next_write_recovers(tmp_path, fault, expected):
    proc = run_writer(tmp_path, fault)
    assert proc.returncode == -9, proc.stderr
    assert any(p.name.startswith(".") for p in tmp_path.iterdir())  # the killed writer's leftovers
    if expected is not None:
        recover(tmp_path / "d")
        assert (tmp_path / "d" / "inner.txt").read_text() == expected
    # A new writer (this process) cleans up after the dead one and writes.
    with atomic_directory(tmp_path / "d") as directory:
        (directory / "inner.txt").write_text("c")
    with atomic_write(tmp_path / "f.txt", "w") as handle:
        handle.write("2")
    assert names(tmp_path) == ["d", "f.txt"] and names(tmp_path / "d") == ["inner.txt"]
