//! A background HTTP server keeps serving after pause/resume, and the faults: a failed dump (CRIU
//! refusing, or the layer archive failing after CRIU succeeded) leaves the sandbox running as it was and
//! no checkpoint behind; a failed restore (corrupt checkpoint, or CRIU failing) leaves the checkpoint
//! intact for a later restore that works.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod checkpoint_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use checkpoint_support::{wait_for, TestSandbox};
use warren_runtime::checkpoint::{CheckpointError, DumpTarget};

fn http_get(sandbox: &TestSandbox, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect_timeout(&sandbox.addr(8080), Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: sandbox\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    ensure!(
        response.starts_with("HTTP/1.0 200"),
        "GET {path}: {}",
        response.lines().next().unwrap_or("")
    );
    Ok(response.split("\r\n\r\n").nth(1).unwrap_or("").to_string())
}

const SERVER: &str = "cd /srv && python3 -m http.server 8080 --bind 0.0.0.0 & \
                      i=0; while :; do i=$((i+1)); echo $i > /srv/count.txt; sleep 0.01; done";

/// The loop's latest value (retried: the file is rewritten all the time and may be caught empty).
fn count(sandbox: &TestSandbox) -> Result<u64> {
    wait_for("a readable count", || {
        http_get(sandbox, "/count.txt").ok()?.trim().parse().ok()
    })
}

#[test]
fn http_server_keeps_serving_after_resume() -> Result<()> {
    let _serial = checkpoint_support::serial();
    let Some(checkpointer) = checkpoint_support::prerequisites() else {
        return Ok(());
    };
    let mut sandbox = TestSandbox::prepare("web", 40)?;
    sandbox.launch(
        &[("/srv/index.html", "hello from before the pause\n")],
        SERVER,
    )?;
    sandbox.wait_port(8080)?;
    ensure!(http_get(&sandbox, "/index.html")? == "hello from before the pause\n");
    let before = count(&sandbox)?;

    let checkpoint = sandbox.dir.join("checkpoints/pause");
    checkpointer.dump(&sandbox.dump_target(), &checkpoint, false)?;
    sandbox.reset_for_restore()?;
    sandbox.restore(&checkpointer, &checkpoint)?;
    // The listening socket came back with the process: the very first connection is answered.
    ensure!(http_get(&sandbox, "/index.html")? == "hello from before the pause\n");
    let after = wait_for("the loop to count on", || {
        count(&sandbox).ok().filter(|n| *n > before)
    })?;
    println!("count before pause {before}, after resume {after}");
    Ok(())
}

#[test]
fn failed_dump_leaves_the_sandbox_running() -> Result<()> {
    let _serial = checkpoint_support::serial();
    let Some(checkpointer) = checkpoint_support::prerequisites() else {
        return Ok(());
    };
    let mut sandbox = TestSandbox::prepare("dumpfail", 41)?;
    // perf_event fds are one of the things CRIU cannot dump.
    let perf = "import ctypes, time\nattr = (ctypes.c_uint32 * 32)(); attr[0] = 1; attr[1] = 64\n\
                fd = ctypes.CDLL(None).syscall(298, attr, 0, -1, -1, 0)\nopen('/perf-fd', 'w').write(str(fd))\ntime.sleep(1e6)\n";
    sandbox.launch(
        &[("/srv/index.html", "still here\n"), ("/perf.py", perf)],
        &format!("python3 /perf.py & {SERVER}"),
    )?;
    sandbox.wait_port(8080)?;
    wait_for("the perf fd", || {
        std::fs::read_to_string(sandbox.layer_file("perf-fd"))
            .ok()
            .filter(|s| !s.is_empty())
    })?;

    let dest = sandbox.dir.join("checkpoints/refused");
    let err = checkpointer
        .dump(&sandbox.dump_target(), &dest, false)
        .expect_err("CRIU cannot dump a perf_event fd");
    ensure!(
        matches!(err, CheckpointError::Criu { action: "dump", .. }),
        "{err}"
    );
    ensure!(
        err.to_string().contains("perf_event"),
        "the error names the cause: {err}"
    );
    ensure!(
        !dest.exists(),
        "no checkpoint directory after a failed dump"
    );
    ensure!(!sandbox.freezer().is_frozen()?, "sandbox left frozen");
    let n = count(&sandbox)?;
    wait_for("the sandbox to keep counting", || {
        count(&sandbox).ok().filter(|m| *m > n)
    })?;

    // Without the perf fd CRIU succeeds; then saving the layer fails: the sandbox must run on all the same.
    for pid in sandbox.procs() {
        if std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.starts_with("python3\0/perf.py"))
        {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            )?;
        }
    }
    wait_for("perf.py to be gone", || {
        (!sandbox.procs().iter().any(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.starts_with("python3\0/perf.py"))
        }))
        .then_some(())
    })?;
    let missing_upper = sandbox.dir.join("no-such-upper");
    let broken = DumpTarget {
        upper: &missing_upper,
        ..sandbox.dump_target()
    };
    let err = checkpointer
        .dump(&broken, &dest, false)
        .expect_err("no layer to archive");
    ensure!(matches!(err, CheckpointError::Layer(_)), "{err}");
    ensure!(!dest.exists() && !sandbox.freezer().is_frozen()?);
    ensure!(http_get(&sandbox, "/index.html")? == "still here\n");
    Ok(())
}

#[test]
fn failed_restore_leaves_the_checkpoint_intact() -> Result<()> {
    let _serial = checkpoint_support::serial();
    let Some(checkpointer) = checkpoint_support::prerequisites() else {
        return Ok(());
    };
    let mut sandbox = TestSandbox::prepare("restfail", 42)?;
    sandbox.launch(&[("/srv/index.html", "restored at last\n")], SERVER)?;
    sandbox.wait_port(8080)?;
    let checkpoint = sandbox.dir.join("checkpoints/pause");
    checkpointer.dump(&sandbox.dump_target(), &checkpoint, false)?;
    let files_before = snapshot_of(&checkpoint)?;

    // A corrupt copy is refused before anything runs.
    let copy = sandbox.dir.join("checkpoints/corrupt");
    copy_dir(&checkpoint, &copy)?;
    let layer = copy.join("layer.tar.zst");
    let mut bytes = std::fs::read(&layer)?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&layer, bytes)?;
    sandbox.reset_for_restore()?;
    let err = sandbox
        .restore(&checkpointer, &copy)
        .expect_err("corrupt layer");
    ensure!(
        err.downcast_ref::<CheckpointError>()
            .is_some_and(|e| matches!(e, CheckpointError::Corrupt(_))),
        "{err:#}"
    );

    // CRIU itself fails (the agent binary to bind is missing): nothing runs, the checkpoint is unchanged.
    sandbox.reset_for_restore()?;
    sandbox.agent = sandbox.dir.join("no-such-agent");
    let err = sandbox
        .restore(&checkpointer, &checkpoint)
        .expect_err("missing agent binary");
    ensure!(
        err.downcast_ref::<CheckpointError>()
            .is_some_and(|e| matches!(
                e,
                CheckpointError::Criu {
                    action: "restore",
                    ..
                }
            )),
        "{err:#}"
    );
    // CRIU kills what it had started; the last of it may take a moment to exit.
    wait_for("the failed restore's processes to exit", || {
        sandbox.procs().is_empty().then_some(())
    })?;
    ensure!(
        snapshot_of(&checkpoint)? == files_before,
        "the checkpoint changed"
    );

    // And it still restores.
    sandbox.reset_for_restore()?;
    sandbox.agent = checkpoint_support::AGENT_STAND_IN.into();
    sandbox
        .restore(&checkpointer, &checkpoint)
        .context("restore after the failures")?;
    ensure!(http_get(&sandbox, "/index.html")? == "restored at last\n");
    Ok(())
}

/// Names, sizes and contents of every file under `dir`.
fn snapshot_of(dir: &std::path::Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push((
                    path.strip_prefix(dir)?.display().to_string(),
                    std::fs::read(&path)?,
                ));
            }
        }
    }
    files.sort();
    Ok(files)
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> Result<()> {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()?;
    ensure!(status.success(), "cp -a {}", from.display());
    Ok(())
}
