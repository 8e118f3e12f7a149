//! What fills a sandbox's writable layer: its largest files, found by walking the layer from the host.
//!
//! The layer is written by the sandbox's root, so the walk goes through [`ConfinedDir`]: every entry is
//! looked at with `fstatat(AT_SYMLINK_NOFOLLOW)` below a directory fd we hold, and a directory is
//! entered with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | …)`. A symlink is never followed (it
//! counts as nothing), and a directory swapped for a symlink between listing and entering is refused by
//! the kernel and skipped. The walk stops after a budget of entries, so a layer of millions of small
//! files costs a bounded amount of work.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};

use crate::confined::{ConfinedDir, ConfinedError, EntryKind};

/// One large file: its path as the sandbox sees it (`/tmp/big.bin`) and the bytes it occupies.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LargeFile {
    pub path: PathBuf,
    pub bytes: u64,
}

/// The `count` largest regular files under `root` by allocated bytes, largest first, looking at no
/// more than `budget` entries. `root` is a trusted host path (the layer's upper directory).
pub fn largest_files(
    root: &Path,
    count: usize,
    budget: usize,
) -> Result<Vec<LargeFile>, ConfinedError> {
    let mut pending = vec![(ConfinedDir::open_root(root)?, PathBuf::from("/"))];
    // A min-heap of the `count` largest seen so far.
    let mut largest: BinaryHeap<Reverse<(u64, PathBuf)>> = BinaryHeap::new();
    let mut seen = 0usize;
    while let Some((dir, inside)) = pending.pop() {
        // A directory that cannot be listed (removed meanwhile) is skipped, not an error of the walk.
        let Ok(names) = dir.entries() else {
            continue;
        };
        for name in names {
            seen += 1;
            if seen > budget {
                return Ok(sorted(largest));
            }
            let rel = Path::new(&name);
            let Ok(stat) = dir.stat(rel) else {
                continue;
            };
            match EntryKind::of(&stat) {
                EntryKind::Dir => {
                    if let Ok(child) = dir.open_dir(rel) {
                        pending.push((child, inside.join(&name)));
                    }
                }
                EntryKind::File => {
                    let bytes = u64::try_from(stat.st_blocks).unwrap_or(0) * 512;
                    largest.push(Reverse((bytes, inside.join(&name))));
                    if largest.len() > count {
                        largest.pop();
                    }
                }
                EntryKind::Symlink | EntryKind::Special => {}
            }
        }
    }
    Ok(sorted(largest))
}

fn sorted(heap: BinaryHeap<Reverse<(u64, PathBuf)>>) -> Vec<LargeFile> {
    let mut files: Vec<LargeFile> = heap
        .into_iter()
        .map(|Reverse((bytes, path))| LargeFile { path, bytes })
        .collect();
    files.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.path.cmp(&b.path)));
    files
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn write(path: &Path, bytes: usize) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut file = std::fs::File::create(path).unwrap();
        file.write_all(&vec![7u8; bytes]).unwrap();
        file.sync_all().unwrap();
    }

    #[test]
    fn the_largest_files_come_first_with_their_paths_inside_the_sandbox() {
        let layer = tempfile::tempdir().unwrap();
        write(&layer.path().join("tmp/big.bin"), 1 << 20);
        write(&layer.path().join("home/user/mid.txt"), 256 << 10);
        write(&layer.path().join("etc/small"), 10);
        let found = largest_files(layer.path(), 2, 1000).unwrap();
        let paths: Vec<_> = found.iter().map(|f| f.path.clone()).collect();
        assert_eq!(
            paths,
            [
                PathBuf::from("/tmp/big.bin"),
                PathBuf::from("/home/user/mid.txt")
            ]
        );
        assert!(found[0].bytes >= 1 << 20, "{found:?}");
    }

    #[test]
    fn symlinks_out_of_the_layer_are_never_followed() {
        let layer = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        write(&host.path().join("secret/huge"), 2 << 20);
        write(&layer.path().join("own"), 4096);
        std::os::unix::fs::symlink(host.path(), layer.path().join("escape")).unwrap();
        std::os::unix::fs::symlink(host.path().join("secret/huge"), layer.path().join("f"))
            .unwrap();
        let found = largest_files(layer.path(), 10, 1000).unwrap();
        assert_eq!(
            found.iter().map(|f| f.path.clone()).collect::<Vec<_>>(),
            [PathBuf::from("/own")],
            "only the layer's own file: {found:?}"
        );
    }

    #[test]
    fn the_walk_stops_at_its_budget() {
        let layer = tempfile::tempdir().unwrap();
        for i in 0..50 {
            write(&layer.path().join(format!("d/f{i}")), 4096);
        }
        let found = largest_files(layer.path(), 100, 10).unwrap();
        assert!(
            found.len() < 10,
            "{} files after a budget of 10",
            found.len()
        );
    }
}
