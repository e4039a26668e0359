"""Empty a directory whatever the program left in it: iteratively, through descriptors.

A slot's private ``/tmp`` and ``/dev/shm`` (or, without the mount layer, its run directory)
are emptied after every execution, and what they hold was made by the program. So the
removal must not depend on the tree's shape: ``shutil.rmtree`` recurses once per level
(``RecursionError`` at ~1,000) and works on paths (``ENAMETOOLONG`` past 4 KiB of them).

The method: every directory found is first moved up to the top level under a fresh name
(``renameat2`` with ``RENAME_NOREPLACE``), so the tree is flattened one level per directory
emptied and no more than two descriptors are open at any time; names are handled as the
kernel gives them (bytes), so names that are not UTF-8 are removed like any other; a mode the
program set (``chmod 000``) is undone before the directory is entered, since without root the
zygote obeys modes too. Removing never needs a free block or inode, so a full tmpfs is
emptied like any other. Symbolic links are removed, never followed.

It runs only when every process of the execution is dead (nothing else changes the tree
meanwhile); whatever it cannot remove is reported, and the caller recycles the zygote.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import stat

_libc = ctypes.CDLL(None, use_errno=True)
RENAME_NOREPLACE = 1
OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
OWNER_ALL = 0o700


class WipeIncomplete(Exception):
    """Something inside the directory could not be removed."""


def _rename_noreplace(src_dir: int, src: bytes, dst_dir: int, dst: bytes) -> None:
    if _libc.renameat2(src_dir, src, dst_dir, dst, RENAME_NOREPLACE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), src)


def _open_mode(parent: int, name: bytes) -> None:
    """Give the owner every right on directory ``parent/name`` again (a mode the program set):
    only needed, and only possible, when the zygote is not root. Through an ``O_PATH``
    descriptor, so it is the directory itself that changes, never what a link points to."""
    path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        if not stat.S_ISDIR(os.fstat(path_fd).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", name)
        os.chmod(f"/proc/self/fd/{path_fd}", OWNER_ALL)
    finally:
        os.close(path_fd)


def _open_dir(parent: int, name: bytes) -> int:
    """Open directory ``name`` (not a link) for listing and removing what it holds."""
    try:
        fd = os.open(name, OPEN_DIR, dir_fd=parent)
    except PermissionError:
        _open_mode(parent, name)
        return os.open(name, OPEN_DIR, dir_fd=parent)
    if os.geteuid() != 0 and os.fstat(fd).st_mode & OWNER_ALL != OWNER_ALL:
        os.fchmod(fd, OWNER_ALL)
    return fd


class _Flattener:
    """The state of one wipe: the top directory, and the directories moved up to it."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.pending: list[bytes] = []
        self.counter = itertools.count()

    def lift(self, parent: int, name: bytes) -> None:
        """Move directory ``parent/name`` up to the top level, to be emptied later."""
        if parent != self.top:
            if os.geteuid() != 0:  # moving a directory rewrites its '..': it must be writable
                _open_mode(parent, name)
            while True:
                new = f".wipe-{next(self.counter)}".encode()
                try:
                    _rename_noreplace(parent, name, self.top, new)
                    break
                except FileExistsError:
                    continue  # a name the program chose: take the next one
            name = new
        self.pending.append(name)

    def empty_one(self, name: bytes) -> None:
        """Remove the files of top-level directory ``name``, lift its subdirectories, and
        remove it."""
        fd = _open_dir(self.top, name)
        try:
            for entry in os.scandir(fd):
                child = os.fsencode(entry.name)
                if entry.is_dir(follow_symlinks=False):
                    self.lift(fd, child)
                else:
                    os.unlink(child, dir_fd=fd)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=self.top)


def empty_directory(path: str, keep: frozenset[str] = frozenset()) -> None:
    """Remove everything inside ``path`` but the top-level entries named in ``keep`` (those
    holding the interpreter's files); ``WipeIncomplete`` (with the first error) if anything
    else is left."""
    keep_b = {os.fsencode(k) for k in keep}
    errors: list[str] = []
    parent = os.open(os.path.dirname(path) or "/", os.O_PATH | os.O_CLOEXEC)
    try:
        top = _open_dir(parent, os.fsencode(os.path.basename(path)))
    finally:
        os.close(parent)
    try:
        flat = _Flattener(top)
        touched = False  # nothing to remove: nothing can have come back (no process is left)
        for entry in os.scandir(top):
            name = os.fsencode(entry.name)
            if name in keep_b:
                continue
            touched = True
            try:
                if entry.is_dir(follow_symlinks=False):
                    flat.lift(top, name)
                else:
                    os.unlink(name, dir_fd=top)
            except OSError as exc:
                errors.append(f"{name!r}: {exc}")
        while flat.pending:
            name = flat.pending.pop()
            try:
                flat.empty_one(name)
            except OSError as exc:
                errors.append(f"{name!r}: {exc}")
        left = [n for n in os.listdir(top) if os.fsencode(n) not in keep_b] if touched else []
    finally:
        os.close(top)
    if left:
        why = errors[0] if errors else "entries reappeared"
        raise WipeIncomplete(f"{path}: {len(left)} entries left ({why})")


def remove_tree(path: str) -> None:
    """Remove directory ``path`` and everything in it; nothing if it does not exist."""
    try:
        empty_directory(path)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        os.unlink(path)
        return
    try:
        os.rmdir(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
