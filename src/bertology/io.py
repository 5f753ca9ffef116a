"""Atomic file output: write to a temporary file (or directory) beside the target, fsync, rename into place, fsync
the parent directory.

A writer killed half way leaves only hidden names beside the target:

* ``.<name>.<pid>-<host>.<random>.tmp``: the temporary file or directory of an unfinished write;
* ``.<name>.<pid>-<host>.old``: (``atomic_directory``) the previous directory, moved aside just before the new one is
  renamed into place (a directory cannot replace a non-empty one in a single rename).

``<pid>`` and ``<host>`` (a hash of the host name) identify the writer. The next atomic write of the same target
removes the leftovers whose writer is gone (its process no longer exists, or started after the leftover was last
changed: the PID was reused), and never those of a live writer, nor those written from another host (whose processes
it cannot see). If a writer was killed between moving the old directory aside and renaming the new one in, the
target is missing: ``recover`` (called by every atomic write, and to be called by readers) moves the old one back.

Files and directories get the permissions that ``open``/``mkdir`` would give under the current umask (0644 and 0755
with umask 022), every file inside an atomic directory included.

The phases of every write are fault points (``bertology.faults``), named after the target: ``write-created``,
``write-written``, ``write-renamed`` for ``atomic_write`` (target: the file name, or ``<directory>/<file>`` for a file
written inside an atomic directory) and ``dir-created``, ``dir-written``, ``dir-synced`` (one per file, target
``<directory>/<relative path>``), ``dir-before-rename``, ``dir-moved-aside`` (only when replacing), ``dir-renamed``,
``dir-done`` for ``atomic_directory`` (target: the directory name, e.g. ``step-0000004`` or ``model``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import socket
import stat
import tempfile
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from bertology import faults

_HOST = f"{zlib.crc32(socket.gethostname().encode('utf-8', 'replace')) & 0xFFFFFFFF:08x}"
_IMPORTED = time.time()
# A leftover is judged older than a process only with this margin: clocks and the boot time are read in whole
# seconds, and a leftover we are unsure about is kept.
_SLACK_S = 5.0
_RANDOM = r"[A-Za-z0-9_]+"  # what tempfile puts in names
_TMP_DIR_NAME = re.compile(rf"^\.(.+)\.\d+-[0-9a-f]{{8}}\.{_RANDOM}\.tmp$")


def _tag() -> str:
    """The writer's identity in temporary names (read at each write: a forked child has a PID of its own)."""
    return f"{os.getpid()}-{_HOST}"


def _umask() -> int:
    """The process umask, read without changing it where the platform allows (``os.umask`` is not thread safe)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename in ``directory`` durable, where directories can be opened and synced (not on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        try:
            os.fsync(fd)
        except OSError:  # some platforms sync only files open for writing
            os.close(fd)
            fd = os.open(path, os.O_RDWR)
            os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------- leftovers
@functools.lru_cache(maxsize=1)
def _boot_time() -> float | None:
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/stat", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("btime "):
                    return float(line.split()[1])
    return None


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), where /proc tells; None if unknown."""
    boot = _boot_time()
    if boot is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rpartition(")")[2].split()
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _writer_gone(pid: int, host: str, changed: float) -> bool:
    """Whether the writer of a leftover last changed at ``changed`` has certainly stopped."""
    if host != _HOST or os.name == "nt":  # another host's processes, or no safe liveness test (os.kill kills there)
        return False
    if pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            pass
        except OSError:
            return False
    started = _process_start(pid)  # alive: it is the writer unless it started after the leftover was changed
    return started is not None and changed < started - _SLACK_S


def _leftovers(path: Path) -> list[tuple[Path, bool, float]]:
    """Leftovers of killed writers of ``path`` as (path, is a moved-aside ``.old`` directory, ctime)."""
    name = re.escape(path.name)
    ours = re.compile(rf"^\.{name}\.(\d+)-([0-9a-f]{{8}})\.(?:{_RANDOM}\.tmp|old)$")
    legacy = re.compile(rf"^\.{name}\.(?:[A-Za-z0-9_]{{8}}\.tmp|old)$")  # names written before PIDs were in them
    prefix = f".{path.name}."
    found = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            # ctime, not mtime: a rename changes it, so a directory just moved aside counts as changed now.
            changed = entry.stat(follow_symlinks=False).st_ctime
        except OSError:
            continue
        match = ours.match(entry.name)
        if match:
            stale = _writer_gone(int(match.group(1)), match.group(2), changed)
        elif legacy.match(entry.name):
            started = _process_start(os.getpid()) or _IMPORTED
            stale = changed < started - _SLACK_S
        else:
            continue
        if stale:
            found.append((Path(entry.path), entry.name.endswith(".old"), changed))
    return found


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def recover(path: str | os.PathLike) -> bool:
    """If ``path`` is missing because its writer was killed after moving the previous directory aside, move that
    one back. Returns whether it did. Readers of atomically written directories call it before reading."""
    path = Path(path)
    if os.path.lexists(path):
        return False
    olds = [(changed, old) for old, is_old, changed in _leftovers(path) if is_old]
    if not olds:
        return False
    try:
        os.replace(max(olds)[1], path)
    except OSError:  # another reader recovered it first
        return False
    _fsync_dir(path.parent)
    return True


def clean_stale(path: str | os.PathLike) -> list[Path]:
    """Recover ``path`` (see ``recover``), then remove the leftovers of its killed writers; returns those removed."""
    path = Path(path)
    recover(path)
    removed = []
    for leftover, _, _ in _leftovers(path):
        _remove(leftover)
        removed.append(leftover)
    return removed


# ---------------------------------------------------------------------------------------------- writers
def _label(path: Path) -> str:
    """The fault-point target of a file: its name, or ``<directory>/<name>`` inside an atomic directory."""
    match = _TMP_DIR_NAME.match(path.parent.name)
    return f"{match.group(1)}/{path.name}" if match else path.name


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success it replaces ``path`` atomically, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    label = _label(path) if faults.ACTIVE else ""
    clean_stale(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_tag()}.", suffix=".tmp", dir=path.parent)
    try:
        try:  # mkstemp creates 0600; give the file the permissions open() would
            os.fchmod(fd, 0o666 & ~_umask())
        except AttributeError:  # pragma: no cover - no fchmod (Windows)
            os.chmod(tmp, 0o666 & ~_umask())
        faults.point("write-created", label)
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        faults.point("write-written", label)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    faults.point("write-renamed", label)
    _fsync_dir(path.parent)


def _finish_tree(root: Path, name: str) -> None:
    """Give every file and directory under ``root`` the umask's permissions and fsync them (files first)."""
    mask = _umask()
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for file in sorted(files):
            full = os.path.join(directory, file)
            mode = os.lstat(full).st_mode
            if not stat.S_ISREG(mode):
                continue
            executable = 0o111 if mode & 0o111 else 0
            os.chmod(full, (0o666 | executable) & ~mask)
            _fsync_file(full)
            if faults.ACTIVE:
                faults.point("dir-synced", f"{name}/{os.path.relpath(full, root).replace(os.sep, '/')}")
        for sub in dirs:
            full = os.path.join(directory, sub)
            if not os.path.islink(full):
                os.chmod(full, 0o777 & ~mask)
        _fsync_dir(directory)
    os.chmod(root, 0o777 & ~mask)  # mkdtemp creates 0700


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; on success it replaces ``path`` (an existing one is removed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.name
    clean_stale(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.{_tag()}.", suffix=".tmp", dir=path.parent))
    old = path.with_name(f".{name}.{_tag()}.old")
    replaced = moved = False
    try:
        faults.point("dir-created", name)
        yield tmp
        faults.point("dir-written", name)
        _finish_tree(tmp, name)
        faults.point("dir-before-rename", name)
        if os.path.lexists(path):
            replaced = True
            _remove(old)
            os.replace(path, old)
            moved = True
            faults.point("dir-moved-aside", name)
            os.replace(tmp, path)
            moved = False
        else:
            os.replace(tmp, path)
    except BaseException:
        if moved:  # put the previous directory back
            with contextlib.suppress(OSError):
                os.replace(old, path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    faults.point("dir-renamed", name)
    _fsync_dir(path.parent)
    if replaced:
        _remove(old)
    faults.point("dir-done", name)


def file_in_the_way(path: str | os.PathLike) -> Path | None:
    """The existing file that stops ``path``'s missing parent directories from being created (the nearest existing
    ancestor, when it is not a directory), else None. Checked before work whose output goes to ``path``."""
    parent = Path(path).parent
    while not parent.exists():
        parent = parent.parent
    return None if parent.is_dir() else parent


# ---------------------------------------------------------------------------------------------- outputs
def check_output_file(path: str | os.PathLike, flag: str = "--output") -> Path:
    """Where a command may write a file, checked before any work: not an existing directory, not below a file."""
    from bertology.errors import ConfigError

    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give a file name")
    blocker = file_in_the_way(path)
    if blocker is not None:
        raise ConfigError(f"{flag} {path}: cannot create it, {blocker} is a file, not a directory")
    return path


def check_output_directory(path: str | os.PathLike, own: str, what: str, overwrite: bool = False,
                           flag: str = "--out") -> Path:
    """Where a command may write a directory of outputs, checked before any work: a new or empty directory, one
    holding this command's own kind of output (its file `own` is there), or, with `overwrite`, any directory (the
    command then writes its files into it and keeps the others). Not a file, not below a file. Hidden entries
    (leftovers of killed atomic writes) do not count. Returns the path."""
    from bertology.errors import ConfigError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path}: is a file; the output is a directory")
    blocker = file_in_the_way(path / "x")
    if blocker is not None and blocker != path:
        raise ConfigError(f"{flag} {path}: cannot create it, {blocker} is a file, not a directory")
    if path.is_dir() and not overwrite and not (path / own).is_file():
        others = sorted(entry.name for entry in os.scandir(path) if not entry.name.startswith("."))
        if others:
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            raise ConfigError(f"{flag} {path}: holds other files ({shown}) and is not {what} (no {own}); choose a "
                              "new or empty directory, or pass --overwrite to write into it (its other files are "
                              "kept)")
    return path


def link_out_of(root: str | os.PathLike, path: str | os.PathLike) -> Path | None:
    """Where ``path`` (inside ``root``) really leads when a symbolic link on the way from ``root`` takes it out of
    ``root``; None when it stays inside (or has no link)."""
    root, path = Path(root), Path(path)
    base = root.resolve()
    at = root
    for part in path.relative_to(root).parts:
        at = at / part
        if at.is_symlink():
            target = at.resolve()
            if target != base and base not in target.parents:
                return target
    return None


def check_links(root: str | os.PathLike, names: Iterable[str], flag: str = "--out") -> None:
    """Refuse, before any work, an entry ``root/name`` that is a symbolic link leading out of ``root``: what
    bertology writes, replaces or deletes there must stay in the directory it was given (a ConfigError naming the
    link and its target). A link that stays inside is followed for reading and writing, never deleted through."""
    from bertology.errors import ConfigError

    root = Path(root)
    if not root.is_dir():
        return
    for name in names:
        target = link_out_of(root, root / name)
        if target is not None:
            raise ConfigError(f"{flag} {root}: {root / name} is a link to {target}, outside that directory; "
                              f"bertology writes {name} only inside it: remove the link or choose another "
                              "directory")


def remove_output(path: str | os.PathLike, ignore_errors: bool = False) -> None:
    """Delete an output bertology wrote (a file, or a directory tree; `ignore_errors` as shutil.rmtree's); a
    symbolic link is removed itself, never what it points to."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=ignore_errors)


@contextlib.contextmanager
def files_into(directory: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden temporary directory inside `directory` (created if missing); on success every file written
    there is renamed into `directory` (replacing a file of the same name, one rename per file), and nothing else
    in `directory` is touched; on error the temporary directory is removed. For outputs that must share a
    directory with files bertology did not write (`--overwrite` into a user's folder, `--out .`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".bertology.{_tag()}.", suffix=".tmp", dir=directory))
    try:
        yield tmp
        _finish_tree(tmp, directory.name)
        from bertology.errors import ConfigError

        for root, _, files in os.walk(tmp):  # every clash is found before the first file is moved
            for file in files:
                target = directory / Path(root).relative_to(tmp) / file
                if target.is_dir() and not target.is_symlink():
                    raise ConfigError(f"{target}: is a directory where a file is to be written")
                outside = link_out_of(directory, target.parent)
                if outside is not None:
                    raise ConfigError(f"{target}: a link on the way leads to {outside}, outside {directory}; "
                                      "bertology writes only inside the output directory")
        for root, dirs, files in os.walk(tmp):
            relative = Path(root).relative_to(tmp)
            for sub in dirs:
                (directory / relative / sub).mkdir(exist_ok=True)
            for file in files:
                os.replace(Path(root) / file, directory / relative / file)
        _fsync_dir(directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
