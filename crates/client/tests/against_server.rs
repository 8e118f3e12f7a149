//! warren-client against a real Warren server, proxy and agent (see support/host_agent.rs).

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use support::host_agent::start_server;
use warren_client::types::{NewSandbox, SandboxState};
use warren_client::{ApiClient, EnvdClient, ErrorKind, ListQuery, ProcessOutput, ProcessSpec};

fn new_sandbox(metadata: &[(&str, &str)]) -> NewSandbox {
    NewSandbox {
        template_id: "base".into(),
        timeout: Some(300),
        auto_pause: None,
        auto_pause_memory: None,
        auto_resume: None,
        secure: None,
        allow_internet_access: None,
        metadata: Some(
            metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        env_vars: None,
        ..NewSandbox::default()
    }
}

/// Collects a process's output until it ends.
async fn run_to_end(envd: &EnvdClient, spec: &ProcessSpec) -> (Vec<u8>, Vec<u8>, Vec<u8>, i32) {
    let mut stream = envd.start(spec).await.expect("start");
    let (mut stdout, mut stderr, mut pty) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(event) = stream.next().await.expect("event") {
        match event {
            ProcessOutput::Started { .. } => {}
            ProcessOutput::Stdout(b) => stdout.extend(b),
            ProcessOutput::Stderr(b) => stderr.extend(b),
            ProcessOutput::Pty(b) => pty.extend(b),
            ProcessOutput::Ended(end) => return (stdout, stderr, pty, end.shell_exit_code()),
        }
    }
    panic!("stream ended without an end event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_lifecycle_through_the_client() {
    let Some(harness) = start_server().await else {
        return;
    };
    let server = &harness.server;
    let api = ApiClient::new(&server.api_url, Some(server.api_key.clone())).expect("client");

    let created = api
        .create_sandbox(&new_sandbox(&[("suite", "wt-client")]))
        .await
        .expect("create");
    let id = created.sandbox_id.clone();
    assert_eq!(created.template_id, "base");

    let query = ListQuery {
        states: vec![SandboxState::Running],
        metadata: [("suite".to_string(), "wt-client".to_string())].into(),
        limit: None,
    };
    let listed = api.list_sandboxes(&query).await.expect("list");
    assert_eq!(
        listed
            .iter()
            .map(|s| s.sandbox_id.as_str())
            .collect::<Vec<_>>(),
        vec![id.as_str()]
    );
    let other = ListQuery {
        metadata: [("suite".to_string(), "other".to_string())].into(),
        ..query.clone()
    };
    assert!(api.list_sandboxes(&other).await.expect("list").is_empty());

    api.set_timeout(&id, 600).await.expect("timeout");
    let far = api.get_sandbox(&id).await.expect("get").end_at;
    api.set_timeout(&id, 60).await.expect("timeout");
    let near = api.get_sandbox(&id).await.expect("get").end_at;
    assert!(near < far, "{near} !< {far}");

    api.pause_sandbox(&id).await.expect("pause");
    assert_eq!(
        api.get_sandbox(&id).await.expect("get").state,
        SandboxState::Paused
    );
    api.connect_sandbox(&id, 120).await.expect("resume");
    assert_eq!(
        api.get_sandbox(&id).await.expect("get").state,
        SandboxState::Running
    );

    let templates = api.list_templates().await.expect("templates");
    assert!(templates
        .iter()
        .any(|t| t.template_id == "base" || t.aliases.iter().any(|a| a == "base")));

    api.kill_sandbox(&id).await.expect("kill");
    assert_eq!(
        api.get_sandbox(&id).await.expect_err("gone").kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        api.kill_sandbox(&id).await.expect_err("gone").kind(),
        ErrorKind::NotFound
    );
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_map_to_kinds() {
    let Some(harness) = start_server().await else {
        return;
    };
    let server = &harness.server;
    let wrong_key = ApiClient::new(&server.api_url, Some("e2b_wt_wrong".into())).expect("client");
    assert_eq!(
        wrong_key.list_templates().await.expect_err("401").kind(),
        ErrorKind::Unauthorized
    );
    let no_key = ApiClient::new(&server.api_url, None).expect("client");
    assert_eq!(
        no_key
            .list_sandboxes(&ListQuery::default())
            .await
            .expect_err("401")
            .kind(),
        ErrorKind::Unauthorized
    );

    let api = ApiClient::new(&server.api_url, Some(server.api_key.clone())).expect("client");
    let mut unknown = new_sandbox(&[]);
    unknown.template_id = "wt-no-such-template".into();
    let err = api.create_sandbox(&unknown).await.expect_err("404");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("wt-no-such-template"), "{err}");

    let mut bad_timeout = new_sandbox(&[]);
    bad_timeout.timeout = Some(-5);
    assert_eq!(
        api.create_sandbox(&bad_timeout)
            .await
            .expect_err("400")
            .kind(),
        ErrorKind::BadRequest
    );

    // envd of a sandbox that no longer exists: the proxy's 404.
    let created = api.create_sandbox(&new_sandbox(&[])).await.expect("create");
    api.kill_sandbox(&created.sandbox_id).await.expect("kill");
    let envd =
        EnvdClient::new(&server.sandbox_url, &created.sandbox_id, None, "user").expect("envd");
    let err = envd
        .start(&ProcessSpec::shell_command("true"))
        .await
        .err()
        .expect("404 from the proxy");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envd_commands_pty_and_files_through_the_proxy() {
    let Some(harness) = start_server().await else {
        return;
    };
    let server = &harness.server;
    let api = ApiClient::new(&server.api_url, Some(server.api_key.clone())).expect("client");
    let created = api.create_sandbox(&new_sandbox(&[])).await.expect("create");
    let envd = EnvdClient::new(
        &server.sandbox_url,
        &created.sandbox_id,
        created.envd_access_token.as_deref(),
        "user",
    )
    .expect("envd");

    // A command: separate stdout and stderr, the exit code passes through.
    let (stdout, stderr, _, code) = run_to_end(
        &envd,
        &ProcessSpec::shell_command("echo out; echo err >&2; exit 3"),
    )
    .await;
    assert_eq!(
        (stdout.as_slice(), stderr.as_slice(), code),
        (&b"out\n"[..], &b"err\n"[..], 3)
    );

    // Environment and stdin.
    let mut spec = ProcessSpec::shell_command("cat; echo \":$WT_VAR\"");
    spec.envs.insert("WT_VAR".into(), "v".into());
    spec.stdin = true;
    let mut stream = envd.start(&spec).await.expect("start");
    let Some(ProcessOutput::Started { pid }) = stream.next().await.expect("event") else {
        panic!("first event is not Started");
    };
    envd.send_stdin(pid, b"typed\n".to_vec())
        .await
        .expect("stdin");
    envd.close_stdin(pid).await.expect("close stdin");
    let mut out = Vec::new();
    while let Some(event) = stream.next().await.expect("event") {
        match event {
            ProcessOutput::Stdout(b) => out.extend(b),
            ProcessOutput::Ended(end) => {
                assert_eq!(end.shell_exit_code(), 0);
                break;
            }
            _ => {}
        }
    }
    assert_eq!(out, b"typed\n:v\n");

    // A PTY: keystrokes in, terminal output back, resize accepted, exit code of the shell.
    let spec = ProcessSpec {
        cmd: "/bin/bash".into(),
        args: vec!["--norc".into(), "-i".into()],
        envs: [("TERM".to_string(), "xterm".to_string())].into(),
        cwd: None,
        pty: Some((80, 24)),
        stdin: false,
    };
    let mut stream = envd.start(&spec).await.expect("pty start");
    let Some(ProcessOutput::Started { pid }) = stream.next().await.expect("event") else {
        panic!("first event is not Started");
    };
    envd.resize_pty(pid, 100, 30).await.expect("resize");
    envd.send_pty_input(pid, b"stty size; echo $((6*7))-pty; exit 4\n".to_vec())
        .await
        .expect("keys");
    let mut screen = Vec::new();
    let code = loop {
        match stream.next().await.expect("event") {
            Some(ProcessOutput::Pty(b)) => screen.extend(b),
            Some(ProcessOutput::Ended(end)) => break end.shell_exit_code(),
            Some(_) => {}
            None => panic!("no end event"),
        }
    };
    let screen = String::from_utf8_lossy(&screen);
    assert!(screen.contains("42-pty"), "{screen}");
    assert!(screen.contains("30 100"), "{screen}");
    assert_eq!(code, 4);

    // Files: write, read back, list, make a directory, remove.
    envd.write_file("/home/user/wt/notes.txt", b"hello\nfiles\n".to_vec())
        .await
        .expect("write");
    assert_eq!(
        &envd
            .read_file("/home/user/wt/notes.txt")
            .await
            .expect("read")[..],
        b"hello\nfiles\n"
    );
    envd.make_dir("/home/user/wt/sub").await.expect("mkdir");
    let mut names: Vec<String> = envd
        .list_dir("/home/user/wt", 1)
        .await
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(names, vec!["notes.txt", "sub"]);
    envd.remove("/home/user/wt/notes.txt")
        .await
        .expect("remove");
    let err = envd
        .read_file("/home/user/wt/notes.txt")
        .await
        .expect_err("gone");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let err = envd
        .list_dir("/home/user/wt-missing", 1)
        .await
        .expect_err("missing dir");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");

    api.kill_sandbox(&created.sandbox_id).await.expect("kill");
    harness.stop().await;
}
