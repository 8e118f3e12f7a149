"""Places where the agent must answer the official SDK the way envd does (issue 17), against a
host-mode agent. docs/compatibility.md names each test next to the behaviour it checks."""

import os

import pytest
from e2b import CommandExitException, TimeoutException

from conftest import IS_ROOT, USER_UID


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_kill_returns_once_the_process_is_gone(sbx):
    # In host mode the pid the SDK sees is a host pid, so this process can probe it directly.
    for _ in range(5):
        handle = sbx.commands.run("trap '' TERM; sleep 60", background=True)
        assert _alive(handle.pid)
        assert sbx.commands.kill(handle.pid) is True
        assert not _alive(handle.pid), "commands.kill returned while the process still existed"
        with pytest.raises(CommandExitException):
            handle.wait()


def test_a_timed_out_command_is_a_timeout_never_an_exit_code(sbx):
    # Repeated: the end the timeout causes (killed, -1) used to race the timeout's own report.
    for _ in range(15):
        with pytest.raises(TimeoutException):
            sbx.commands.run("sleep 30", timeout=0.3)


def test_get_info_on_a_symlink_reports_the_target_like_envd(sbx, shared_agent):
    from e2b import FileType

    home = shared_agent.home()
    sbx.files.make_dir("links/real-dir")
    sbx.files.write("links/real-dir/f.txt", "x")
    for name, target in [("to-dir", "real-dir"), ("to-file", "real-dir/f.txt"), ("hop", "to-file"), ("dangling", "nowhere")]:
        link = home / "links" / name
        if not link.is_symlink():
            link.symlink_to(target)
    to_dir = sbx.files.get_info("links/to-dir")
    assert (to_dir.type, to_dir.symlink_target) == (FileType.DIR, "/home/user/links/real-dir")
    to_file = sbx.files.get_info("links/to-file")
    assert (to_file.type, to_file.symlink_target) == (FileType.FILE, "/home/user/links/real-dir/f.txt")
    # A chain resolves to its end.
    assert sbx.files.get_info("links/hop").symlink_target == "/home/user/links/real-dir/f.txt"
    # A dangling link has neither a type nor a target.
    dangling = sbx.files.get_info("links/dangling")
    assert (dangling.type, dangling.symlink_target) == (None, None)
    # Listing shows the same, and does not walk into a linked directory.
    listed = {e.path: e for e in sbx.files.list("links", depth=2)}
    assert listed["/home/user/links/to-dir"].type == FileType.DIR
    assert "/home/user/links/to-dir/f.txt" not in listed
    assert "/home/user/links/real-dir/f.txt" in listed


def test_write_creates_missing_parents_as_root_and_hands_them_to_the_user(sbx, shared_agent):
    if not IS_ROOT:
        print("SKIP: creating parents as root and handing them over needs the agent to run as root")
        return
    # `/` belongs to root, so `user` could not make /wt-parents itself; envd makes it as root.
    info = sbx.files.write("/wt-parents/a/b.txt", "deep")
    assert info.path == "/wt-parents/a/b.txt"
    assert sbx.files.read("/wt-parents/a/b.txt") == "deep"
    for rel in ["wt-parents", "wt-parents/a", "wt-parents/a/b.txt"]:
        st = (shared_agent.root / rel).stat()
        assert (st.st_uid, st.st_gid) == (USER_UID, USER_UID), rel
    assert (shared_agent.root / "wt-parents" / "a").stat().st_mode & 0o777 == 0o755
    # write_files goes the same way.
    sbx.files.write_files([{"path": "/wt-parents/c/d.txt", "data": "1"}, {"path": "/wt-parents/e/f.txt", "data": "2"}])
    assert (shared_agent.root / "wt-parents" / "e").stat().st_uid == USER_UID
    # What exists is not taken over: writing into root's own directory stays refused.
    from e2b.exceptions import SandboxException

    (shared_agent.root / "wt-root-only").mkdir(mode=0o755, exist_ok=True)
    with pytest.raises(SandboxException):
        sbx.files.write("/wt-root-only/x.txt", "no")


def test_watch_sees_create_chmod_write_for_a_written_file(sbx):
    if not IS_ROOT:
        print("SKIP: handing a written file to its user needs the agent to run as root")
        return
    from e2b import FilesystemEventType as T

    from conftest import wait_until

    sbx.files.make_dir("watched-seq")
    handle = sbx.files.watch_dir("watched-seq")
    try:
        sbx.files.write("watched-seq/new.txt", "1")
        events = []

        def collected():
            events.extend(handle.get_new_events())
            return sum(1 for e in events if e.name == "new.txt") >= 3

        wait_until(collected, "three events for the written file")
        assert [e.type for e in events if e.name == "new.txt"] == [T.CREATE, T.CHMOD, T.WRITE]
    finally:
        handle.stop()


def test_a_nonexistent_user_gets_envds_error(sbx):
    from e2b.exceptions import AuthenticationException

    with pytest.raises(AuthenticationException) as exc_info:
        sbx.commands.run("id", user="wt-nosuch")
    assert str(exc_info.value) == "invalid username: 'wt-nosuch'"
