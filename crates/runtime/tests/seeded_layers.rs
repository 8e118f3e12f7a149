//! Sandboxes started from a checkpoint under another ID (a template's, a fork's, a snapshot's) copy a
//! seeded image, unpacked once per checkpoint layer, instead of unpacking the layer each time: each
//! copy has the saved files and deletions and its own writes; a damaged layer fails the start and
//! leaves no seed; a symlink the sandbox saved is unpacked as a link, never written through; the fill's
//! mount is never seen on the host.
//!
//! Filesystem-only checkpoints keep these tests free of CRIU; a restore with memory takes the same
//! path (`create_layer` in the runtime).

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::path::{Path, PathBuf};

use warren_runtime::{LinuxRuntime, Runtime, RuntimeError};

/// The seeded images (`*.img`) and any fill leftovers (`.seed-*`) in the runtime's layer cache.
fn seed_cache(runtime: &LinuxRuntime) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let dir = runtime.config().state_dir.join("cache").join("layers");
    let mut images = Vec::new();
    let mut temps = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(".seed-") {
            temps.push(entry.path());
        } else if name.ends_with(".img") {
            images.push(entry.path());
        }
    }
    (images, temps)
}

/// A sandbox whose files differ from the base in every way a layer can: a new file, a deleted one, a
/// replaced directory (opaque), a symlink to a host directory; then saved files-only under `dest`.
fn saved_sandbox(runtime: &LinuxRuntime, base: &Path, id: &str, dest: &Path, victim: &Path) {
    let spec = common::spec(id, vec![base.to_path_buf()], common::resources());
    let sandbox = runtime.create(&spec).expect("create");
    let script = format!(
        "echo kept > /root/note && rm /etc/motd && rm -rf /etc/apt && mkdir /etc/apt && \
         echo new > /etc/apt/only && ln -s {} /root/out && echo done",
        victim.display()
    );
    let (out, code) = common::exec(&sandbox, &script);
    assert_eq!((out.as_str(), code), ("done\n", 0));
    runtime
        .checkpoint_disk(id, dest, false)
        .expect("filesystem checkpoint");
}

#[test]
fn copies_of_one_checkpoint_share_one_seeded_layer_and_keep_their_own_writes() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("seeded");
    let _cleanup = common::DestroyOnDrop(
        &runtime,
        ["wt-seed-src", "wt-seed-a", "wt-seed-b"]
            .map(String::from)
            .to_vec(),
    );
    let victim = runtime.config().state_dir.join("host-victim");
    std::fs::create_dir_all(&victim).unwrap();
    let dest = runtime.config().state_dir.join("saved").join("wt-seed-src");
    saved_sandbox(&runtime, &base, "wt-seed-src", &dest, &victim);
    assert!(seed_cache(&runtime).0.is_empty(), "nothing seeded yet");

    let copies: Vec<_> = ["wt-seed-a", "wt-seed-b"]
        .iter()
        .map(|id| {
            let spec = common::spec(id, vec![base.clone()], common::resources());
            runtime.boot_from_disk(&dest, &spec).expect("boot a copy")
        })
        .collect();
    let (images, temps) = seed_cache(&runtime);
    assert_eq!(images.len(), 1, "one seed for both copies: {images:?}");
    assert!(temps.is_empty(), "fill leftovers: {temps:?}");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mountinfo.contains("cache/layers"),
        "a seed's mount shows on the host"
    );
    assert!(
        warren_runtime::rootfs::loop_device::devices_backed_under(
            &runtime.config().state_dir.join("cache")
        )
        .is_empty(),
        "a seed is still attached to a loop device"
    );

    for (copy, id) in copies.iter().zip(["wt-seed-a", "wt-seed-b"]) {
        let (out, code) = common::exec(
            copy,
            "cat /root/note; test -e /etc/motd; echo motd=$?; ls /etc/apt; \
             readlink /root/out; hostname",
        );
        assert_eq!(code, 0, "{out}");
        assert_eq!(
            out,
            format!("kept\nmotd=1\nonly\n{}\n{id}\n", victim.display()),
            "files, deletions, the replaced dir and the link come back; the name is the copy's"
        );
    }
    // The link was unpacked as a link: nothing was written into the host directory it names.
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);

    // Each copy writes into its own disk, never into the seed or the other copy.
    common::exec(&copies[0], "echo a > /root/note && echo a > /root/only-a");
    let (out, _) = common::exec(&copies[1], "cat /root/note; ls /root/only-a 2>&1 | wc -l");
    assert_eq!(out, "kept\n1\n");
    let third = common::spec("wt-seed-src", vec![base.clone()], common::resources());
    runtime.destroy("wt-seed-src").ok();
    let again = runtime.boot_from_disk(&dest, &third).expect("boot again");
    let (out, _) = common::exec(&again, "cat /root/note");
    assert_eq!(out, "kept\n", "the saved layer is as it was saved");

    for id in ["wt-seed-src", "wt-seed-a", "wt-seed-b"] {
        runtime.destroy(id).expect("destroy");
    }
    let ids: Vec<String> = ["wt-seed-src", "wt-seed-a", "wt-seed-b"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let left = common::leftovers(&runtime.config().state_dir, &ids);
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_damaged_layer_fails_the_copy_and_leaves_no_seed() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("seedbad");
    let _cleanup = common::DestroyOnDrop(
        &runtime,
        ["wt-seedbad-src", "wt-seedbad-a"]
            .map(String::from)
            .to_vec(),
    );
    let victim = runtime.config().state_dir.join("host-victim");
    std::fs::create_dir_all(&victim).unwrap();
    let dest = runtime
        .config()
        .state_dir
        .join("saved")
        .join("wt-seedbad-src");
    saved_sandbox(&runtime, &base, "wt-seedbad-src", &dest, &victim);
    let manifest = warren_runtime::checkpoint::Manifest::read(&dest).expect("manifest");
    let archive = dest.join(&manifest.layer.path);
    let mut bytes = std::fs::read(&archive).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&archive, bytes).unwrap();

    let spec = common::spec("wt-seedbad-a", vec![base], common::resources());
    let result = runtime.boot_from_disk(&dest, &spec);
    let message = match result {
        Err(RuntimeError::Internal {
            context,
            source: Some(source),
        }) => format!("{context}: {source}"),
        other => panic!("a damaged layer booted: {other:?}"),
    };
    assert!(message.contains("corrupt"), "{message}");
    let (images, temps) = seed_cache(&runtime);
    assert!(
        images.is_empty() && temps.is_empty(),
        "{images:?} {temps:?}"
    );
    let ids = ["wt-seedbad-a".to_string()];
    runtime.destroy("wt-seedbad-src").ok();
    let left = common::leftovers(&runtime.config().state_dir, &ids);
    assert!(left.is_empty(), "{left:?}");
}
