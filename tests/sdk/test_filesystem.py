"""Files and the filesystem service through the official SDK."""

import gzip
import io

import httpx
import pytest
from e2b import FileType, FilesystemEventType
from e2b.exceptions import FileNotFoundException, InvalidArgumentException, SandboxException

from conftest import IS_ROOT, USER_UID
from conftest import wait_until


def test_write_read_bytes_text_and_streams(sbx, shared_agent):
    info = sbx.files.write("notes/a.txt", "hello")
    assert info.path == "/home/user/notes/a.txt"
    assert info.name == "a.txt"
    assert (shared_agent.home() / "notes" / "a.txt").read_text() == "hello"
    assert sbx.files.read("notes/a.txt") == "hello"
    blob = bytes(range(256)) * 1000
    sbx.files.write("/tmp/blob.bin", blob)
    assert sbx.files.read("/tmp/blob.bin", format="bytes") == blob
    # A file-like object goes over the octet-stream upload path.
    sbx.files.write("/tmp/stream.bin", io.BytesIO(blob))
    assert bytes(sbx.files.read("/tmp/stream.bin", format="bytes")) == blob
    chunks = b"".join(sbx.files.read("/tmp/stream.bin", format="stream"))
    assert chunks == blob


def test_gzip_both_ways(sbx):
    data = b"compress me " * 5000
    sbx.files.write("/tmp/gz.bin", data, gzip=True)
    assert sbx.files.read("/tmp/gz.bin", format="bytes", gzip=True) == data
    assert sbx.files.read("/tmp/gz.bin", format="bytes") == data


def test_write_many_files_in_one_request(sbx):
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    infos = sbx.files.write_files(
        [WriteEntry(path="multi/one.txt", data="1"), WriteEntry(path="multi/two.txt", data=b"2")]
    )
    assert sorted(i.path for i in infos) == ["/home/user/multi/one.txt", "/home/user/multi/two.txt"]
    assert sbx.files.read("multi/two.txt") == "2"


def test_files_belong_to_the_user(sbx, shared_agent):
    if not IS_ROOT:
        print("SKIP: switching users needs the agent to run as root")
        return
    sbx.files.write("owned/by/user.txt", "x")
    assert (shared_agent.home() / "owned" / "by" / "user.txt").stat().st_uid == USER_UID
    assert (shared_agent.home() / "owned").stat().st_uid == USER_UID
    sbx.files.write("/root/by-root.txt", "x", user="root")
    assert (shared_agent.root / "root" / "by-root.txt").stat().st_uid == 0
    entry = sbx.files.get_info("owned/by/user.txt")
    assert (entry.owner, entry.group) == ("user", "user")


def test_permission_denied_and_traversal(sbx):
    if not IS_ROOT:
        print("SKIP: permission checks need the agent to run as root")
        return
    with pytest.raises(SandboxException) as info:
        sbx.files.read("../../etc/shadow")
    assert "403" in str(info.value) or "ermission" in str(info.value)
    with pytest.raises(SandboxException):
        sbx.files.write("/root/nope.txt", "x")
    with pytest.raises(SandboxException) as info:
        sbx.files.list("/root")
    assert "permission" in str(info.value).lower()
    # Root may read it; ".." never leaves the sandbox root.
    assert sbx.files.read("/../../../etc/shadow", user="root").startswith("root:")


def test_list_depth_stat_exists(sbx):
    sbx.files.make_dir("tree/a/b")
    sbx.files.write("tree/top.txt", "t")
    sbx.files.write("tree/a/mid.txt", "m")
    sbx.files.write("tree/a/b/deep.txt", "d")
    one = {e.path for e in sbx.files.list("tree")}
    assert one == {"/home/user/tree/a", "/home/user/tree/top.txt"}
    two = {e.path for e in sbx.files.list("tree", depth=2)}
    assert "/home/user/tree/a/mid.txt" in two and "/home/user/tree/a/b" in two
    assert "/home/user/tree/a/b/deep.txt" not in two
    three = {e.path for e in sbx.files.list("tree", depth=3)}
    assert "/home/user/tree/a/b/deep.txt" in three
    info = sbx.files.get_info("tree/top.txt")
    assert (info.type, info.size, info.name) == (FileType.FILE, 1, "top.txt")
    assert sbx.files.get_info("tree/a").type == FileType.DIR
    assert sbx.files.exists("tree/top.txt") is True
    assert sbx.files.exists("tree/missing") is False


def test_errors_for_missing_and_not_a_directory(sbx):
    sbx.files.write("plain.txt", "x")
    with pytest.raises(FileNotFoundException):
        sbx.files.get_info("no/such/file")
    with pytest.raises(FileNotFoundException):
        sbx.files.read("no/such/file")
    with pytest.raises(FileNotFoundException):
        sbx.files.list("no/such/dir")
    with pytest.raises(InvalidArgumentException):
        sbx.files.list("plain.txt")
    with pytest.raises(InvalidArgumentException):
        sbx.files.read("tree" if sbx.files.exists("tree") else "/tmp")


def test_make_dir_move_remove(sbx):
    assert sbx.files.make_dir("mk/x") is True
    assert sbx.files.make_dir("mk/x") is False
    sbx.files.write("mk/x/f.txt", "moved")
    moved = sbx.files.rename("mk/x/f.txt", "mk/y/g.txt")
    assert moved.path == "/home/user/mk/y/g.txt"
    assert sbx.files.read("mk/y/g.txt") == "moved"
    assert sbx.files.exists("mk/x/f.txt") is False
    with pytest.raises(FileNotFoundException):
        sbx.files.rename("mk/none", "mk/other")
    sbx.files.remove("mk")
    assert sbx.files.exists("mk") is False
    sbx.files.remove("mk")  # removing what is gone is fine


def test_symlinks_are_reported(sbx, shared_agent):
    sbx.files.write("target.txt", "t")
    link = shared_agent.home() / "link.txt"
    if not link.exists():
        link.symlink_to("target.txt")
    info = sbx.files.get_info("link.txt")
    # As envd: the target's type, and the target's absolute path with every link resolved.
    assert info.type == FileType.FILE
    assert info.symlink_target == "/home/user/target.txt"
    assert info.permissions.startswith("L")


def test_metadata_round_trip(sbx):
    try:
        info = sbx.files.write("meta.txt", "m", metadata={"owner-team": "infra"})
    except SandboxException as e:
        print(f"SKIP: filesystem without user xattrs: {e}")
        return
    got = sbx.files.get_info("meta.txt").metadata
    if got is None:
        print("SKIP: filesystem without user xattrs")
        return
    assert got == {"owner-team": "infra"}
    assert info.metadata == {"owner-team": "infra"}


def test_watch_dir_reports_events(sbx):
    sbx.files.make_dir("watched/sub")
    handle = sbx.files.watch_dir("watched", recursive=True, include_entry=True)
    try:
        sbx.files.write("watched/new.txt", "1")
        sbx.files.write("watched/sub/inner.txt", "2")
        sbx.files.remove("watched/new.txt")
        events = []

        def collected():
            events.extend(handle.get_new_events())
            kinds = {(e.name, e.type) for e in events}
            return (
                ("new.txt", FilesystemEventType.CREATE) in kinds
                and ("sub/inner.txt", FilesystemEventType.CREATE) in kinds
                and ("new.txt", FilesystemEventType.REMOVE) in kinds
            )

        wait_until(collected, "watch events")
        created = [e for e in events if e.name == "new.txt" and e.type == FilesystemEventType.CREATE]
        assert created[0].entry is None or created[0].entry.name == "new.txt"
    finally:
        handle.stop()


def test_watch_missing_dir_is_not_found(sbx):
    with pytest.raises(FileNotFoundException):
        sbx.files.watch_dir("no/such/watch")


def test_download_url_signature_is_accepted(fresh_agent):
    token = "wt-secret-token"
    r = httpx.post(f"{fresh_agent.url}/init", json={"accessToken": token})
    assert r.status_code == 204
    sbx = fresh_agent.sandbox(access_token=token)
    sbx.files.write("signed.txt", "signed content")
    url = sbx.download_url("signed.txt", use_signature_expiration=60)
    assert httpx.get(url).text == "signed content"
    up = sbx.upload_url("uploaded.txt")
    assert httpx.post(up, files={"file": ("uploaded.txt", b"via url")}).status_code == 200
    assert sbx.files.read("uploaded.txt") == "via url"
    bad = url.replace("signature=v1_", "signature=v1_x")
    assert httpx.get(bad).status_code == 401
