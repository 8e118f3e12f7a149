//! Fork: one checkpoint of a running Python process holding a list, restored five times at new
//! addresses; each copy is mutated differently and diverges, the original keeps running. The process
//! also holds a loopback TCP connection, a pipe, a PTY and an interval timer, which must all work in
//! every copy.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod checkpoint_support;

use anyhow::{ensure, Context, Result};
use checkpoint_support::{TestSandbox, HOLDER_PY};
use serde_json::Value;

fn ask(sandbox: &TestSandbox, line: &str) -> Result<Value> {
    let answer = sandbox
        .ask(7000, line)
        .with_context(|| format!("{} asked {line:?}", sandbox.id))?;
    serde_json::from_str(&answer).with_context(|| format!("answer {answer:?}"))
}

fn list_of(answer: &Value) -> Vec<String> {
    answer["data"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|v| v.to_string().trim_matches('"').to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn check_resources(answer: &Value, who: &str) -> Result<()> {
    ensure!(
        answer["tcp"] == "ping",
        "{who}: loopback TCP answered {}",
        answer["tcp"]
    );
    ensure!(answer["pipe"] == "x", "{who}: pipe gave {}", answer["pipe"]);
    ensure!(
        answer["pty"].as_str().is_some_and(|s| s.contains("hello")),
        "{who}: pty gave {}",
        answer["pty"]
    );
    Ok(())
}

#[test]
fn five_forks_of_a_python_list_diverge() -> Result<()> {
    let _serial = checkpoint_support::serial();
    let Some(checkpointer) = checkpoint_support::prerequisites() else {
        return Ok(());
    };
    let mut original = TestSandbox::prepare("fork-orig", 30)?;
    original.launch(
        &[("/wl/holder.py", HOLDER_PY)],
        "python3 /wl/holder.py & wait",
    )?;
    original.wait_port(7000)?;
    let first = ask(&original, "append base")?;
    ensure!(
        first["pipe"] == "in-flightx",
        "pipe in flight: {}",
        first["pipe"]
    );

    let checkpoint = original.dir.join("checkpoints/fork");
    let dumped = checkpointer.dump(&original.dump_target(), &checkpoint, true)?;
    println!(
        "fork checkpoint: {} bytes, sandbox frozen {:?}",
        dumped.info.size_bytes, dumped.timings.frozen
    );
    ensure!(
        !original.freezer().is_frozen()?,
        "leave_running must thaw the original"
    );
    let after = ask(&original, "append original")?;
    ensure!(
        list_of(&after) == ["1", "2", "3", "base", "original"],
        "original: {after}"
    );

    let mut forks = Vec::new();
    for n in 0..5u8 {
        let mut fork = TestSandbox::prepare(&format!("fork-{n}"), 31 + n)?;
        let restored = fork
            .restore(&checkpointer, &checkpoint)
            .with_context(|| format!("restore fork {n}"))?;
        ensure!(restored.manifest.sandbox_id == "fork-orig");
        println!("fork {n}: restored in {:?} at {}", restored.total, fork.ip);
        forks.push(fork);
    }
    for (n, fork) in forks.iter().enumerate() {
        fork.wait_port(7000)?;
        let answer = ask(fork, &format!("append fork-{n}"))?;
        check_resources(&answer, &fork.id)?;
        ensure!(
            list_of(&answer) == ["1", "2", "3", "base", &format!("fork-{n}")],
            "{}: {answer}",
            fork.id
        );
    }
    // Second mutation: every copy still has only its own changes.
    for (n, fork) in forks.iter().enumerate() {
        let answer = ask(fork, &format!("append again-{n}"))?;
        ensure!(
            list_of(&answer)
                == [
                    "1",
                    "2",
                    "3",
                    "base",
                    &format!("fork-{n}"),
                    &format!("again-{n}")
                ],
            "{}: {answer}",
            fork.id
        );
        ensure!(
            answer["ticks"].as_u64().unwrap_or(0) >= first["ticks"].as_u64().unwrap_or(0),
            "timer went backwards"
        );
    }
    let last = ask(&original, "get")?;
    check_resources(&last, "original")?;
    ensure!(
        list_of(&last) == ["1", "2", "3", "base", "original"],
        "original changed: {last}"
    );
    Ok(())
}
