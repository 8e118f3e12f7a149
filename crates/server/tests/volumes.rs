//! Volumes against a real server (port 0, temp state, real ext4 images and loop mounts; needs root)
//! on the fake runtime: `/volumes` scoped to the key's team, `/volumecontent` behind the volume's
//! token, and the content API never following a symlink a sandbox planted out of the volume.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde_json::json;
use support::{assert_error, send, send_bytes, Answer, Harness};

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Unmounts what a test left, so the temp state dir (and no loop device) outlives it.
fn unmount_volumes(h: &Harness) {
    warren_runtime::rootfs::volume_disk::unmount_all(&h.server.state_dir().join("volumes"));
}

async fn new_volume(h: &Harness, name: &str) -> (String, String) {
    let made = h
        .api(Method::POST, "/volumes", Some(json!({"name": name})))
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.json());
    let body = made.json();
    (
        body["volumeID"].as_str().unwrap().to_string(),
        body["token"].as_str().unwrap().to_string(),
    )
}

fn mount_point(h: &Harness, id: &str) -> PathBuf {
    h.server.state_dir().join("volumes").join(id).join("mnt")
}

/// A `/volumecontent` request with the bearer `token`.
async fn content(
    h: &Harness,
    token: Option<&str>,
    method: Method,
    id: &str,
    route_and_query: &str,
    body: Bytes,
) -> Answer {
    let url = format!("{}/volumecontent/{id}/{route_and_query}", h.server.api_url);
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers: Vec<(&str, &str)> = vec![("content-type", "application/octet-stream")];
    if let Some(bearer) = &bearer {
        headers.push(("Authorization", bearer));
    }
    send_bytes(method, &url, &headers, body).await
}

#[tokio::test]
async fn volumes_are_team_scoped_named_once_and_kept_while_mounted() {
    if !root() {
        eprintln!("skipped: volumes need root (loop devices, mounts)");
        return;
    }
    let h = Harness::start(false, |_| {}).await;
    let (id, token) = new_volume(&h, "data").await;
    assert!(id.starts_with("vol-") && token.len() >= 32);
    assert_error(
        &h.api(Method::POST, "/volumes", Some(json!({"name": "data"})))
            .await,
        StatusCode::CONFLICT,
        "\"data\" exists already",
    );
    assert_error(
        &h.api(Method::POST, "/volumes", Some(json!({"name": "a/b"})))
            .await,
        StatusCode::BAD_REQUEST,
        "volume name \"a/b\" is not valid",
    );
    assert_error(
        &h.api(
            Method::POST,
            "/volumes",
            Some(json!({"name": "x", "sizeGiB": 3})),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "sizeGiB",
    );
    let listed = h.api(Method::GET, "/volumes", None).await;
    assert_eq!(listed.json(), json!([{"volumeID": id, "name": "data"}]));
    let info = h.api(Method::GET, &format!("/volumes/{id}"), None).await;
    assert_eq!(info.json()["token"], json!(token));

    // Another team sees nothing of it and may use the name itself.
    let other = h.team_key("others").await;
    assert_eq!(
        h.api_as(&other, Method::GET, "/volumes", None).await.json(),
        json!([])
    );
    for method in [Method::GET, Method::DELETE] {
        let answer = h
            .api_as(&other, method, &format!("/volumes/{id}"), None)
            .await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND);
    }

    // Mount paths and names are checked at create, naming the problem.
    for (mounts, named) in [
        (json!([{"name": "data", "path": "/proc/x"}]), "\"/proc/x\""),
        (json!([{"name": "data", "path": "rel"}]), "must be absolute"),
        (json!([{"name": "data", "path": "/"}]), "is the root"),
        (
            json!([{"name": "nope", "path": "/data"}]),
            "no volume named \"nope\"",
        ),
        (
            json!([{"name": "data", "path": "/d", "readOnly": true}]),
            "readOnly",
        ),
    ] {
        let answer = h
            .api(
                Method::POST,
                "/v2/sandboxes",
                Some(json!({"templateID": "base", "volumeMounts": mounts})),
            )
            .await;
        assert_error(&answer, StatusCode::BAD_REQUEST, named);
    }
    let sandbox = h
        .create(
            json!({"templateID": "base", "volumeMounts": [{"name": "data", "path": "/mnt/data/"}]}),
        )
        .await;
    let sandbox_id = sandbox["sandboxID"].as_str().unwrap().to_string();
    let record = h
        .server
        .server
        .lifecycle
        .store()
        .get_sandbox(&sandbox_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.volumes.len(), 1);
    assert_eq!(record.volumes[0].path, "/mnt/data");
    assert!(warren_runtime::rootfs::layer_disk::is_mount_point(
        &mount_point(&h, &id)
    ));

    // Refused while a live sandbox mounts it; gone once the sandbox is.
    assert_error(
        &h.api(Method::DELETE, &format!("/volumes/{id}"), None).await,
        StatusCode::CONFLICT,
        &sandbox_id,
    );
    let killed = h
        .api(Method::DELETE, &format!("/sandboxes/{sandbox_id}"), None)
        .await;
    assert_eq!(killed.status, StatusCode::NO_CONTENT);
    let deleted = h.api(Method::DELETE, &format!("/volumes/{id}"), None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert!(!h.server.state_dir().join("volumes").join(&id).exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&id), "the volume's mount is gone");
    let again = h.api(Method::DELETE, &format!("/volumes/{id}"), None).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    unmount_volumes(&h);
}

#[tokio::test]
async fn content_round_trips_behind_the_volume_token() {
    if !root() {
        eprintln!("skipped: volumes need root (loop devices, mounts)");
        return;
    }
    let h = Harness::start(false, |config| config.limits.volume_size_mib = 16).await;
    let (id, token) = new_volume(&h, "files").await;
    let (other_id, _) = new_volume(&h, "other").await;
    let t = Some(token.as_str());

    // The token: missing 401, wrong (another volume's) 403, unknown volume 404.
    let path = "path?path=/";
    assert_eq!(
        content(&h, None, Method::GET, &id, path, Bytes::new())
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        content(&h, Some("nope"), Method::GET, &id, path, Bytes::new())
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        content(&h, t, Method::GET, &other_id, path, Bytes::new())
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        content(&h, t, Method::GET, "vol-missing", path, Bytes::new())
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    // Write without `force` into a missing dir: 404; with it, parents are made.
    let missing = content(
        &h,
        t,
        Method::PUT,
        &id,
        "file?path=/a/b/c.txt",
        Bytes::from("x"),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let written = content(
        &h,
        t,
        Method::PUT,
        &id,
        "file?path=/a/b/c.txt&force=true&mode=384&uid=1234&gid=4321",
        Bytes::from("hello volume"),
    )
    .await;
    assert_eq!(written.status, StatusCode::CREATED, "{:?}", written.json());
    let stat = written.json();
    assert_eq!(stat["type"], "file");
    assert_eq!(stat["name"], "c.txt");
    assert_eq!(stat["path"], "/a/b/c.txt");
    assert_eq!(stat["size"], 12);
    assert_eq!(stat["mode"], 0o600);
    assert_eq!(
        (stat["uid"].clone(), stat["gid"].clone()),
        (json!(1234), json!(4321))
    );
    for time in ["atime", "mtime", "ctime"] {
        assert!(
            chrono::DateTime::parse_from_rfc3339(stat[time].as_str().unwrap()).is_ok(),
            "{time}"
        );
    }
    let on_disk = mount_point(&h, &id).join("a/b/c.txt");
    assert_eq!(std::fs::metadata(&on_disk).unwrap().uid(), 1234);
    let read = content(&h, t, Method::GET, &id, "file?path=a/b/c.txt", Bytes::new()).await;
    assert_eq!(
        (read.status, read.body.as_ref()),
        (StatusCode::OK, b"hello volume".as_ref())
    );

    let made = content(
        &h,
        t,
        Method::POST,
        &id,
        "dir?path=/d&mode=448",
        Bytes::new(),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED);
    assert_eq!(made.json()["type"], "directory");
    let listing = content(&h, t, Method::GET, &id, "dir?path=/&depth=3", Bytes::new()).await;
    let paths: Vec<String> = listing
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paths, ["/a", "/a/b", "/a/b/c.txt", "/d"]);
    let patched = content(
        &h,
        t,
        Method::PATCH,
        &id,
        "path?path=/a/b/c.txt",
        Bytes::new(),
    )
    .await;
    assert_eq!(
        patched.status,
        StatusCode::BAD_REQUEST,
        "a PATCH needs a JSON body"
    );
    let url = format!(
        "{}/volumecontent/{id}/path?path=/a/b/c.txt",
        h.server.api_url
    );
    let bearer = format!("Bearer {token}");
    let patched = send(
        Method::PATCH,
        &url,
        &[("Authorization", &bearer)],
        Some(json!({"mode": 0o644, "uid": 0})),
    )
    .await;
    assert_eq!(patched.status, StatusCode::OK, "{:?}", patched.json());
    assert_eq!(patched.json()["mode"], 0o644);
    assert_eq!(patched.json()["uid"], 0);

    // Bad paths and unknown parameters are refused by name.
    for (query, named) in [
        ("path?path=/a/../../etc", "`..`"),
        ("path?path=/a%00b", "NUL"),
        ("path?path=/a&bogus=1", "bogus"),
    ] {
        let answer = content(&h, t, Method::GET, &id, query, Bytes::new()).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, named);
    }

    // Past the quota: 507 naming it; the old file stays as it was.
    let big = Bytes::from(vec![1u8; 20 << 20]);
    let full = content(&h, t, Method::PUT, &id, "file?path=/a/b/c.txt", big).await;
    assert_error(&full, StatusCode::INSUFFICIENT_STORAGE, "quota is 16 MiB");
    assert_eq!(std::fs::read(&on_disk).unwrap(), b"hello volume");

    let removed = content(&h, t, Method::DELETE, &id, "path?path=/a", Bytes::new()).await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT);
    let gone = content(
        &h,
        t,
        Method::GET,
        &id,
        "file?path=/a/b/c.txt",
        Bytes::new(),
    )
    .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    let root_removal = content(&h, t, Method::DELETE, &id, "path?path=/", Bytes::new()).await;
    assert_eq!(root_removal.status, StatusCode::BAD_REQUEST);
    unmount_volumes(&h);
}

#[tokio::test]
async fn symlinks_a_sandbox_plants_never_lead_out_of_the_volume() {
    if !root() {
        eprintln!("skipped: volumes need root (loop devices, mounts)");
        return;
    }
    let h = Harness::start(false, |_| {}).await;
    let (id, token) = new_volume(&h, "hostile").await;
    let t = Some(token.as_str());
    // A host directory with a file the attacker wants (a stand-in for /etc: writes, chmods and
    // removals aim here, so that a failing test cannot damage the host's real files).
    let host = tempfile::Builder::new()
        .prefix("wt-host-")
        .tempdir()
        .unwrap();
    let secret = host.path().join("secret");
    std::fs::write(&secret, "host data").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    // What a sandbox's root can plant on the volume.
    let inside = mount_point(&h, &id);
    std::os::unix::fs::symlink("/etc/passwd", inside.join("passwd")).unwrap();
    std::os::unix::fs::symlink(&secret, inside.join("secret")).unwrap();
    std::os::unix::fs::symlink(host.path(), inside.join("hostdir")).unwrap();
    std::os::unix::fs::symlink("/proc/self/root/etc", inside.join("magic")).unwrap();
    let passwd = std::fs::read("/etc/passwd").unwrap();

    // Reads through a symlink are refused; nothing of the host comes back.
    for query in [
        "file?path=/passwd",
        "file?path=/hostdir/secret",
        "file?path=/magic/passwd",
        "dir?path=/hostdir",
        "dir?path=/magic",
        "path?path=/hostdir/secret",
    ] {
        let answer = content(&h, t, Method::GET, &id, query, Bytes::new()).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, "symlink");
        assert!(!String::from_utf8_lossy(&answer.body).contains("host data"));
        assert!(!String::from_utf8_lossy(&answer.body).contains("root:x:0"));
    }
    // Stat of the link itself says what it is and where it points, without following it.
    let link = content(&h, t, Method::GET, &id, "path?path=/passwd", Bytes::new()).await;
    assert_eq!(link.status, StatusCode::OK);
    assert_eq!(link.json()["type"], "symlink");
    assert_eq!(link.json()["target"], "/etc/passwd");

    // Writes replace the link (never write through it) or are refused below it.
    let replaced = content(
        &h,
        t,
        Method::PUT,
        &id,
        "file?path=/secret",
        Bytes::from("mine"),
    )
    .await;
    assert_eq!(replaced.status, StatusCode::CREATED);
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host data");
    let below = content(
        &h,
        t,
        Method::PUT,
        &id,
        "file?path=/hostdir/new&force=true",
        Bytes::from("x"),
    )
    .await;
    assert_error(&below, StatusCode::BAD_REQUEST, "symlink");
    assert!(!host.path().join("new").exists());
    let dir_below = content(
        &h,
        t,
        Method::POST,
        &id,
        "dir?path=/hostdir/made&force=true",
        Bytes::new(),
    )
    .await;
    assert_error(&dir_below, StatusCode::BAD_REQUEST, "symlink");
    assert!(!host.path().join("made").exists());

    // chmod/chown through a link: refused; the host file keeps its mode and owner.
    std::os::unix::fs::symlink(&secret, inside.join("secret2")).unwrap();
    let url = |path: &str| format!("{}/volumecontent/{id}/path?path={path}", h.server.api_url);
    let bearer = format!("Bearer {token}");
    for path in ["/secret2", "/hostdir/secret"] {
        let answer = send(
            Method::PATCH,
            &url(path),
            &[("Authorization", &bearer)],
            Some(json!({"mode": 0o777, "uid": 4242})),
        )
        .await;
        assert_error(&answer, StatusCode::BAD_REQUEST, "symlink");
    }
    let meta = std::fs::metadata(&secret).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o600, 0));

    // Removal takes the link, never what it points at.
    for path in ["/hostdir", "/secret2", "/magic"] {
        let answer = content(
            &h,
            t,
            Method::DELETE,
            &id,
            &format!("path?path={path}"),
            Bytes::new(),
        )
        .await;
        assert_eq!(answer.status, StatusCode::NO_CONTENT, "{path}");
    }
    let below = content(
        &h,
        t,
        Method::DELETE,
        &id,
        "path?path=/passwd/x",
        Bytes::new(),
    )
    .await;
    assert_eq!(below.status, StatusCode::BAD_REQUEST);
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host data");
    assert!(host.path().exists());
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd);
    unmount_volumes(&h);
}
