"""What a team may upload: only `NN_name/solution.py` files of the competition's katas, within caps.

An upload is a tar archive (optionally gzip-, bzip2- or xz-compressed) or multipart files named by their
path. A path that is absolute, climbs with `..`, or names a link or device refuses the whole upload (it
says which); any other path that is not `NN_name/solution.py` of a competition kata is ignored. The client
runs the same checks before it sends, the server again on what it receives.

An archive is unpacked as it streams, member by member, never whole: the moment its unpacked bytes pass
MAX_UNPACKED_BYTES (what the caps let a team store at most) or unpacking passes MAX_UNPACK_SECONDS, the
upload is refused (413), so a compression bomb costs a fraction of a second, not its expanded size.

May import: the standard library.
"""
from __future__ import annotations

import bz2
import io
import lzma
import re
import tarfile
import time
import zlib
from pathlib import Path, PurePosixPath

MAX_UPLOAD_BYTES = 512 * 1024   # the whole request body
MAX_FILE_BYTES = 256 * 1024     # one solution.py
MAX_FILES = 64                  # archive members or multipart parts
MAX_UNPACKED_BYTES = MAX_FILES * MAX_FILE_BYTES  # an archive's unpacked stream, tar headers included
MAX_UNPACK_SECONDS = 10.0       # wall-clock time to unpack one archive
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


class Unpacking:
    """The archive's bytes as they are decompressed, a bounded piece at a time (`read(n)`, what tarfile's
    stream mode asks for): UploadRefused the moment they pass `max_bytes` or unpacking `max_seconds`.
    Compressed streams written one after another (as pbzip2 and pigz write them) are read as one."""

    MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}

    def __init__(self, data: bytes, max_bytes: int, max_seconds: float):
        self.kind = next((kind for magic, kind in self.MAGIC.items() if data.startswith(magic)), None)
        self.max_bytes, self.max_seconds, self.total = max_bytes, max_seconds, 0
        self.deadline = time.monotonic() + max_seconds
        self.plain = memoryview(data) if self.kind is None else None
        self.pending, self.decompressor = (b"", None) if self.kind is None else (data, self.fresh())

    def fresh(self):
        if self.kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        return bz2.BZ2Decompressor() if self.kind == "bzip2" else lzma.LZMADecompressor()

    def check_clock(self) -> None:
        if time.monotonic() > self.deadline:
            raise UploadRefused(f"refused: unpacking the archive took over {self.max_seconds:g} s", 413)

    def read(self, size: int = -1) -> bytes:
        self.check_clock()
        # never more than one byte past the budget, so a bomb stops at the cap, not after
        size = min(size if size >= 0 else 1 << 16, self.max_bytes - self.total + 1)
        out = self.next_bytes(max(size, 1))
        self.total += len(out)
        if self.total > self.max_bytes:
            raise UploadRefused(f"refused: the archive unpacks to over {self.max_bytes} bytes", 413)
        return out

    def next_bytes(self, size: int) -> bytes:
        if self.plain is not None:
            out, self.plain = bytes(self.plain[:size]), self.plain[size:]
            return out
        while self.decompressor is not None:
            self.check_clock()
            d = self.decompressor
            if d.eof:  # the end of one stream: another may follow (zero bytes of padding do not count)
                rest = d.unused_data.lstrip(b"\0")  # (zlib may leave the same bytes in unconsumed_tail)
                self.decompressor, self.pending = (self.fresh(), rest) if rest else (None, b"")
                continue
            try:
                out = d.decompress(self.pending, size)
            except (zlib.error, OSError, EOFError, lzma.LZMAError) as exc:
                raise UploadRefused(f"refused: not a tar archive ({self.kind}: {exc})") from None
            # zlib hands back what it did not read yet; bz2 and lzma keep it inside
            self.pending = d.unconsumed_tail if self.kind == "gzip" else b""
            if out:
                return out
            if not d.eof and ((not self.pending) if self.kind == "gzip" else d.needs_input):
                raise UploadRefused(f"refused: not a tar archive (the {self.kind} stream is cut short)")
        return b""


def from_tar(data: bytes, katas: list[str], *, max_bytes: int = MAX_UNPACKED_BYTES,
             max_seconds: float = MAX_UNPACK_SECONDS) -> dict[str, bytes]:
    """The solution files of an archive, unpacked as it streams within `max_bytes` and `max_seconds`."""
    stream = Unpacking(data, max_bytes, max_seconds)
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|", bufsize=1 << 16) as archive:
            for n, member in enumerate(archive):
                if n >= MAX_FILES:
                    raise UploadRefused(f"refused: more than {MAX_FILES} archive members", 413)
                if member.issym() or member.islnk():
                    raise UploadRefused(f"refused: {member.name!r} is a link")
                if not (member.isfile() or member.isdir()):
                    raise UploadRefused(f"refused: {member.name!r} is not a regular file")
                path = check_path(member.name)
                if path is None or member.isdir():
                    continue  # skipped as the stream goes on, within the same budget
                if member.size > MAX_FILE_BYTES:
                    raise UploadRefused(f"refused: {path} is {member.size} bytes, over the {MAX_FILE_BYTES} allowed", 413)
                files[path] = archive.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
        raise UploadRefused(f"refused: not a tar archive ({exc})") from None
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
