"""The agent's wire protocol itself: access token, /init, plain endpoints, Connect framing with
both codecs, and bad input answered with protocol errors while the agent keeps serving."""

import json
import select
import socket
import struct

import httpx
import pytest
from protobuf import Oneof

from e2b.envd.process import process_pb
from e2b.exceptions import AuthenticationException

from conftest import ENVD_VERSION, IS_ROOT, wait_until


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def frames(body: bytes):
    out = []
    while body:
        flags, length = struct.unpack(">BI", body[:5])
        out.append((flags, body[5 : 5 + length]))
        body = body[5 + length :]
    return out


def rpc(url, method, body, content_type="application/json", headers=None):
    h = {"Content-Type": content_type, "Connect-Protocol-Version": "1", **(headers or {})}
    return httpx.post(f"{url}/{method}", content=body, headers=h, timeout=30)


def assert_healthy(url):
    assert httpx.get(f"{url}/health").status_code == 204


def test_health_envs_metrics_and_version(shared_agent):
    r = httpx.get(f"{shared_agent.url}/health")
    assert r.status_code == 204
    assert r.headers["x-envd-version"] == ENVD_VERSION
    assert httpx.get(f"{shared_agent.url}/envs").status_code == 200
    m = httpx.get(f"{shared_agent.url}/metrics").json()
    for key in ("ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "disk_used", "disk_total"):
        assert key in m
    assert m["mem_total"] > 0 and m["disk_total"] > 0


def test_init_sets_env_default_user_and_workdir(fresh_agent):
    (fresh_agent.root / "work").mkdir()
    r = httpx.post(
        f"{fresh_agent.url}/init",
        json={
            "envVars": {"WT_FROM_INIT": "yes"},
            "defaultUser": "root",
            "defaultWorkdir": "/work",
            "timestamp": "2026-01-01T00:00:00Z",
        },
    )
    assert r.status_code == 204
    assert httpx.get(f"{fresh_agent.url}/envs").json() == {"WT_FROM_INIT": "yes"}
    sbx = fresh_agent.sandbox()
    out = sbx.commands.run("echo $WT_FROM_INIT; pwd; echo $HOME").stdout.splitlines()
    assert out[0] == "yes"
    assert out[1] == str(fresh_agent.root / "work")
    if IS_ROOT:
        assert out[2] == str(fresh_agent.root / "root")
    # An older init is acknowledged and ignored.
    r = httpx.post(
        f"{fresh_agent.url}/init",
        json={"envVars": {"OLD": "1"}, "timestamp": "2025-01-01T00:00:00Z"},
    )
    assert r.status_code == 204
    assert httpx.get(f"{fresh_agent.url}/envs").json() == {"WT_FROM_INIT": "yes"}
    assert httpx.post(f"{fresh_agent.url}/init", content=b"{nope").status_code == 400


def test_access_token_guards_everything_but_health(fresh_agent):
    token = "wt-token-123"
    assert httpx.post(f"{fresh_agent.url}/init", json={"accessToken": token}).status_code == 204
    url = fresh_agent.url
    assert httpx.get(f"{url}/health").status_code == 204
    assert httpx.get(f"{url}/envs").status_code == 401
    assert httpx.get(f"{url}/metrics").status_code == 401
    assert httpx.get(f"{url}/files", params={"path": "x"}).status_code == 401
    assert rpc(url, "process.Process/List", b"{}").status_code == 401
    assert httpx.get(f"{url}/envs", headers={"X-Access-Token": "wrong"}).status_code == 401
    assert httpx.get(f"{url}/envs", headers={"X-Access-Token": token}).status_code == 200
    # Through the SDK: no token -> AuthenticationException; right token -> works.
    with pytest.raises(AuthenticationException):
        fresh_agent.sandbox().commands.run("true")
    with pytest.raises(Exception):
        fresh_agent.sandbox().files.write("x.txt", "x")
    good = fresh_agent.sandbox(access_token=token)
    assert good.commands.run("echo ok").stdout == "ok\n"
    good.files.write("x.txt", "x")
    assert good.files.read("x.txt") == "x"
    # Re-init needs the current token.
    assert httpx.post(f"{url}/init", json={"accessToken": "stolen"}).status_code == 401
    assert (
        httpx.post(f"{url}/init", json={"accessToken": "rotated"}, headers={"X-Access-Token": token}).status_code
        == 204
    )
    assert httpx.get(f"{url}/envs", headers={"X-Access-Token": "rotated"}).status_code == 200


def test_unknown_rpc_and_bad_content_type(shared_agent):
    url = shared_agent.url
    r = rpc(url, "process.Process/Explode", b"{}")
    assert r.status_code == 404
    assert r.json()["code"] == "unimplemented"
    r = rpc(url, "nope.Nope/List", b"{}")
    assert r.json()["code"] == "unimplemented"
    r = rpc(url, "process.Process/List", b"{}", content_type="text/plain")
    assert r.status_code == 415
    assert_healthy(url)


def test_malformed_json_and_protobuf(shared_agent):
    url = shared_agent.url
    r = rpc(url, "process.Process/List", b"{not json")
    assert r.status_code == 400
    assert r.json()["code"] == "invalid_argument"
    r = rpc(url, "process.Process/SendSignal", json.dumps({"signal": "SIGNAL_BOGUS"}).encode())
    assert r.json()["code"] == "invalid_argument"
    r = rpc(url, "filesystem.Filesystem/Stat", b"\xff\xff\xff\xff", content_type="application/proto")
    assert r.status_code == 400
    assert r.json()["code"] == "invalid_argument"
    # A streaming call with a truncated envelope ends with an error in the end-of-stream message.
    r = rpc(url, "process.Process/Start", b"\x00\x00\x00\x10{}", content_type="application/connect+json")
    assert r.status_code == 200
    (flags, payload), = frames(r.content)
    assert flags == 2 and json.loads(payload)["error"]["code"] == "invalid_argument"
    # A compressed frame we never negotiated.
    r = rpc(url, "process.Process/Start", envelope(b"{}", flags=1), content_type="application/connect+json")
    assert json.loads(frames(r.content)[-1][1])["error"]["code"] == "invalid_argument"
    assert_healthy(url)


def test_binary_proto_codec_streams_a_command(shared_agent):
    req = process_pb.StartRequest(
        process=process_pb.ProcessConfig(cmd="/bin/echo", args=["proto works"]),
        stdin=False,
    )
    r = rpc(
        shared_agent.url,
        "process.Process/Start",
        envelope(req.to_binary()),
        content_type="application/connect+proto",
    )
    assert r.headers["content-type"] == "application/connect+proto"
    got = frames(r.content)
    assert got[-1] == (2, b"{}")
    events = [process_pb.StartResponse.from_binary(p).event for f, p in got[:-1]]
    kinds = [e.event.field for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end"
    stdout = b"".join(e.event.value.output.value for e in events if e.event.field == "data")
    assert stdout == b"proto works\n"
    assert events[-1].event.value.exit_code == 0


def test_sigterm_signal_and_unsupported_signal(shared_agent):
    sbx = shared_agent.sandbox()
    handle = sbx.commands.run("trap 'echo got-term; exit 3' TERM; while true; do sleep 0.05; done", background=True)
    wait_until(lambda: handle.pid in {p.pid for p in sbx.commands.list()}, "process to be listed")
    sel = {"process": {"pid": handle.pid}}
    bad = rpc(shared_agent.url, "process.Process/SendSignal", json.dumps({**sel, "signal": "SIGNAL_UNSPECIFIED"}).encode())
    assert bad.json()["code"] == "unimplemented"
    ok = rpc(shared_agent.url, "process.Process/SendSignal", json.dumps({**sel, "signal": "SIGNAL_SIGTERM"}).encode())
    assert ok.status_code == 200, ok.text
    from e2b import CommandExitException

    with pytest.raises(CommandExitException) as info:
        handle.wait()
    assert info.value.exit_code == 3
    assert "got-term" in info.value.stdout


def test_huge_headers_get_an_error_and_the_agent_keeps_serving(shared_agent):
    # 10 MB of header, sent in pieces; we stop sending as soon as the agent answers so its
    # reply is read before the connection closes.
    reply = b""
    with socket.create_connection(("127.0.0.1", shared_agent.port), timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        piece = b"a" * 65536
        for _ in range(160):
            if select.select([s], [], [], 0)[0]:
                break
            try:
                s.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
        try:
            reply = s.recv(4096)
        except ConnectionResetError:
            pass
    print("reply to 10 MB of headers:", reply[:40])
    assert reply.startswith(b"HTTP/1.1 431")
    assert_healthy(shared_agent.url)


def test_a_misbehaving_child_does_not_hurt_the_agent(sbx, shared_agent):
    # Crashes, floods, closed pipes and a stream abandoned mid-output.
    with pytest.raises(Exception):
        sbx.commands.run("kill -SEGV $$")
    sbx.commands.run("exec >&- 2>&-; sleep 0.1")
    handle = sbx.commands.run("yes wt-flood", background=True)
    for i, _ in enumerate(handle):
        if i > 50:
            break
    handle.disconnect()
    sbx.commands.kill(handle.pid)
    assert sbx.commands.run("echo still here").stdout == "still here\n"
    assert_healthy(shared_agent.url)
