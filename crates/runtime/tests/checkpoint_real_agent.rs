//! The real warren-agent as PID 1 survives pause/resume and fork (when WARREN_TEST_AGENT names it).

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use warren_runtime::{Runtime, Sandbox};

fn health(sandbox: &Sandbox) -> String {
    let mut stream =
        TcpStream::connect_timeout(&sandbox.agent_addr(), Duration::from_secs(5)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.lines().next().unwrap_or("").to_string()
}

#[test]
fn real_agent_pause_resume_and_fork() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let Some(agent) = std::env::var_os("WARREN_TEST_AGENT") else {
        println!("SKIP: WARREN_TEST_AGENT does not name the real warren-agent");
        return;
    };
    let _ = agent;
    let runtime = common::runtime("ckagent");
    if !runtime.capabilities().checkpoint {
        println!("SKIP: CRIU does not work on this host");
        return;
    }
    let _cleanup = common::DestroyOnDrop(
        &runtime,
        ["wt-ck-agent", "wt-ck-agent-f"].map(String::from).to_vec(),
    );
    let spec = common::spec("wt-ck-agent", vec![base.clone()], common::resources());
    let sandbox = runtime.create(&spec).expect("create");
    let before = health(&sandbox);
    assert!(before.contains(" 20"), "{before}");
    let snapshots = runtime.config().state_dir.join("snapshots");
    runtime
        .checkpoint(&spec.id, &snapshots.join("p"), false)
        .expect("pause");
    let resumed = runtime
        .restore(&snapshots.join("p"), &spec)
        .expect("resume");
    assert_eq!(health(&resumed), before);
    runtime
        .checkpoint(&spec.id, &snapshots.join("f"), true)
        .expect("fork checkpoint");
    let fork_spec = common::spec("wt-ck-agent-f", vec![base], common::resources());
    let fork = runtime
        .restore(&snapshots.join("f"), &fork_spec)
        .expect("fork");
    assert_eq!(health(&fork), before);
    assert_eq!(health(&resumed), before);
    runtime.destroy(&spec.id).expect("destroy");
    runtime.destroy(&fork_spec.id).expect("destroy fork");
    let _ = std::fs::remove_dir_all(&runtime.config().state_dir);
}
