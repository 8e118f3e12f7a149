//! Pause/resume cycles of a sandbox whose PID 1 counts into a file: after every restore the file holds
//! exactly what it held at the dump and the counter goes on from its value (the file stays a run of
//! consecutive integers). Real CRIU, real processes; every restore is lazy (the memory follows over
//! userfaultfd from the checking page server) and its transfer must end complete before the next dump.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod checkpoint_support;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use checkpoint_support::{wait_for, TestSandbox};

const COUNTER: &str = "i=0; while :; do i=$((i+1)); echo $i >> /counter; sleep 0.01; done";

fn cycles() -> usize {
    std::env::var("WARREN_CHECKPOINT_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// The counter file's numbers, checked to be 1, 2, 3, ... with no gap or restart.
fn consecutive(content: &str) -> Result<u64> {
    let mut expected = 1;
    for line in content.lines() {
        let n: u64 = line.parse().with_context(|| format!("line {line:?}"))?;
        ensure!(n == expected, "counter jumped from {} to {n}", expected - 1);
        expected += 1;
    }
    Ok(expected - 1)
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

#[test]
fn counter_continues_across_pause_resume_cycles() -> Result<()> {
    let _serial = checkpoint_support::serial();
    let Some(checkpointer) = checkpoint_support::prerequisites() else {
        return Ok(());
    };
    let mut sandbox = TestSandbox::prepare("cnt", 20)?;
    sandbox.launch(&[], COUNTER)?;
    wait_for("first counts", || {
        let text = std::fs::read_to_string(sandbox.layer_file("counter")).ok()?;
        (text.lines().count() >= 3).then_some(())
    })?;
    let store = sandbox.dir.join("checkpoints");
    let (mut dumps, mut restores, mut frozen) = (Vec::new(), Vec::new(), Vec::new());
    let mut previous: Option<std::path::PathBuf> = None;
    for cycle in 0..cycles() {
        let dest = store.join(format!("cycle-{cycle}"));
        // The last (lazy) restore brought every page back.
        sandbox
            .settle()
            .with_context(|| format!("transfer before dump {cycle}"))?;
        let dumped = checkpointer
            .dump(&sandbox.dump_target(), &dest, false)
            .with_context(|| format!("dump {cycle}"))?;
        // Pause leaves the tree frozen: the layer is final now.
        let at_dump = std::fs::read_to_string(sandbox.layer_file("counter"))?;
        let value = consecutive(&at_dump)?;
        dumps.push(dumped.timings.total);
        frozen.push(dumped.timings.frozen);

        sandbox.reset_for_restore()?;
        let restored = sandbox
            .restore(&checkpointer, &dest)
            .with_context(|| format!("restore {cycle}"))?;
        restores.push(restored.total);
        let after = wait_for("the restored counter to count", || {
            let text = std::fs::read_to_string(sandbox.layer_file("counter")).ok()?;
            (text.len() > at_dump.len()).then_some(text)
        })?;
        ensure!(
            after.starts_with(&at_dump),
            "cycle {cycle}: restored file differs from the dumped one"
        );
        let now = consecutive(&after).with_context(|| format!("cycle {cycle}"))?;
        ensure!(
            now > value,
            "cycle {cycle}: counter did not go on from {value}"
        );
        if let Some(old) = previous.replace(dest) {
            std::fs::remove_dir_all(old)?;
        }
    }
    println!(
        "{} cycles: dump p50 {:?} (frozen {:?}), restore p50 {:?}",
        dumps.len(),
        median(dumps),
        median(frozen),
        median(restores)
    );
    Ok(())
}
