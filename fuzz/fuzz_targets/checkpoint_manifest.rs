//! The checkpoint manifest reader on arbitrary bytes (a checkpoint on disk may be damaged or
//! planted): an error, or a manifest whose every file is a plain relative path inside the checkpoint.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_runtime::checkpoint::Manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(manifest) = Manifest::from_json(data) {
        for file in manifest.images.iter().chain([&manifest.layer]) {
            for name in [&file.path, &file.name] {
                assert!(!name.is_empty() && !name.starts_with('/'), "{name:?}");
                assert!(
                    name.split('/')
                        .all(|p| !p.is_empty() && p != ".." && p != "."),
                    "{name:?}"
                );
            }
            assert!(!file.name.contains('/'));
        }
    }
});
