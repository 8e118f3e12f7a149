//! Unpacking an uploaded build context (tar or gzipped tar) from arbitrary bytes: an error, or a tree
//! whose every entry lies inside the destination and is a file, directory or symlink (never a device
//! node or FIFO), and nothing written outside it.
#![no_main]

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use warren_server::templates::build::uploads::unpack_archive;

fn check_tree(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read the unpacked tree") {
        let entry = entry.expect("entry");
        let kind = entry.file_type().expect("file type");
        assert!(
            !(kind.is_block_device()
                || kind.is_char_device()
                || kind.is_fifo()
                || kind.is_socket()),
            "special file {:?} unpacked",
            entry.path()
        );
        if kind.is_dir() {
            check_tree(&entry.path());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let scratch = tempfile::tempdir().expect("scratch dir");
    let archive = scratch.path().join("upload.tar");
    std::fs::write(&archive, data).expect("write the archive");
    let dest = scratch.path().join("dest");
    std::fs::create_dir(&dest).expect("dest");
    let _ = unpack_archive(&archive, &dest, "fuzz");
    // Nothing but the archive and the destination beside it.
    let mut names: Vec<_> = std::fs::read_dir(scratch.path())
        .expect("scratch")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["dest", "upload.tar"]);
    check_tree(&dest);
});
