"""``refimpl.files``: ``read_npz`` refuses forged archives and bombs before allocating,
``remove_stale_temporaries`` removes exactly what a killed ``atomic_write`` leaves, and
``check_output_file`` refuses a path ``atomic_write`` could not write."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from refimpl.files import (
    atomic_write,
    check_output_file,
    npz_limit,
    printable,
    read_npz,
    remove_stale_temporaries,
)


def forge_header(path: Path, member: str, shape: tuple[int, ...]) -> None:
    """Rewrite the ``.npz`` at ``path`` with ``member``'s ``.npy`` header claiming ``shape``;
    its data bytes stay as they were (what a hand-edited or hostile file looks like)."""
    with zipfile.ZipFile(path) as archive:
        contents = {name: archive.read(name) for name in archive.namelist()}
    stream = io.BytesIO(contents[member])
    assert np.lib.format.read_magic(stream) == (1, 0)
    _, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    header = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(dtype)
    fields = {"descr": descr, "fortran_order": fortran_order, "shape": shape}
    np.lib.format.write_array_header_1_0(header, fields)
    contents[member] = header.getvalue() + contents[member][stream.tell() :]
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in contents.items():
            archive.writestr(name, content)


def refused(path: Path, message: str) -> str:
    with pytest.raises(ValueError, match=message) as info:
        read_npz(path, fix_hint="re-save it")
    text = str(info.value)
    assert text.startswith(f"{path} is not a readable .npz") and text.endswith("; re-save it")
    assert "\n" not in text
    return text


def test_npz_header_claiming_petabytes_is_refused_before_allocating(tmp_path: Path) -> None:
    # np.load allocated what a member's .npy header claimed: a 1 KB file claiming 7 PiB raised
    # MemoryError with NumPy's traceback (or, for claims that fit in overcommitted memory,
    # took the machine's RAM). Earlier tests only fed honest archives and wrong file kinds.
    path = tmp_path / "forged.npz"
    np.savez(path, a=np.zeros(100))
    forge_header(path, "a.npy", (7 * 2**47,))  # 7 PiB of float64
    assert path.stat().st_size < 2048
    refused(path, r"member a\.npy claims shape \(985162418487296,\) of float64 .* but holds 800")


def test_npz_header_with_a_negative_extent_is_refused(tmp_path: Path) -> None:
    # NumPy's header parser accepts negative extents; ndarray() then failed with its own
    # message, naming no file.
    path = tmp_path / "negative.npz"
    np.savez(path, a=np.zeros((4, 3)))
    forge_header(path, "a.npy", (-4, 3))
    refused(path, r"member a\.npy has a negative extent in its shape \(-4, 3\)")


def test_npz_directory_claiming_more_than_deflate_makes_is_refused(tmp_path: Path) -> None:
    # A zip directory may claim any uncompressed size; deflate makes at most ~1032 bytes of a
    # compressed byte, so a larger claim is a forged (or bombed) archive.
    path = tmp_path / "bomb.npz"
    np.savez(path, a=np.zeros(100))
    content = bytearray(path.read_bytes())
    central = content.rindex(b"PK\x01\x02")  # the member's central directory entry
    content[central + 24 : central + 28] = (10**9).to_bytes(4, "little")  # uncompressed size
    path.write_bytes(bytes(content))
    refused(path, r"member a\.npy claims 1000000000 bytes from 928 compressed")


def test_npz_with_other_compression_or_non_npy_members_is_refused(tmp_path: Path) -> None:
    # NpzFile returned a non-.npy member as raw bytes (a dict "of arrays" holding bytes) and
    # decompressed bzip2/lzma members of any ratio.
    path = tmp_path / "bzip2.npz"
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.zeros(3))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_BZIP2) as archive:
        archive.writestr("a.npy", buffer.getvalue())
    refused(path, r"member a\.npy uses zip compression method 12, not deflate")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", b"hello")
    refused(path, r"member notes\.txt is not a \.npy array")


def test_npz_truncated_member_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "short.npz"
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.arange(10.0))
    with zipfile.ZipFile(path, "w") as archive:  # the header is honest, the data cut short
        archive.writestr("a.npy", buffer.getvalue()[:-8])
    refused(path, r"claims shape \(10,\) of float64 \(80 bytes\) but holds 72 bytes")


def test_npz_files_numpy_writes_still_read(tmp_path: Path) -> None:
    # The guards must not refuse real archives: all-zero arrays compress at ~1028:1 (close to
    # deflate's limit), 0-d strings, empty and Fortran-order arrays, an archive of nothing.
    arrays = {
        "zeros": np.zeros(10**6),
        "text": np.array('{"a": 1}'),
        "empty": np.zeros((0, 5), np.int32),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    }
    np.savez_compressed(tmp_path / "c.npz", **arrays)
    np.savez(tmp_path / "s.npz", **arrays)
    np.savez(tmp_path / "none.npz")
    for name in ("c.npz", "s.npz"):
        read = read_npz(tmp_path / name)
        assert list(read) == list(arrays)
        for key, value in arrays.items():
            assert read[key].dtype == value.dtype
            np.testing.assert_array_equal(read[key], value)
    assert read_npz(tmp_path / "none.npz") == {}


# -- stale temporaries ------------------------------------------------------------------------
def test_stale_temporaries_of_a_killed_write_are_removed_and_nothing_else(tmp_path: Path) -> None:
    # A process killed inside atomic_write left `.{name}.XXXXXXXX.tmp` beside the target for
    # ever: nothing removed them (atomic_write cleans up only errors it sees).
    killed = (
        "import os, sys; from refimpl.files import atomic_write; "
        "atomic_write(sys.argv[1], lambda stream: (stream.write(b'half'), os._exit(9)))"
    )
    target = tmp_path / "ckpt.npz"
    done = subprocess.run([sys.executable, "-c", killed, str(target)], check=False)
    assert done.returncode == 9
    (left,) = tmp_path.iterdir()  # what the kill left: the only file, matched by the pattern
    assert left.name.startswith(".ckpt.npz.") and left.name.endswith(".tmp")

    atomic_write(target, lambda stream: stream.write(b"whole"))  # a finished write
    kept = [
        ".ckpt.npz.ABCD1234.tmp",  # upper case: not mkstemp's alphabet
        ".ckpt.npz.abc123.tmp",  # 6 characters, not 8
        "ckpt.npz.abcd1234.tmp",  # no leading dot
        ".ckpt.npz.abcd1234.tmp.bak",
        "notes.tmp",
    ]
    for name in kept:
        (tmp_path / name).write_bytes(b"user's")
    (tmp_path / ".dir.abcd1234.tmp").mkdir()  # the pattern, but a folder
    (tmp_path / ".link.abcd1234.tmp").symlink_to(target)  # the pattern, but a link
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".x.abcd1234.tmp").write_bytes(b"")  # not in the folder itself

    assert remove_stale_temporaries(tmp_path) == [left]
    assert not left.exists()
    assert target.read_bytes() == b"whole"
    remaining = sorted(p.name for p in tmp_path.iterdir())
    assert remaining == sorted(
        [*kept, ".dir.abcd1234.tmp", ".link.abcd1234.tmp", "ckpt.npz", "sub"]
    )
    assert (tmp_path / "sub" / ".x.abcd1234.tmp").exists()
    assert remove_stale_temporaries(tmp_path) == []


def test_stale_temporaries_of_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no folder at .*absent"):
        remove_stale_temporaries(tmp_path / "absent")
    assert os.listdir(tmp_path) == []


# -- output paths ---------------------------------------------------------------------------
def test_check_output_file_refuses_what_atomic_write_cannot_write(tmp_path: Path) -> None:
    assert check_output_file(tmp_path / "new.json") == tmp_path / "new.json"
    with pytest.raises(FileNotFoundError, match=r"no folder .*typo for the report .*typo"):
        check_output_file(tmp_path / "typo" / "r.json", "report")
    with pytest.raises(ValueError, match=r"report .* is a folder; give a file name"):
        check_output_file(tmp_path, "report")
    (tmp_path / "file").write_text("")
    with pytest.raises(FileNotFoundError, match=r"no folder .*file for the"):
        check_output_file(tmp_path / "file" / "r.json")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_check_output_file_refuses_a_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    with pytest.raises(ValueError, match=r"folder .*ro is not writable"):
        check_output_file(folder / "r.json")


# -- the total an archive may claim ---------------------------------------------------------------
def zeros_archive(path: Path, members: int, size: int) -> dict[str, np.ndarray]:
    """``members`` float64 zero arrays of ``size`` entries, deflated (~1030:1, honest headers)."""
    arrays = {f"m{i}": np.zeros(size) for i in range(members)}
    np.savez_compressed(path, **arrays)
    return arrays


def fake_memory(monkeypatch: pytest.MonkeyPatch, pages: int) -> None:
    """Make ``os.sysconf`` report ``pages`` pages of 4 KiB of physical memory."""
    sizes = {"SC_PHYS_PAGES": pages, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(os, "sysconf", lambda name: sizes[name])
    monkeypatch.delenv("REFIMPL_NPZ_LIMIT", raising=False)


def test_npz_bomb_of_honest_members_is_refused_by_its_total(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each member's claim was bounded (by its data and by deflate's ratio), but not their sum:
    # a 33 MB archive of members at ~1030:1 asked for 32 GiB, a 1 MB one allocated 1 GiB. The
    # tests had bombs of one member claiming beyond deflate's ratio, never honest ones many.
    path = tmp_path / "bomb.npz"
    zeros_archive(path, 16, 2**17)  # 16 MiB of arrays in about 17 KB
    assert path.stat().st_size < 32 * 2**10
    fake_memory(monkeypatch, 4096)  # 16 MiB of memory: the limit is half of it, 8 MiB
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as info:
            read_npz(path, fix_hint="re-save it")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20  # refused on the headers' word: no member's array was allocated
    assert str(info.value) == (
        f"{path} holds arrays of 16.0 MiB in all, more than half this machine's memory of "
        "16.0 MiB (8.0 MiB): a compression bomb, or data too big for this machine; if the file "
        "is genuine and fits in memory, set REFIMPL_NPZ_LIMIT higher (bytes, or a size such as "
        "64G); else re-save it"
    )


def test_npz_limit_is_raised_by_the_environment_or_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.npz"
    arrays = zeros_archive(path, 16, 2**17)
    claimed = 16 * 2**17 * 8
    fake_memory(monkeypatch, 4096)
    monkeypatch.setenv("REFIMPL_NPZ_LIMIT", "16M")  # exactly the claim: it reads
    read = read_npz(path)
    assert list(read) == list(arrays) and all(not value.any() for value in read.values())
    monkeypatch.setenv("REFIMPL_NPZ_LIMIT", str(claimed - 1))
    with pytest.raises(ValueError, match=rf"more than the limit REFIMPL_NPZ_LIMIT={claimed - 1} "):
        read_npz(path)
    # a caller's own limit wins over the environment, and its message gives the caller's advice
    assert len(read_npz(path, max_bytes=claimed)) == 16
    with pytest.raises(
        ValueError, match=r"more than the limit for a thing \(16\.0 MiB\): a .*; ho"
    ):
        read_npz(path, fix_hint="ho", what="thing", max_bytes=claimed - 1)
    for text in ("lots", "0", "-5G", "1e9"):
        monkeypatch.setenv("REFIMPL_NPZ_LIMIT", text)
        with pytest.raises(ValueError, match=r"REFIMPL_NPZ_LIMIT=.* is not a size: give bytes"):
            read_npz(path)


def test_npz_limit_where_the_memory_size_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sysconf(name: str) -> int:
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(os, "sysconf", no_sysconf)
    monkeypatch.delenv("REFIMPL_NPZ_LIMIT", raising=False)
    assert npz_limit() == (8 * 2**30, "the limit used where the memory size is unknown")
    fake_memory(monkeypatch, 3 * 2**20)  # 12 GiB
    assert npz_limit() == (6 * 2**30, "half this machine's memory of 12.0 GiB")


def test_npz_member_name_with_terminal_escapes_is_printed_escaped(tmp_path: Path) -> None:
    # The message quoted a member's name as the archive stored it: a name holding escape
    # sequences cleared or recoloured the user's terminal when the CLI printed the error.
    path = tmp_path / "names.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("\x1b[2J\x1b]0;owned\x07\nx.txt", b"hello")
    text = refused(path, r"is not a \.npy array")
    assert "member \\x1b[2J\\x1b]0;owned\\x07\\nx.txt is not" in text
    assert all(c.isprintable() for c in text)
    assert printable("layer0 é") == "layer0 é"  # plain text, accents included, is unchanged


def test_npz_with_an_unclosed_header_or_an_unknown_zip_version_is_refused(tmp_path: Path) -> None:
    # Two errors escaped the list of what a damaged archive raises: NumPy tokenizes a header
    # before parsing it (an unclosed bracket raised tokenize.TokenError), and zipfile raises
    # NotImplementedError for a version or flag it cannot read. Both ended in "internal
    # error"; found by mutating the bytes of a saved graph dataset.
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.zeros(3))
    content = buffer.getvalue().replace(b"(3,), }", b"(3,   ")  # same length, never closed
    path = tmp_path / "unclosed.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.npy", content)
    refused(path, r"EOF in multi-line statement")
    path = tmp_path / "version.npz"
    np.savez(path, a=np.zeros(3))
    data = bytearray(path.read_bytes())
    central = data.rindex(b"PK\x01\x02")
    data[central + 6] = 250  # "version needed to extract": 25.0, beyond zipfile's 6.3
    path.write_bytes(bytes(data))
    refused(path, r"zip file version 25\.0")
