//! Lazy restore through [`LinuxRuntime`]: the restored tree runs before its memory is all back, the
//! memory arrives intact under a memory limit close to what the sandbox holds, a pause right after a
//! resume waits for the transfer, a damaged page chunk ends the tree before it can run on it (and an
//! eager restore refuses the checkpoint outright), and a sandbox killed while its pages are still
//! arriving leaves no process or file behind. A checkpoint an older Warren wrote (format 1) restores.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use warren_runtime::checkpoint::pagemap::Pagemap;
use warren_runtime::checkpoint::Manifest;
use warren_runtime::supervisor::{pages_pending, RESTORE_FAILED_FILE};
use warren_runtime::{LinuxRuntime, LinuxRuntimeConfig, Resources, Runtime, RuntimeError, Sandbox};

/// Holds `MIB` MiB in which every page says which page it is; on SIGUSR1 it checks every page and
/// writes `ok` or the first bad page to /tmp/holder.check.
const HOLDER: &str = r#"
import os, signal, sys, time
mib = int(sys.argv[1])
pages = mib * 256
buf = bytearray(mib << 20)
def page(i):
    return i.to_bytes(8, "little") + bytes([i * 7 % 251]) * 4088
for i in range(pages):
    buf[i * 4096:(i + 1) * 4096] = page(i)
def check(*_):
    bad = next((i for i in range(pages) if buf[i * 4096:(i + 1) * 4096] != page(i)), None)
    with open("/tmp/holder.check.new", "w") as f:
        f.write("ok\n" if bad is None else f"bad page {bad}\n")
    os.rename("/tmp/holder.check.new", "/tmp/holder.check")
signal.signal(signal.SIGUSR1, check)
with open("/tmp/holder.pid", "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(3600)
"#;

fn runtime(name: &str, lazy: bool) -> common::TestRuntime {
    let config = LinuxRuntimeConfig {
        lazy_restore: lazy,
        ..common::config(name)
    };
    common::TestRuntime::from(LinuxRuntime::new(config).expect("runtime"))
}

fn resources(memory_mib: u64) -> Resources {
    Resources {
        memory_mib,
        ..common::resources()
    }
}

/// Starts the holder with `mib` MiB and waits until it has written all of them.
fn start_holder(sandbox: &Sandbox, mib: u64) {
    // The test agent takes one line per command: the script goes through printf, a line per word
    // (it holds no single quote).
    let lines: Vec<String> = HOLDER.lines().map(|l| format!("'{l}'")).collect();
    let (out, code) = common::exec(
        sandbox,
        &format!(
            "printf '%s\\n' {} > /tmp/holder.py && setsid python3 /tmp/holder.py {mib} >/dev/null 2>&1 < /dev/null &",
            lines.join(" ")
        ),
    );
    assert_eq!(code, 0, "{out}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while common::exec(sandbox, "test -s /tmp/holder.pid").1 != 0 {
        assert!(Instant::now() < deadline, "the holder never got ready");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asks the holder to check every page; returns what it found.
fn holder_check(sandbox: &Sandbox) -> String {
    let (out, code) = common::exec(
        sandbox,
        "rm -f /tmp/holder.check; kill -USR1 $(cat /tmp/holder.pid) && \
         for i in $(seq 1200); do test -e /tmp/holder.check && break; sleep 0.1; done; cat /tmp/holder.check",
    );
    assert_eq!(code, 0, "{out}");
    out.trim().to_string()
}

/// The processes of this test's state dir that belong to a lazy restore.
fn transfer_processes(state_dir: &Path) -> Vec<String> {
    let needle = state_dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&needle) && (c.contains("lazy-pages") || c.contains("serve-pages")))
        .collect()
}

/// Flips one byte in the middle of the largest lazily served run of pages.
fn damage_a_lazy_chunk(checkpoint: &Path) {
    let manifest = Manifest::read(checkpoint).unwrap();
    let mut best: Option<(u64, u64, u32)> = None;
    for file in manifest
        .images
        .iter()
        .filter(|f| f.name.starts_with("pagemap-"))
    {
        if file.name.starts_with("pagemap-shmem-") {
            continue;
        }
        let map = Pagemap::read(&checkpoint.join(&file.path)).unwrap();
        for entry in map.entries.iter().filter(|e| e.present() && e.lazy()) {
            if best.is_none_or(|(_, bytes, _)| entry.bytes() > bytes) {
                best = Some((entry.offset, entry.bytes(), map.pages_id));
            }
        }
    }
    let (offset, bytes, pages_id) = best.expect("a lazy run of pages");
    let name = format!("pages-{pages_id}.img");
    let stored = manifest.images.iter().find(|f| f.name == name).unwrap();
    let chunks = stored.chunks.as_ref().expect("a chunked page image");
    let index = ((offset + bytes / 2) / chunks.chunk_bytes) as usize;
    let at = chunks.stored[..index].iter().sum::<u64>() + chunks.stored[index] / 2;
    let path = checkpoint.join(&stored.path);
    let mut data = std::fs::read(&path).unwrap();
    data[at as usize] ^= 0x5a;
    std::fs::write(&path, data).unwrap();
}

/// Destroys the test's sandboxes even when an assertion fails midway.
struct Cleanup<'a>(&'a LinuxRuntime, Vec<&'static str>);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for id in &self.1 {
            let _ = self.0.destroy(id);
        }
    }
}

/// The logs of a failed lazy restore, for the failure report.
fn print_logs(runtime: &LinuxRuntime, id: &str) {
    let dir = runtime.config().state_dir.join("sandboxes").join(id);
    for log in [
        "supervisor.log",
        "restore/lazy-pages.log",
        "restore/restore.log",
    ] {
        let text = std::fs::read_to_string(dir.join(log)).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        println!(
            "== {log}\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

fn lazy_possible(runtime: &LinuxRuntime) -> bool {
    if !runtime.capabilities().checkpoint {
        println!("SKIP: CRIU does not work on this host (run scripts/setup)");
        return false;
    }
    true
}

#[test]
fn lazy_resume_under_memory_pressure_brings_back_every_page() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = runtime("lazy-mem", true);
    if !lazy_possible(&runtime) {
        return;
    }
    let id = "wt-lazy-mem";
    let _cleanup = Cleanup(&runtime, vec![id]);
    // 160 MiB held in a 200 MiB sandbox (the agent, python and the page cache share the rest).
    let spec = common::spec(id, vec![base], resources(200));
    let sandbox = runtime.create(&spec).expect("create");
    start_holder(&sandbox, 160);
    assert_eq!(holder_check(&sandbox), "ok");

    let snapshots = runtime.config().state_dir.join("snapshots");
    for cycle in 1..=3 {
        let dir = snapshots.join(format!("pause-{cycle}"));
        runtime.checkpoint(id, &dir, false).expect("pause");
        let manifest = Manifest::read(&dir).unwrap();
        assert_eq!(manifest.format, 2);
        let pages: Vec<_> = manifest
            .images
            .iter()
            .filter(|f| f.chunks.is_some())
            .collect();
        assert!(
            !pages.is_empty()
                && pages
                    .iter()
                    .all(|f| !f.zstd && f.name.starts_with("pages-")),
            "{pages:?}"
        );
        let resumed = runtime.restore(&dir, &spec).expect("lazy resume");
        if cycle == 2 {
            // Paused again at once: the dump waits for the last pages.
            std::fs::remove_dir_all(&dir).unwrap();
            let again = snapshots.join("pause-2b");
            if let Err(e) = runtime.checkpoint(id, &again, false) {
                print_logs(&runtime, id);
                panic!("pause right after resume: {e:?}");
            }
            runtime.restore(&again, &spec).expect("resume again");
            std::fs::remove_dir_all(&again).unwrap();
        } else {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        if let Err(e) = runtime.memory_settled(id) {
            print_logs(&runtime, id);
            panic!("cycle {cycle}: {e:?}");
        }
        let sandbox_dir = runtime.config().state_dir.join("sandboxes").join(id);
        assert!(!pages_pending(&sandbox_dir));
        assert!(transfer_processes(&runtime.config().state_dir).is_empty());
        assert_eq!(holder_check(&resumed), "ok", "cycle {cycle}");
    }
    runtime.destroy(id).expect("destroy");
    let left = common::leftovers(&runtime.config().state_dir, &[id.to_string()]);
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_damaged_page_chunk_ends_the_tree_and_keeps_the_checkpoint() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = runtime("lazy-bad", true);
    if !lazy_possible(&runtime) {
        return;
    }
    let id = "wt-lazy-bad";
    let _cleanup = Cleanup(&runtime, vec![id]);
    let spec = common::spec(id, vec![base], resources(256));
    let sandbox = runtime.create(&spec).expect("create");
    start_holder(&sandbox, 64);
    let dir = runtime.config().state_dir.join("snapshots").join("bad");
    runtime.checkpoint(id, &dir, false).expect("pause");
    damage_a_lazy_chunk(&dir);

    // Eagerly, the damage is found before anything runs: the restore fails, nothing is left.
    let eager = runtime_with_state_dir(&runtime, false);
    let refused = eager.restore(&dir, &spec);
    assert!(
        matches!(&refused, Err(e) if format!("{e:?}").contains("corrupt") && format!("{e:?}").contains("chunk")),
        "{refused:?}"
    );
    assert!(runtime.list().unwrap().iter().all(|s| s.id != id));

    // Lazily, the tree starts, and ends as soon as the damaged chunk is asked for.
    let restored = runtime.restore(&dir, &spec);
    let settled = runtime.memory_settled(id);
    let why = match (&restored, &settled) {
        (Ok(_), Err(e)) => e.to_string(),
        // The holder touched the page before the agent answered: the create itself failed.
        (Err(e), _) => format!("{e:?}"),
        (Ok(_), Ok(())) => panic!("a damaged checkpoint restored without complaint"),
    };
    assert!(why.contains("chunk"), "{why}");
    if restored.is_ok() {
        let sandbox_dir = runtime.config().state_dir.join("sandboxes").join(id);
        let recorded = std::fs::read_to_string(sandbox_dir.join(RESTORE_FAILED_FILE)).unwrap();
        assert!(recorded.contains("chunk"), "{recorded}");
        assert!(
            matches!(runtime.stats(id), Err(RuntimeError::NotFound(_))),
            "the tree is gone"
        );
    }
    assert!(transfer_processes(&runtime.config().state_dir).is_empty());
    assert!(dir.join("manifest.json").exists(), "the checkpoint is kept");
    let _ = runtime.destroy(id);
    let left = common::leftovers(&runtime.config().state_dir, &[id.to_string()]);
    assert!(left.is_empty(), "{left:?}");
}

/// A second runtime over the same state dir with lazy restore set as given.
fn runtime_with_state_dir(runtime: &LinuxRuntime, lazy: bool) -> LinuxRuntime {
    LinuxRuntime::new(LinuxRuntimeConfig {
        lazy_restore: lazy,
        ..runtime.config().clone()
    })
    .expect("second runtime")
}

#[test]
fn killing_a_sandbox_while_its_pages_arrive_leaves_nothing() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = runtime("lazy-kill", true);
    if !lazy_possible(&runtime) {
        return;
    }
    let id = "wt-lazy-kill";
    let _cleanup = Cleanup(&runtime, vec![id]);
    let spec = common::spec(id, vec![base], resources(640));
    let sandbox = runtime.create(&spec).expect("create");
    start_holder(&sandbox, 448);
    let dir = runtime.config().state_dir.join("snapshots").join("kill");
    runtime.checkpoint(id, &dir, false).expect("pause");
    runtime.restore(&dir, &spec).expect("lazy resume");
    let sandbox_dir = runtime.config().state_dir.join("sandboxes").join(id);
    assert!(
        pages_pending(&sandbox_dir),
        "448 MiB should still be on their way when the restore returns"
    );
    runtime.destroy(id).expect("destroy mid-transfer");
    assert!(
        transfer_processes(&runtime.config().state_dir).is_empty(),
        "{:?}",
        transfer_processes(&runtime.config().state_dir)
    );
    let left = common::leftovers(&runtime.config().state_dir, &[id.to_string()]);
    assert!(left.is_empty(), "{left:?}");
    assert!(dir.join("manifest.json").exists());
}

/// Rewrites a checkpoint as an older Warren wrote it (format 1): each page image one zstd stream,
/// every file with a whole-file SHA-256.
fn to_format_1(checkpoint: &Path) {
    use sha2::Digest;
    let mut manifest = Manifest::read(checkpoint).unwrap();
    for file in manifest.images.iter_mut() {
        let Some(chunks) = file.chunks.take() else {
            continue;
        };
        let stored = checkpoint.join(&file.path);
        let raw_path = checkpoint.join("images").join(&file.name);
        let raw = std::fs::File::create(&raw_path).unwrap();
        warren_runtime::checkpoint::page_chunks::ChunkedPages::open(
            &stored,
            &file.name,
            file.raw_bytes,
            &chunks,
        )
        .unwrap()
        .expand_all(&raw, 2)
        .unwrap();
        let packed = zstd::encode_all(std::fs::File::open(&raw_path).unwrap(), 1).unwrap();
        std::fs::remove_file(&raw_path).unwrap();
        std::fs::remove_file(&stored).unwrap();
        file.path = format!("images/{}.zst", file.name);
        std::fs::write(checkpoint.join(&file.path), &packed).unwrap();
        file.zstd = true;
        file.stored_bytes = packed.len() as u64;
        file.sha256 = hex::encode(sha2::Sha256::digest(&packed));
    }
    manifest.format = 1;
    std::fs::write(
        checkpoint.join("manifest.json"),
        manifest.to_json().unwrap(),
    )
    .unwrap();
}

#[test]
fn a_format_1_checkpoint_still_restores() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = runtime("lazy-old", true);
    if !lazy_possible(&runtime) {
        return;
    }
    let id = "wt-lazy-old";
    let _cleanup = Cleanup(&runtime, vec![id]);
    let spec = common::spec(id, vec![base], resources(256));
    let sandbox = runtime.create(&spec).expect("create");
    start_holder(&sandbox, 32);
    let dir = runtime.config().state_dir.join("snapshots").join("old");
    runtime.checkpoint(id, &dir, false).expect("pause");
    to_format_1(&dir);
    assert_eq!(Manifest::read(&dir).unwrap().format, 1);
    let resumed = runtime.restore(&dir, &spec).expect("restore format 1");
    runtime.memory_settled(id).expect("nothing pending");
    assert!(
        transfer_processes(&runtime.config().state_dir).is_empty(),
        "restored eagerly"
    );
    assert_eq!(holder_check(&resumed), "ok");
    runtime.destroy(id).expect("destroy");
}

/// A checkpoint with fewer pages than `LAZY_MIN_BYTES` is restored eagerly even with lazy restore
/// on; a copy under a new ID (template start, fork) goes through the image cache, which keeps the
/// pages expanded, so the next copy neither decompresses nor checks a chunk again.
#[test]
fn a_small_checkpoint_is_copied_eagerly_through_the_image_cache() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = runtime("lazy-small", true);
    if !lazy_possible(&runtime) {
        return;
    }
    let ids = ["wt-lazy-small", "wt-lazy-small-a", "wt-lazy-small-b"];
    let _cleanup = Cleanup(&runtime, ids.to_vec());
    let spec = common::spec(ids[0], vec![base.clone()], resources(256));
    let sandbox = runtime.create(&spec).expect("create");
    start_holder(&sandbox, 4);
    let dir = runtime.config().state_dir.join("snapshots").join("small");
    runtime.checkpoint(ids[0], &dir, true).expect("checkpoint");
    let manifest = Manifest::read(&dir).unwrap();
    let pages: Vec<_> = manifest
        .images
        .iter()
        .filter(|f| f.chunks.is_some())
        .collect();
    let page_bytes: u64 = pages.iter().map(|f| f.raw_bytes).sum();
    assert!(
        !pages.is_empty() && page_bytes < warren_runtime::checkpoint::lazy_pages::LAZY_MIN_BYTES,
        "{page_bytes} bytes of pages"
    );

    let copy_spec = common::spec(ids[1], vec![base.clone()], resources(256));
    let copy = runtime.restore(&dir, &copy_spec).expect("restore a copy");
    assert!(
        !pages_pending(&runtime.config().state_dir.join("sandboxes").join(ids[1])),
        "a small checkpoint was restored lazily"
    );
    assert_eq!(holder_check(&copy), "ok");

    // One cache entry, its page files the checkpoint's pages expanded.
    let cache = runtime.config().state_dir.join("cache").join("images");
    let entries: Vec<PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    for file in &pages {
        let expected = std::env::temp_dir().join(format!("wt-lazy-small-{}", file.name));
        let raw = std::fs::File::create(&expected).unwrap();
        raw.set_len(file.raw_bytes).unwrap();
        warren_runtime::checkpoint::page_chunks::ChunkedPages::open(
            &dir.join(&file.path),
            &file.name,
            file.raw_bytes,
            file.chunks.as_ref().unwrap(),
        )
        .unwrap()
        .expand_all(&raw, 2)
        .unwrap();
        let cached = std::fs::read(entries[0].join(&file.name)).unwrap();
        assert!(
            cached == std::fs::read(&expected).unwrap(),
            "the cached {} is not the expanded pages",
            file.name
        );
        let _ = std::fs::remove_file(&expected);
    }

    let second = common::spec(ids[2], vec![base], resources(256));
    let copy_b = runtime
        .restore(&dir, &second)
        .expect("restore from the cache");
    assert_eq!(holder_check(&copy_b), "ok");

    // A checkpoint that will not be started again (a fork's) takes its cache entries with it.
    let seeds = runtime.config().state_dir.join("cache").join("layers");
    let seeded = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".img"))
            .count()
    };
    assert_eq!(seeded(&seeds), 1, "the copies' seeded layer");
    runtime.forget_checkpoint(&dir);
    assert!(!entries[0].exists(), "the image cache entry is still there");
    assert_eq!(seeded(&seeds), 0, "the seeded layer is still there");
    assert!(
        dir.join("manifest.json").exists(),
        "the checkpoint itself stays"
    );
    for id in ids {
        runtime.destroy(id).expect("destroy");
    }
}
