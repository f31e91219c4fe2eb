"""Atomic file replacement (readers see the old file or the new one, never half of either),
where lock files go, and paths confined to the tree they lie in (Note [confined paths])."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import tempfile
import threading
from pathlib import Path

# Note [temp files]: the temp file of `replace_atomically` is `.<name>.<8 chars>.tmp` beside
# its target (tempfile's random part is 8 characters of [a-z0-9_]). A process killed between
# creating and renaming it leaves it behind; whoever writes that folder again can tell such a
# file from everything else by this name and remove it (see `stale_temp_files`).
_TEMP_NAME = re.compile(r"\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp")


def replace_atomically(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write ``data`` to a temp file beside ``path`` and rename it over ``path``.

    The file gets the mode of the file it replaces, or when there is none the mode a plain
    ``open`` would give it (0666 less the umask: 0644 under umask 0022), not the 0600 of a
    temp file. ``durable`` also flushes the data to disk before the rename (dataset records);
    generated code, which can always be generated again, skips that cost.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), _mode_for(path))
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write(target: Path, text: str) -> None:
    """Replace target's content atomically; readers see the old or the new file, never half."""
    replace_atomically(target, text.encode("utf-8"))


def _mode_for(path: Path) -> int:
    try:
        return os.stat(path).st_mode & 0o777  # never carry a setuid bit over to new content
    except OSError:
        return 0o666 & ~current_umask()


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where the system allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    # Elsewhere the only way is to set it and set it back (under a lock for our own threads).
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def temp_target(name: str) -> str | None:
    """The file a temp file of `replace_atomically` was for, from its name; None if not one."""
    match = _TEMP_NAME.fullmatch(name)
    return match["target"] if match else None


def stale_temp_files(folder: Path, targets: set[str]) -> list[Path]:
    """Temp files in ``folder`` left by an interrupted `replace_atomically` of ``targets``.

    Only files named as our temp files for one of the given file names (Note [temp files]):
    a file of the same pattern for another name may belong to someone else.
    """
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return sorted(
        Path(e.path)
        for e in entries
        if temp_target(e.name) in targets and e.is_file(follow_symlinks=False)
    )


# Note [lock files]
# Writers that read a file and replace it (appending traces, dropping a torn line) hold a
# lock file for it, so that two of them do not lose each other's lines. The lock file is not
# put beside the file: a dataset holds nothing but FlashInfer-Bench's files (and fibgen's
# sidecars), and a lock left there by a killed process would stay for good. It is kept
# under fibgen's cache, `$FIBGEN_CACHE_DIR/locks/` (default `~/.cache/fibgen/locks/`),
# named by the file's real path, so every process of the machine that writes the same file
# (through whatever link) takes the same lock, provided it uses the same cache.


def cache_dir() -> Path:
    """fibgen's cache folder: ``$FIBGEN_CACHE_DIR``, else ``~/.cache/fibgen``."""
    base = os.environ.get("FIBGEN_CACHE_DIR") or Path.home() / ".cache" / "fibgen"
    return Path(base)


def lock_path(path: Path) -> Path:
    """The lock file that guards ``path``, out of its folder (Note [lock files])."""
    real = os.path.realpath(path)
    key = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    folder = cache_dir() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{Path(real).name}.{key}.lock"


# Note [confined paths]
# A dataset, a solution folder or a folder of `.fidef` files is a tree that fibgen reads and
# writes by relative paths, and a symbolic link in it can send a read or a write elsewhere:
# the tracer appended tens of thousands of lines to a file outside its dataset through a
# linked `workloads/<op>/<def>.jsonl` and wrote blobs through a linked `blob/`; bench copied
# an outside file into `traces/` through a linked trace file; `pack` copied a linked private
# key into the Solution JSON one submits. So every path under such a root goes through
# `confined` before it is read or written: links are followed where they stay inside the
# root (the shipped solution folders link to `solutions/src/`), and a path that a link leads
# out of, or through a loop of links, is refused with the link named. `regular_file` refuses
# what is not a file (a FIFO named `x.fidef` would block its reader forever). A check and the
# use it guards are two system calls apart: this protects against the links a tree holds,
# not against a process that swaps them in between.


class PathRefused(ValueError):
    """A path under a root that leads out of it, loops, or is not a regular file."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _it(link: Path, path: Path) -> str:
    # Messages start with the path refused: the link is "it" when it is that path.
    return "it" if link == path else str(link)


def confined(root: str | os.PathLike[str], path: str | os.PathLike[str], what: str) -> Path:
    """``path``, which lies under ``root``, checked to stay inside it (Note [confined paths]).

    ``what`` names the root in messages ("the dataset"). Raises PathRefused naming the
    symbolic link that leads out of ``root``, or the loop; returns ``path`` unchanged.
    """
    root, path = Path(root), Path(path)
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise PathRefused(path, f"not inside {what} {root}") from None
    if ".." in rel.parts:
        raise PathRefused(path, f"leads out of {what} {root} through '..'")
    real_root = os.path.realpath(root)
    current = root
    for part in rel.parts:
        current = current / part
        if not os.path.islink(current):
            continue
        target = os.readlink(current)
        try:
            os.stat(current)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PathRefused(
                    path,
                    f"{_it(current, path)} is a symbolic link in a loop of links (-> {target})",
                ) from None
            # A link to nothing yet: where it points is checked below all the same.
        if not _within(os.path.realpath(current), real_root):
            link = f"{_it(current, path)} is a symbolic link"
            raise PathRefused(
                path,
                f"{link} to {target}, outside {what} {root}; fibgen reads and writes only "
                f"inside {what}",
            )
    return path


def regular_file(path: str | os.PathLike[str]) -> Path:
    """``path`` checked to be a regular file when it exists (Note [confined paths])."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused(path, "a symbolic link in a loop of links") from None
        if exc.errno == errno.ENOTDIR:
            parents = reversed(path.parents)
            blocking = next((p for p in parents if p.exists() and not p.is_dir()), path.parent)
            raise PathRefused(path, f"{blocking} is a file, not a folder") from None
        raise
    if not stat.S_ISREG(mode):
        if stat.S_ISFIFO(mode):
            kind = "a FIFO"
        elif stat.S_ISDIR(mode):
            kind = "a folder"
        else:
            kind = "a socket or device"
        raise PathRefused(path, f"{kind}, not a regular file")
    return path
