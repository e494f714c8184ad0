"""unzip.py: the unpacking rules, from tables. Real zips (built member by member, hostile
ones by patching bytes where zipfile would not write them), real folders; after a refusal
nothing is left in the destination's parent and nothing outside it was written."""

from __future__ import annotations

import os
import stat
import struct
import zipfile

import pytest

from reconciler.agent.unzip import ArtifactError, UnpackLimits, unpack
from tests.artifacts import Member, bomb, zip_bytes

M = Member
REFUSED = [
    pytest.param([M("../evil", "x")], "outside the folder ('..')", id="dot-dot"),
    pytest.param([M("app/../../evil", "x")], "outside the folder ('..')", id="dot-dot-inside-a-path"),
    pytest.param([M("/tmp/evil", "x")], "is an absolute path", id="absolute"),
    pytest.param([M("..\\evil", "x")], "backslash", id="backslash"),
    pytest.param([M.link("up", "../evil")], "pointing outside the folder", id="link-up"),
    pytest.param([M.link("deep/up", "../../evil")], "pointing outside the folder", id="link-up-from-a-subfolder"),
    pytest.param([M.link("abs", "/etc/passwd")], "to an absolute path", id="link-absolute"),
    pytest.param([M.link("sneaky", "sub/../..")], "pointing outside the folder", id="link-normalised-out"),
    # each lexically inside; `back` goes out through `here` (the folder itself), seen by realpath
    pytest.param(
        [M.link("here", "."), M.link("back", "here/..")], "pointing outside the folder", id="link-out-through-a-link"
    ),
    pytest.param([M.link("dir", "sub"), M("dir/file", "x")], "below the symbolic link 'dir'", id="member-below-a-link"),
    pytest.param([M("fifo", mode=stat.S_IFIFO | 0o644)], "is a FIFO", id="fifo"),
    pytest.param([M("tty", mode=stat.S_IFCHR | 0o644)], "is a character device", id="char-device"),
    pytest.param([M("disk", mode=stat.S_IFBLK | 0o644)], "is a block device", id="block-device"),
    pytest.param([M("sock", mode=stat.S_IFSOCK | 0o644)], "is a socket", id="socket"),
    pytest.param([M("a", "1"), M("a", "2")], "is in the archive twice", id="twice"),
    pytest.param([M("a", "1"), M("a/b", "2")], "conflicts with another member", id="file-where-a-folder-goes"),
    pytest.param([M("x/", mode=stat.S_IFREG | 0o644)], "named as a folder but is not one", id="folder-name-on-a-file"),
    pytest.param([M("secret", "x", flags=0x1)], "is encrypted", id="encrypted"),
    pytest.param([M("b", "x" * 100, method=zipfile.ZIP_BZIP2)], "only stored and deflated", id="bzip2"),
    pytest.param([M("l", "x" * 100, method=zipfile.ZIP_LZMA)], "only stored and deflated", id="lzma"),
    pytest.param([M("z", bytes(2 * 2**20))], "compression ratio of", id="ratio"),
    pytest.param([M(f"f{i}", "x") for i in range(11)], "members, more than the limit of 10", id="entries"),
    pytest.param([M("a", "x" * 600), M("b", "x" * 600)], "unpacks to 1200 bytes, more than the limit", id="total"),
]
LIMITS = UnpackLimits(entries=10, total=1000, ratio_from=2**20)


def leftovers(folder) -> list[str]:
    return sorted(os.listdir(folder))


@pytest.mark.parametrize(("members", "message"), REFUSED)
def test_refused(tmp_path, members, message):
    archive = tmp_path / "a.zip"
    archive.write_bytes(zip_bytes(*members))
    parent = tmp_path / "run"
    parent.mkdir()
    with pytest.raises(ArtifactError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        unpack(archive, parent / "work", LIMITS)
    assert (caught.value.reason, caught.value.retryable) == ("ArtifactInvalid", False)
    assert leftovers(parent) == [], "no destination and no temporary folder are left"
    assert leftovers(tmp_path) == ["a.zip", "run"], "nothing was written outside"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"", "not a zip file", id="empty"),
        pytest.param(b"#!/bin/sh\necho not a zip\n", "not a zip file", id="text"),
        pytest.param(zip_bytes(M("a", "x" * 1000))[:-30], "not a zip file", id="truncated"),
        pytest.param(
            zip_bytes(M("a", "x" * 1000, method=zipfile.ZIP_STORED)).replace(b"x" * 10, b"y" * 10, 1),
            "'a' is corrupt: Bad CRC-32",
            id="crc",
        ),
    ],
)
def test_not_a_zip(tmp_path, data, message):
    archive = tmp_path / "a.zip"
    archive.write_bytes(data)
    with pytest.raises(ArtifactError, match=message):
        unpack(archive, tmp_path / "work", UnpackLimits(ratio_from=2**40))
    assert not (tmp_path / "work").exists()


def patched(data: bytes, old: bytes, new: bytes) -> bytes:
    """The zip with `old` replaced by `new` (same length) in its local and central headers."""
    assert len(old) == len(new) and data.count(old) == 2
    return data.replace(old, new)


def test_a_nul_byte_in_a_name_is_refused(tmp_path):
    archive = tmp_path / "a.zip"
    archive.write_bytes(patched(zip_bytes(M("okXname", "x")), b"okXname", b"ok\0name"))
    with pytest.raises(ArtifactError, match="NUL byte"):
        unpack(archive, tmp_path / "work")


def test_an_end_record_that_understates_the_members_is_caught_before_zipfile_reads_them(tmp_path):
    data = zip_bytes(*(M(f"f{i}", "x") for i in range(20)))
    end = data.rfind(b"PK\x05\x06")
    lying = data[: end + 8] + struct.pack("<HH", 1, 1) + data[end + 12 :]  # "1 member"
    archive = tmp_path / "a.zip"
    archive.write_bytes(lying)
    with pytest.raises(ArtifactError, match="more than 10 members"):
        unpack(archive, tmp_path / "work", LIMITS)


def test_a_central_directory_past_its_limit_is_refused(tmp_path):
    archive = tmp_path / "a.zip"
    archive.write_bytes(zip_bytes(*(M(f"{'n' * 200}{i}", "x") for i in range(5))))
    with pytest.raises(ArtifactError, match=r"central directory is \d+ bytes, more than the limit of 1000"):
        unpack(archive, tmp_path / "work", UnpackLimits(directory=1000))


def test_a_member_claiming_less_than_it_holds_is_cut_at_its_claim_and_refused(tmp_path):
    """zipfile stops a member at the size its header claims, which the limits bound; the rest
    fails the member's CRC. (What is written is counted too, as a second bound.)"""
    data = zip_bytes(M("big", b"y" * 5000))
    size = struct.pack("<L", 5000)
    archive = tmp_path / "a.zip"
    archive.write_bytes(patched(data, size, struct.pack("<L", 10)))  # uncompressed size, both headers
    with pytest.raises(ArtifactError, match="is corrupt"):
        unpack(archive, tmp_path / "work", LIMITS)
    assert not (tmp_path / "work").exists()


def test_a_bomb_is_refused_by_its_ratio_before_a_byte_is_written(tmp_path):
    archive = tmp_path / "bomb.zip"
    archive.write_bytes(bomb())
    with pytest.raises(ArtifactError, match=r"compression ratio of 10\d\d:1, above the limit of 100:1"):
        unpack(archive, tmp_path / "work")
    assert leftovers(tmp_path) == ["bomb.zip"]


def test_a_bomb_within_the_ratio_stops_at_the_total(tmp_path):
    archive = tmp_path / "bomb.zip"
    archive.write_bytes(bomb(8 * 2**20))
    with pytest.raises(ArtifactError, match=r"unpacks to 8388608 bytes, more than the limit of 4194304"):
        unpack(archive, tmp_path / "work", UnpackLimits(total=4 * 2**20, ratio=10_000))


def test_what_is_unpacked_and_how(tmp_path):
    archive = tmp_path / "a.zip"
    archive.write_bytes(
        zip_bytes(
            M.script("bin/run.sh", "#!/bin/sh\necho hi\n"),
            M("data/table.csv", "a,b\n", mode=stat.S_IFREG | 0o6666),  # set-id and world-writable: dropped
            M.folder("empty"),
            M("./dot/./slash//file", "x"),
            M.link("latest", "data/table.csv"),
            M.link("bin/up", "../data"),
            M.link("dangling", "not-there"),
            M("windows.txt", "no Unix mode", mode=0),
        )
    )
    dest = tmp_path / "run" / "work"
    dest.parent.mkdir()
    unpack(archive, dest)
    files = {str(p.relative_to(dest)): stat.S_IMODE(p.lstat().st_mode) for p in dest.rglob("*") if not p.is_symlink()}
    assert files == {
        "bin": 0o700,
        "bin/run.sh": 0o700,
        "data": 0o700,
        "data/table.csv": 0o600,
        "empty": 0o700,
        "dot": 0o700,
        "dot/slash": 0o700,
        "dot/slash/file": 0o600,
        "windows.txt": 0o600,
    }
    assert (dest / "latest").read_text() == "a,b\n"
    assert os.readlink(dest / "bin" / "up") == "../data" and (dest / "bin" / "up" / "table.csv").exists()
    assert os.readlink(dest / "dangling") == "not-there"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o700
    assert leftovers(dest.parent) == ["work"], "the temporary folder was renamed into place"


def test_the_destination_must_not_exist(tmp_path):
    archive = tmp_path / "a.zip"
    archive.write_bytes(zip_bytes(M("a", "x")))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "old").touch()
    with pytest.raises(OSError):
        unpack(archive, tmp_path / "work")
    assert leftovers(tmp_path / "work") == ["old"] and leftovers(tmp_path) == ["a.zip", "work"]
