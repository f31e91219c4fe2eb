"""Atomic file replacement (readers see the old file or the new one, never half of either),
and where lock files go."""

from __future__ import annotations

import hashlib
import os
import re
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
