//! The `warren` binary against a real Warren server, proxy and agent (host-mode agents instead of
//! namespaced sandboxes; see crates/client/tests/support/host_agent.rs): output, JSON, exit codes,
//! exec, the interactive shell on a real pseudo-terminal, and key management on the store.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

#[path = "../../client/tests/support/host_agent.rs"]
mod host_agent;

use std::io::{Read, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use host_agent::{start_server, Harness};

/// Bound on any one wait (not a speed assertion).
const WAIT: Duration = Duration::from_secs(120);

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn warren(harness: &Harness, args: &[&str], extra_env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_warren"));
    command
        .args(args)
        .env_remove("WARREN_API_KEY")
        .env_remove("WARREN_STATE_DIR")
        .env("E2B_API_URL", &harness.server.api_url)
        .env("E2B_SANDBOX_URL", &harness.server.sandbox_url)
        .env("E2B_API_KEY", &harness.server.api_key)
        .stdin(Stdio::null());
    for (key, value) in extra_env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(WAIT, command.output())
        .await
        .expect("warren finished")
        .expect("warren ran");
    Output {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn ok(output: Output) -> Output {
    assert_eq!(
        output.code, 0,
        "stdout: {}\nstderr: {}",
        output.stdout, output.stderr
    );
    output
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_str(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", output.stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_commands_tables_json_and_exit_codes() {
    let Some(harness) = start_server().await else {
        return;
    };
    let created = ok(warren(
        &harness,
        &[
            "sandbox",
            "create",
            "-m",
            "suite=wt-cli",
            "--timeout",
            "300",
        ],
        &[],
    )
    .await);
    let id = created.stdout.trim().to_string();
    assert!(
        !id.is_empty() && !id.contains(char::is_whitespace),
        "{:?}",
        created.stdout
    );

    let table = ok(warren(&harness, &["sandbox", "list"], &[]).await).stdout;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>()[..3],
        ["ID", "TEMPLATE", "STATE"],
        "{table}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with(&id) && line.contains("running")),
        "{table}"
    );

    let listed = json(&ok(warren(
        &harness,
        &["sandbox", "list", "--json", "-m", "suite=wt-cli"],
        &[],
    )
    .await));
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["sandboxID"], id.as_str());
    let none = json(&ok(warren(
        &harness,
        &["sandbox", "ls", "--json", "-m", "suite=other"],
        &[],
    )
    .await));
    assert_eq!(none, serde_json::json!([]));

    let detail = json(&ok(warren(
        &harness,
        &["sandbox", "get", &id, "--json"],
        &[],
    )
    .await));
    assert_eq!(detail["metadata"], serde_json::json!({ "suite": "wt-cli" }));

    // exec: streams, exit code passes through, --json collects.
    let ran = warren(
        &harness,
        &[
            "sandbox", "exec", &id, "--", "echo", "out;", "echo", "err", ">&2;", "exit", "7",
        ],
        &[],
    )
    .await;
    assert_eq!(
        (ran.code, ran.stdout.as_str(), ran.stderr.as_str()),
        (7, "out\n", "err\n")
    );
    let ran = json(
        &warren(
            &harness,
            &[
                "sandbox", "exec", &id, "--json", "-e", "WT=x", "--", "echo", "$WT",
            ],
            &[],
        )
        .await,
    );
    assert_eq!(
        ran,
        serde_json::json!({ "stdout": "x\n", "stderr": "", "exitCode": 0 })
    );

    // exec -i: local stdin reaches the command and is closed at its end.
    let mut piped = tokio::process::Command::new(env!("CARGO_BIN_EXE_warren"))
        .args(["sandbox", "exec", "-i", &id, "--", "wc", "-l"])
        .env("E2B_API_URL", &harness.server.api_url)
        .env("E2B_SANDBOX_URL", &harness.server.sandbox_url)
        .env("E2B_API_KEY", &harness.server.api_key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut input = piped.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut input, b"one\ntwo\nthree\n")
        .await
        .expect("write");
    drop(input);
    let counted = tokio::time::timeout(WAIT, piped.wait_with_output())
        .await
        .expect("done")
        .expect("ran");
    assert_eq!(String::from_utf8_lossy(&counted.stdout).trim(), "3");
    assert_eq!(counted.status.code(), Some(0));

    ok(warren(&harness, &["sandbox", "timeout", &id, "120"], &[]).await);
    ok(warren(&harness, &["sandbox", "pause", &id], &[]).await);
    assert_eq!(
        json(&ok(warren(
            &harness,
            &["sandbox", "get", &id, "--json"],
            &[]
        )
        .await))["state"],
        "paused"
    );
    ok(warren(&harness, &["sandbox", "resume", &id], &[]).await);
    assert_eq!(
        json(&ok(warren(
            &harness,
            &["sandbox", "get", &id, "--json"],
            &[]
        )
        .await))["state"],
        "running"
    );

    let templates = json(&ok(
        warren(&harness, &["template", "list", "--json"], &[]).await
    ));
    assert!(
        templates
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["templateID"] == "base")),
        "{templates}"
    );

    // Kill: one real, one unknown → the unknown one's exit code, the real one is still killed.
    let killed = warren(&harness, &["sandbox", "kill", &id, "wtnosuchsandbox"], &[]).await;
    assert_eq!(killed.code, 3, "{}", killed.stderr);
    assert!(
        killed.stdout.contains(&format!("{id}: killed")),
        "{}",
        killed.stdout
    );

    let gone = warren(&harness, &["sandbox", "get", &id], &[]).await;
    assert_eq!(gone.code, 3);
    assert!(
        gone.stderr.starts_with("warren: error: "),
        "{}",
        gone.stderr
    );
    let gone_json = warren(&harness, &["sandbox", "get", &id, "--json"], &[]).await;
    let error: serde_json::Value =
        serde_json::from_str(gone_json.stderr.trim()).expect("JSON error");
    assert_eq!(error["exitCode"], 3);

    let exec_gone = warren(&harness, &["sandbox", "exec", &id, "--", "true"], &[]).await;
    assert_eq!(exec_gone.code, 3, "{}", exec_gone.stderr);

    let bad_key = warren(
        &harness,
        &["sandbox", "list"],
        &[("E2B_API_KEY", "e2b_wt_wrong")],
    )
    .await;
    assert_eq!(bad_key.code, 4, "{}", bad_key.stderr);
    let unknown_template =
        warren(&harness, &["sandbox", "create", "wt-no-such-template"], &[]).await;
    assert_eq!(unknown_template.code, 3, "{}", unknown_template.stderr);
    let usage = warren(&harness, &["sandbox", "timeout", "x", "soon"], &[]).await;
    assert_eq!(usage.code, 2);
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_exits_6() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_warren"))
        .args([
            "sandbox",
            "list",
            "--api-url",
            &format!("http://{addr}"),
            "--api-key",
            "k",
        ])
        .output()
        .await
        .expect("ran");
    assert_eq!(
        output.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_runs_on_a_real_terminal() {
    let Some(harness) = start_server().await else {
        return;
    };
    let id = ok(warren(&harness, &["sandbox", "create"], &[]).await)
        .stdout
        .trim()
        .to_string();

    let pty = nix::pty::openpty(None, None).expect("openpty");
    let slave = std::fs::File::from(pty.slave);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_warren"))
        .args(["sandbox", "shell", &id, "--shell", "/bin/bash"])
        .env("E2B_API_URL", &harness.server.api_url)
        .env("E2B_SANDBOX_URL", &harness.server.sandbox_url)
        .env("E2B_API_KEY", &harness.server.api_key)
        .env("TERM", "xterm")
        .stdin(slave.try_clone().expect("dup"))
        .stdout(slave.try_clone().expect("dup"))
        .stderr(slave)
        .spawn()
        .expect("spawn shell");
    let mut master = std::fs::File::from(pty.master);
    let mut reader = master.try_clone().expect("dup master");
    let (chunks, received) = mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || chunks.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    master.write_all(b"echo $((6*7))-shell\r").expect("type");
    let mut screen = Vec::new();
    while !String::from_utf8_lossy(&screen).contains("42-shell") {
        match received.recv_timeout(WAIT) {
            Ok(chunk) => screen.extend(chunk),
            Err(_) => panic!(
                "no shell output; screen so far: {}",
                String::from_utf8_lossy(&screen)
            ),
        }
    }
    master.write_all(b"exit 3\r").expect("type");
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("shell exited")
        .expect("wait");
    assert_eq!(
        status.code(),
        Some(3),
        "screen: {}",
        String::from_utf8_lossy(&screen)
    );

    ok(warren(&harness, &["sandbox", "kill", &id], &[]).await);
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_created_listed_and_revoked_on_the_store() {
    let Some(harness) = start_server().await else {
        return;
    };
    let state = harness.server.state_dir().to_string_lossy().into_owned();
    let created = json(&ok(warren(
        &harness,
        &[
            "key",
            "create",
            "--name",
            "wt-ci",
            "--json",
            "--state-dir",
            &state,
        ],
        &[],
    )
    .await));
    let secret = created["key"].as_str().expect("key").to_string();
    let key_id = created["id"].as_str().expect("id").to_string();
    ok(warren(&harness, &["sandbox", "list"], &[("E2B_API_KEY", &secret)]).await);

    let listed = ok(warren(
        &harness,
        &["key", "list", "--json", "--state-dir", &state],
        &[],
    )
    .await);
    assert!(
        !listed.stdout.contains(&secret),
        "a secret leaked into the list"
    );
    let listed = json(&listed);
    assert!(listed.as_array().is_some_and(|keys| keys
        .iter()
        .any(|k| k["id"] == key_id.as_str() && k["name"] == "wt-ci")));
    let table = ok(warren(&harness, &["key", "list", "--state-dir", &state], &[]).await).stdout;
    assert!(
        table.starts_with("ID ") && table.contains("wt-ci"),
        "{table}"
    );

    ok(warren(
        &harness,
        &["key", "revoke", &key_id, "--state-dir", &state],
        &[],
    )
    .await);
    let refused = warren(&harness, &["sandbox", "list"], &[("E2B_API_KEY", &secret)]).await;
    assert_eq!(refused.code, 4, "{}", refused.stderr);
    let again = warren(
        &harness,
        &["key", "revoke", &key_id, "--state-dir", &state],
        &[],
    )
    .await;
    assert_eq!(again.code, 3, "{}", again.stderr);

    let nowhere = std::env::temp_dir().join(format!("wt-cli-no-state-{}", std::process::id()));
    let missing = warren(
        &harness,
        &["key", "list", "--state-dir", &nowhere.to_string_lossy()],
        &[],
    )
    .await;
    assert_eq!(missing.code, 1);
    assert!(
        missing.stderr.contains("no Warren state"),
        "{}",
        missing.stderr
    );
    assert!(
        !nowhere.exists(),
        "listing keys must not create a state directory"
    );
    harness.stop().await;
}
