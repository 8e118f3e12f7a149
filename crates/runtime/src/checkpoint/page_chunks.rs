//! The memory-page images of a checkpoint in independent chunks, so that a restore can fetch, unpack
//! and check only the part of a page file it is about to hand out instead of the whole file before
//! anything runs ("seekable" compression).
//!
//! A page image `pages-<n>.img` is cut into 256 KiB chunks; each is stored zstd-compressed (level 1,
//! one frame per chunk) when that saves at least a tenth, else raw, one after the other in
//! `pages-<n>.img.chunks`. The manifest lists every chunk's stored length (equal to its raw length:
//! stored raw) and the XXH3-128 of its raw bytes, checked after unpacking, so damage to the stored
//! bytes and a wrong decode are both caught.
//!
//! XXH3-128 because what it guards against is damage (a flipped bit on disk, a truncated copy), not
//! an attacker who can write the checkpoint directory (who could rewrite the manifest as well): a
//! non-cryptographic hash is enough, and at ~10 GB/s it costs the pause and the restore almost
//! nothing. 256 KiB keeps the manifest small (two short entries per chunk: ~100 KB for 500 MiB) while
//! a page fault whose chunk is not unpacked yet waits for 64 pages only.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::CheckpointError;

/// Bytes per chunk of a page image (the last chunk of a file may be shorter).
pub const CHUNK_BYTES: u64 = 256 * 1024;
/// The suffix of a stored, chunked page image.
pub const STORED_SUFFIX: &str = ".chunks";
/// A chunk stays compressed only when that saves at least a tenth.
const KEEP_COMPRESSED_RATIO: f64 = 0.9;
const ZSTD_LEVEL: i32 = 1;
/// Unpacked chunks a reader keeps (CRIU asks for the pages of one chunk in several requests).
const CACHED_CHUNKS: usize = 4;

/// How one page image is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageChunks {
    /// Raw size of every chunk but the last.
    pub chunk_bytes: u64,
    /// XXH3-128 of each chunk's raw bytes, in file order, hex.
    pub xxh3_128: Vec<String>,
    /// Stored length of each chunk; equal to its raw length when stored raw.
    pub stored: Vec<u64>,
}

impl PageChunks {
    /// Checks that the lists describe a raw file of `raw` bytes stored in `stored` bytes.
    pub fn fits(&self, raw: u64, stored: u64) -> bool {
        self.chunk_bytes > 0
            && self.chunk_bytes.is_multiple_of(4096)
            && self.xxh3_128.len() as u64 == raw.div_ceil(self.chunk_bytes)
            && self.stored.len() == self.xxh3_128.len()
            && self.stored.iter().sum::<u64>() == stored
            && (0..self.stored.len()).all(|i| self.stored[i] <= self.raw_len(i, raw))
    }

    fn raw_len(&self, index: usize, raw: u64) -> u64 {
        self.chunk_bytes.min(raw - index as u64 * self.chunk_bytes)
    }

    /// Indexes of the chunks that hold any byte of `offset..offset + len`.
    pub fn covering(&self, offset: u64, len: u64) -> std::ops::Range<usize> {
        if len == 0 {
            return 0..0;
        }
        let first = offset / self.chunk_bytes;
        let last = (offset + len - 1) / self.chunk_bytes;
        first as usize..last as usize + 1
    }
}

fn io_err(context: String) -> impl FnOnce(std::io::Error) -> CheckpointError {
    move |source| CheckpointError::Io { context, source }
}

fn hash_hex(bytes: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes))
}

/// Stores the raw page image `raw` as chunks in `stored`; returns the chunk list, the raw and the
/// stored size. `stored` is written but not synced (the checkpoint's commit syncs everything).
pub fn pack(raw: &Path, stored: &Path) -> Result<(PageChunks, u64, u64), CheckpointError> {
    let input = File::open(raw).map_err(io_err(format!("open {}", raw.display())))?;
    let raw_bytes = input
        .metadata()
        .map_err(io_err(format!("stat {}", raw.display())))?
        .len();
    let mut output = std::io::BufWriter::with_capacity(
        1 << 20,
        File::create(stored).map_err(io_err(format!("create {}", stored.display())))?,
    );
    let mut compressor =
        zstd::bulk::Compressor::new(ZSTD_LEVEL).map_err(io_err("zstd compressor".into()))?;
    let mut buf = vec![0u8; CHUNK_BYTES as usize];
    let count = raw_bytes.div_ceil(CHUNK_BYTES) as usize;
    let (mut sums, mut lengths) = (Vec::with_capacity(count), Vec::with_capacity(count));
    let mut stored_bytes = 0;
    let mut offset = 0;
    while offset < raw_bytes {
        let len = CHUNK_BYTES.min(raw_bytes - offset) as usize;
        let chunk = &mut buf[..len];
        input
            .read_exact_at(chunk, offset)
            .map_err(io_err(format!("read {}", raw.display())))?;
        sums.push(hash_hex(chunk));
        let packed = compressor.compress(chunk).map_err(io_err("zstd".into()))?;
        let keep = (packed.len() as f64) < len as f64 * KEEP_COMPRESSED_RATIO;
        let bytes: &[u8] = if keep { &packed } else { chunk };
        output
            .write_all(bytes)
            .map_err(io_err(format!("write {}", stored.display())))?;
        lengths.push(bytes.len() as u64);
        stored_bytes += bytes.len() as u64;
        offset += len as u64;
    }
    output
        .into_inner()
        .map_err(|e| io_err(format!("write {}", stored.display()))(e.into_error()))?;
    Ok((
        PageChunks {
            chunk_bytes: CHUNK_BYTES,
            xxh3_128: sums,
            stored: lengths,
        },
        raw_bytes,
        stored_bytes,
    ))
}

/// A stored page image opened for checked reads: a chunk is read, unpacked and its sum compared with
/// the manifest's the first time any byte of it is wanted; a chunk that does not match fails the read.
#[derive(Debug)]
pub struct ChunkedPages {
    file: File,
    name: String,
    raw_bytes: u64,
    sums: PageChunks,
    /// Where each chunk starts in the stored file.
    offsets: Vec<u64>,
    /// Recently unpacked chunks, most recent last.
    cache: Vec<(usize, Vec<u8>)>,
}

impl ChunkedPages {
    /// Opens the stored file `path` of page image `name` (for messages) with `raw_bytes` raw bytes.
    pub fn open(
        path: &Path,
        name: &str,
        raw_bytes: u64,
        sums: &PageChunks,
    ) -> Result<Self, CheckpointError> {
        let file = File::open(path).map_err(io_err(format!("open {}", path.display())))?;
        let stored_bytes = file
            .metadata()
            .map_err(io_err(format!("stat {}", path.display())))?
            .len();
        if !sums.fits(raw_bytes, stored_bytes) {
            return Err(CheckpointError::Corrupt(format!(
                "{name}: {stored_bytes} stored bytes do not match its {} chunks",
                sums.stored.len()
            )));
        }
        let offsets = sums
            .stored
            .iter()
            .scan(0u64, |at, len| {
                let start = *at;
                *at += len;
                Some(start)
            })
            .collect();
        Ok(Self {
            file,
            name: name.to_string(),
            raw_bytes,
            sums: sums.clone(),
            offsets,
            cache: Vec::with_capacity(CACHED_CHUNKS),
        })
    }

    pub fn raw_len(&self) -> u64 {
        self.raw_bytes
    }

    /// Reads, unpacks and checks chunk `index` into `out` (resized to its raw length).
    fn unpack(
        file: &File,
        name: &str,
        sums: &PageChunks,
        raw_bytes: u64,
        start: u64,
        index: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), CheckpointError> {
        let raw_len = sums.raw_len(index, raw_bytes) as usize;
        let stored_len = sums.stored[index] as usize;
        let mut stored = vec![0u8; stored_len];
        file.read_exact_at(&mut stored, start)
            .map_err(io_err(format!("read {name}")))?;
        if stored_len == raw_len {
            *out = stored;
        } else {
            *out = zstd::bulk::decompress(&stored, raw_len).map_err(|e| {
                CheckpointError::Corrupt(format!("{name}: chunk {index} does not unpack: {e}"))
            })?;
        }
        let found = hash_hex(out);
        if out.len() != raw_len || found != sums.xxh3_128[index] {
            return Err(CheckpointError::Corrupt(format!(
                "{name}: chunk {index} (raw bytes {}..{}) has xxh3-128 {found}, the manifest says {}",
                index as u64 * sums.chunk_bytes,
                index as u64 * sums.chunk_bytes + raw_len as u64,
                sums.xxh3_128[index]
            )));
        }
        Ok(())
    }

    /// Chunk `index`, unpacked and checked.
    fn chunk(&mut self, index: usize) -> Result<&[u8], CheckpointError> {
        if let Some(at) = self.cache.iter().position(|(i, _)| *i == index) {
            let hit = self.cache.remove(at);
            self.cache.push(hit);
        } else {
            let mut out = Vec::new();
            Self::unpack(
                &self.file,
                &self.name,
                &self.sums,
                self.raw_bytes,
                self.offsets[index],
                index,
                &mut out,
            )?;
            if self.cache.len() == CACHED_CHUNKS {
                self.cache.remove(0);
            }
            self.cache.push((index, out));
        }
        Ok(self
            .cache
            .last()
            .map(|(_, bytes)| bytes.as_slice())
            .unwrap_or(&[]))
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), CheckpointError> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.raw_bytes)
        {
            return Err(CheckpointError::Corrupt(format!(
                "{}: range {offset}+{len} is past its end ({} bytes)",
                self.name, self.raw_bytes
            )));
        }
        Ok(())
    }

    /// Fills `buf` with the raw bytes at `offset`, every chunk they come from checked.
    pub fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<(), CheckpointError> {
        self.check_range(offset, buf.len() as u64)?;
        let chunk_bytes = self.sums.chunk_bytes;
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let index = (at / chunk_bytes) as usize;
            let within = (at % chunk_bytes) as usize;
            let chunk = self.chunk(index)?;
            let take = (chunk.len() - within).min(buf.len() - done);
            buf[done..done + take].copy_from_slice(&chunk[within..within + take]);
            done += take;
        }
        Ok(())
    }

    /// Writes the raw bytes of every chunk holding a byte of `offset..offset + len` into `out` at
    /// their raw offsets, checked (the pages CRIU's restore reads itself).
    pub fn expand_range(
        &mut self,
        offset: u64,
        len: u64,
        out: &File,
    ) -> Result<(), CheckpointError> {
        self.check_range(offset, len)?;
        for index in self.sums.covering(offset, len) {
            let start = index as u64 * self.sums.chunk_bytes;
            let name = self.name.clone();
            let chunk = self.chunk(index)?;
            out.write_all_at(chunk, start)
                .map_err(io_err(format!("write the raw {name}")))?;
        }
        Ok(())
    }

    /// Writes every chunk, unpacked and checked, into `out` at its raw offset, spread over
    /// `threads` threads (an eager restore: CRIU reads the whole raw file before anything runs).
    pub fn expand_all(&self, out: &File, threads: usize) -> Result<(), CheckpointError> {
        let count = self.offsets.len();
        let threads = threads.clamp(1, count.max(1));
        let results: Vec<Result<(), CheckpointError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    scope.spawn(move || {
                        let mut buf = Vec::new();
                        // Interleaved, so both threads read the file front to back together.
                        for index in (t..count).step_by(threads) {
                            Self::unpack(
                                &self.file,
                                &self.name,
                                &self.sums,
                                self.raw_bytes,
                                self.offsets[index],
                                index,
                                &mut buf,
                            )?;
                            out.write_all_at(&buf, index as u64 * self.sums.chunk_bytes)
                                .map_err(io_err(format!("write the raw {}", self.name)))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(CheckpointError::Invalid("unpacking thread panicked".into()))
                    })
                })
                .collect()
        });
        results.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip_and_damage_is_caught_where_it_is() {
        let dir = std::env::temp_dir().join(format!("wt-chunks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let raw = dir.join("pages-1.img");
        // Chunk 0 compresses, chunk 1 is noise (stored raw), chunks 2-3 compress (3 is short).
        let mut state = 0x9e3779b97f4a7c15u64;
        let data: Vec<u8> = (0..(CHUNK_BYTES * 3 + 4096))
            .map(|i| {
                if i / CHUNK_BYTES == 1 {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                } else {
                    (i / 4096) as u8
                }
            })
            .collect();
        std::fs::write(&raw, &data).unwrap();
        let stored = dir.join("pages-1.img.chunks");
        let (sums, raw_bytes, stored_bytes) = pack(&raw, &stored).unwrap();
        assert_eq!(raw_bytes, data.len() as u64);
        assert_eq!(sums.stored.len(), 4);
        assert_eq!(sums.stored[1], CHUNK_BYTES, "noise is stored raw");
        assert!(sums.stored[0] < CHUNK_BYTES / 10, "{:?}", sums.stored);
        assert!(sums.fits(raw_bytes, stored_bytes) && !sums.fits(raw_bytes, stored_bytes + 1));
        assert_eq!(sums.covering(CHUNK_BYTES - 1, 2), 0..2);

        let mut pages = ChunkedPages::open(&stored, "pages-1.img", raw_bytes, &sums).unwrap();
        let mut span = vec![0u8; 8192];
        pages.read_at(&mut span, CHUNK_BYTES * 2 - 4096).unwrap();
        assert_eq!(span[..], data[(CHUNK_BYTES * 2 - 4096) as usize..][..8192]);
        assert!(
            pages.read_at(&mut span, raw_bytes - 4096).is_err(),
            "past the end"
        );

        let whole = File::create(dir.join("whole")).unwrap();
        pages.expand_all(&whole, 2).unwrap();
        assert_eq!(std::fs::read(dir.join("whole")).unwrap(), data);
        let part = File::create(dir.join("part")).unwrap();
        part.set_len(raw_bytes).unwrap();
        pages.expand_range(CHUNK_BYTES * 3, 10, &part).unwrap();
        let part = std::fs::read(dir.join("part")).unwrap();
        assert_eq!(
            part[(CHUNK_BYTES * 3) as usize..],
            data[(CHUNK_BYTES * 3) as usize..]
        );
        assert!(part[..(CHUNK_BYTES * 3) as usize].iter().all(|b| *b == 0));

        // One stored byte changed in chunk 2: reads there fail, other chunks still read.
        let mut damaged = std::fs::read(&stored).unwrap();
        let at = (sums.stored[0] + sums.stored[1] + 3) as usize;
        damaged[at] ^= 0x40;
        std::fs::write(&stored, &damaged).unwrap();
        let mut pages = ChunkedPages::open(&stored, "pages-1.img", raw_bytes, &sums).unwrap();
        pages.read_at(&mut span, 0).unwrap();
        let err = pages.read_at(&mut span, CHUNK_BYTES * 2).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::Corrupt(m) if m.contains("chunk 2")),
            "{err}"
        );
        assert!(matches!(
            pages.expand_all(&File::create(dir.join("w2")).unwrap(), 2),
            Err(CheckpointError::Corrupt(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
