"""What a team may upload: only `NN_name/solution.py` files of the competition's katas, within caps.

An upload is a tar archive (optionally gzip-compressed) or multipart files named by their path. A path
that is absolute, climbs with `..`, or names a link or device refuses the whole upload (it says which);
any other path that is not `NN_name/solution.py` of a competition kata is ignored. The client runs the
same checks before it sends, the server again on what it receives.

May import: the standard library.
"""
from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path, PurePosixPath

MAX_UPLOAD_BYTES = 512 * 1024   # the whole request body
MAX_FILE_BYTES = 256 * 1024     # one solution.py
MAX_FILES = 64                  # archive members or multipart parts
SOLUTION = re.compile(r"^\d\d_[a-z0-9_]+/solution\.py$")


class UploadRefused(ValueError):
    """The sentence says why; the service answers 400 (413 for a cap)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def check_path(name: str) -> str | None:
    """The normalised path when it is a solution file to keep; None to ignore it; UploadRefused if unsafe."""
    if name.startswith("/") or name.startswith("\\") or re.match(r"^[A-Za-z]:", name):
        raise UploadRefused(f"refused: {name!r} is an absolute path")
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if ".." in parts:
        raise UploadRefused(f"refused: {name!r} climbs out of the tree with '..'")
    clean = "/".join(p for p in parts if p not in (".", ""))
    return clean if SOLUTION.match(clean) else None


def keep(files: dict[str, bytes], katas: list[str]) -> dict[str, bytes]:
    """The solution files of the competition's katas, or UploadRefused when none is left."""
    kept = {path: content for path, content in files.items() if path.split("/")[0] in katas}
    for path, content in kept.items():
        if len(content) > MAX_FILE_BYTES:
            raise UploadRefused(f"refused: {path} is {len(content)} bytes, over the {MAX_FILE_BYTES} allowed", 413)
    if not kept:
        raise UploadRefused("refused: the upload holds no NN_name/solution.py of this competition's katas "
                            f"({', '.join(katas)})")
    return dict(sorted(kept.items()))


def from_tar(data: bytes, katas: list[str]) -> dict[str, bytes]:
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise UploadRefused(f"refused: not a tar archive ({exc})") from None
    files: dict[str, bytes] = {}
    with archive:
        for n, member in enumerate(archive):
            if n >= MAX_FILES:
                raise UploadRefused(f"refused: more than {MAX_FILES} archive members", 413)
            if member.issym() or member.islnk():
                raise UploadRefused(f"refused: {member.name!r} is a link")
            if not (member.isfile() or member.isdir()):
                raise UploadRefused(f"refused: {member.name!r} is not a regular file")
            path = check_path(member.name)
            if path is None or member.isdir():
                continue
            if member.size > MAX_FILE_BYTES:
                raise UploadRefused(f"refused: {path} is {member.size} bytes, over the {MAX_FILE_BYTES} allowed", 413)
            files[path] = archive.extractfile(member).read()
    return keep(files, katas)


def from_parts(parts: list[tuple[str, bytes]], katas: list[str]) -> dict[str, bytes]:
    """Multipart files: (path, content), the path from the part's field name or filename."""
    if len(parts) > MAX_FILES:
        raise UploadRefused(f"refused: more than {MAX_FILES} files", 413)
    files = {}
    for name, content in parts:
        path = check_path(name)
        if path is not None and content:
            files[path] = content
    return keep(files, katas)


def pack(tree: Path, katas: list[str]) -> tuple[bytes, list[str]]:
    """The client's side: a gzip'd tar of tree/NN_name/solution.py for `katas` (regular files only, never a
    link), and the paths it holds."""
    buffer, paths = io.BytesIO(), []
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for kata in katas:
            source = tree / kata / "solution.py"
            if source.is_file() and not source.is_symlink() and not (tree / kata).is_symlink():
                data = source.read_bytes()
                info = tarfile.TarInfo(f"{kata}/solution.py")
                info.size, info.mode = len(data), 0o644
                archive.addfile(info, io.BytesIO(data))
                paths.append(info.name)
    return buffer.getvalue(), paths
