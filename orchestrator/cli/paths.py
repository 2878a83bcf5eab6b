"""argparse types for every flag that takes a path (`type=input_file`, ...).

argparse calls them while it parses the flags, so a missing file, a directory where a
file belongs, an unreadable or malformed file, or an output in a folder that does not
exist is refused before any profiling, planning or Ray, as one line that names the flag
(`argument --out: ...`) with exit status 2 (`orchestrator.cli._Parser`).
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from placement.errors import UserError

T = TypeVar("T")


def _refuse(text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(text)


def _check_writable(folder: Path, path: str) -> None:
    # A probe file, not os.access: root passes os.access everywhere, yet /proc or a
    # read-only mount still refuses the write that would come after the whole run.
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise _refuse(f"{path}: cannot write in {folder} ({err.strerror}): choose a folder "
                      "you can write to") from None


def input_file(path: str) -> str:
    """A file that exists and can be read."""
    p = Path(path)
    if p.is_dir():
        raise _refuse(f"{path} is a directory: give a file")
    if not p.exists():
        raise _refuse(f"{path}: no such file: check the path")
    try:
        p.open("rb").close()
    except OSError as err:
        raise _refuse(f"{path}: cannot read it ({err.strerror}): check its permissions") from None
    return path


def input_dir(path: str) -> str:
    """A folder that exists and can be listed."""
    p = Path(path)
    if not p.exists():
        raise _refuse(f"{path}: no such directory: check the path")
    if not p.is_dir():
        raise _refuse(f"{path} is a file, not a directory: give the folder")
    try:
        next(p.iterdir(), None)
    except OSError as err:
        raise _refuse(f"{path}: cannot list it ({err.strerror}): check its permissions") from None
    return path


def output_file(path: str) -> str:
    """A file to write, in a folder that exists and can be written to."""
    p = Path(path)
    if p.is_dir():
        raise _refuse(f"{path} is a directory: give the path of a file (in it or elsewhere)")
    folder = p.parent
    if not folder.is_dir():
        raise _refuse(f"{path}: the folder {folder} does not exist: create it "
                      f"(mkdir -p {folder}) or choose another path")
    _check_writable(folder, path)
    return path


def output_dir(path: str) -> str:
    """A folder to write in; it and its missing parents are created by the command."""
    p = Path(path).absolute()
    if p.exists() and not p.is_dir():
        raise _refuse(f"{path} is a file: give a folder (it is created if missing)")
    existing = next(a for a in (p, *p.parents) if a.exists())
    if not existing.is_dir():
        raise _refuse(f"{path}: {existing} is a file, so the folder cannot be created: "
                      "choose another path")
    _check_writable(existing, path)
    return path


def loaded_by(load: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type for a file that `load` reads: the file is checked and read while
    the flags are parsed, and a malformed one is refused naming its flag."""

    def read(path: str) -> T:
        try:
            return load(input_file(path))
        except UserError as err:
            raise _refuse(str(err)) from None

    read.__name__ = load.__name__
    return read
