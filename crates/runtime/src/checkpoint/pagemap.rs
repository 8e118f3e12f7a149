//! Reading CRIU's pagemap images (`pagemap-<pid>.img`, `pagemap-shmem-<id>.img`): which virtual
//! pages of a process (or shared-memory segment) are stored, with which flags, and where their bytes
//! lie in the matching `pages-<n>.img`. The lazy restore needs this to answer CRIU's page requests
//! from the checkpoint itself and to know which pages CRIU reads on its own (those are verified before
//! it starts).
//!
//! The format (CRIU's `images/pagemap.proto`): a magic word (after CRIU's common image magic), then
//! length-prefixed protobuf messages: one `pagemap_head { pages_id }`, then `pagemap_entry { vaddr,
//! nr_pages, in_parent, flags }` in address order. Pages of entries flagged present follow one another
//! in the pages file, in entry order. Decoded by hand: four varint fields do not justify generated code.

use std::path::Path;

use super::CheckpointError;

pub const PAGE_SIZE: u64 = 4096;
/// CRIU's magic words (criu/include/magic.h).
const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
const IMG_SERVICE_MAGIC: u32 = 0x5510_5940;
const PAGEMAP_MAGIC: u32 = 0x5608_4025;
/// Pagemap entry flags (criu/include/pagemap.h).
pub const PE_PARENT: u32 = 1 << 0;
pub const PE_LAZY: u32 = 1 << 1;
pub const PE_PRESENT: u32 = 1 << 2;

/// One run of pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub vaddr: u64,
    pub nr_pages: u32,
    pub flags: u32,
    /// Where the run's bytes start in the pages file (meaningful when present).
    pub offset: u64,
}

impl Entry {
    pub fn present(&self) -> bool {
        self.flags & PE_PRESENT != 0
    }

    pub fn lazy(&self) -> bool {
        self.flags & PE_LAZY != 0
    }

    pub fn bytes(&self) -> u64 {
        u64::from(self.nr_pages) * PAGE_SIZE
    }

    fn end(&self) -> u64 {
        self.vaddr + self.bytes()
    }
}

/// One pagemap image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pagemap {
    /// `pages-<pages_id>.img` holds the bytes.
    pub pages_id: u32,
    pub entries: Vec<Entry>,
}

impl Pagemap {
    pub fn read(path: &Path) -> Result<Self, CheckpointError> {
        let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
            context: format!("read {}", path.display()),
            source,
        })?;
        Self::parse(&bytes)
            .map_err(|why| CheckpointError::Corrupt(format!("{}: {why}", path.display())))
    }

    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let mut at = 0usize;
        let word = |at: &mut usize| -> Result<u32, String> {
            let four = bytes
                .get(*at..*at + 4)
                .ok_or_else(|| "truncated".to_string())?;
            *at += 4;
            Ok(u32::from_le_bytes([four[0], four[1], four[2], four[3]]))
        };
        let mut magic = word(&mut at)?;
        if magic == IMG_COMMON_MAGIC || magic == IMG_SERVICE_MAGIC {
            magic = word(&mut at)?;
        }
        if magic != PAGEMAP_MAGIC {
            return Err(format!("magic {magic:#x} is not a pagemap's"));
        }
        let mut messages = Vec::new();
        while at < bytes.len() {
            let len = word(&mut at)? as usize;
            let body = bytes
                .get(at..at + len)
                .ok_or_else(|| "truncated message".to_string())?;
            messages.push(fields(body)?);
            at += len;
        }
        let mut messages = messages.into_iter();
        let head = messages.next().ok_or("no pagemap head")?;
        let pages_id = u32::try_from(field(&head, 1).ok_or("head without pages_id")?)
            .map_err(|_| "pages_id out of range")?;
        let mut entries = Vec::new();
        let mut offset = 0u64;
        let mut last_end = 0u64;
        for message in messages {
            let vaddr = field(&message, 1).ok_or("entry without vaddr")?;
            let nr_pages = u32::try_from(field(&message, 2).ok_or("entry without nr_pages")?)
                .map_err(|_| "nr_pages out of range")?;
            // As CRIU reads old images: no flags means present, in_parent means parent.
            let flags = match (field(&message, 4), field(&message, 3)) {
                (_, Some(in_parent)) if in_parent != 0 => PE_PARENT,
                (Some(flags), _) => u32::try_from(flags).map_err(|_| "flags out of range")?,
                (None, _) => PE_PRESENT,
            };
            let entry = Entry {
                vaddr,
                nr_pages,
                flags,
                offset,
            };
            if vaddr % PAGE_SIZE != 0 || vaddr < last_end || entry.end() < vaddr {
                return Err(format!("entry at {vaddr:#x} out of order or unaligned"));
            }
            last_end = entry.end();
            if entry.present() {
                offset += entry.bytes();
            }
            entries.push(entry);
        }
        Ok(Self { pages_id, entries })
    }

    /// Bytes of the pages file this pagemap uses.
    pub fn stored_bytes(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.present())
            .map(Entry::bytes)
            .sum()
    }

    /// The present entry holding `vaddr`.
    pub fn find(&self, vaddr: u64) -> Option<&Entry> {
        let after = self.entries.partition_point(|e| e.vaddr <= vaddr);
        let entry = self.entries.get(after.checked_sub(1)?)?;
        (vaddr < entry.end() && entry.present()).then_some(entry)
    }

    /// Where in the pages file the run `vaddr..vaddr + nr_pages` pages lies: (offset, pages), the pages
    /// cut short at the end of the entry holding `vaddr`.
    pub fn locate(&self, vaddr: u64, nr_pages: u32) -> Option<(u64, u32)> {
        let entry = self.find(vaddr)?;
        let skip = (vaddr - entry.vaddr) / PAGE_SIZE;
        let left = u64::from(entry.nr_pages) - skip;
        Some((
            entry.offset + skip * PAGE_SIZE,
            u32::try_from(left.min(u64::from(nr_pages))).ok()?,
        ))
    }
}

/// The varint fields of one protobuf message (other wire types are skipped).
fn fields(body: &[u8]) -> Result<Vec<(u32, u64)>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let key = varint(body, &mut at)?;
        let number = u32::try_from(key >> 3).map_err(|_| "field number out of range")?;
        match key & 7 {
            0 => out.push((number, varint(body, &mut at)?)),
            1 => at += 8,
            2 => {
                let len = usize::try_from(varint(body, &mut at)?).map_err(|_| "bad length")?;
                at += len;
            }
            5 => at += 4,
            other => return Err(format!("wire type {other} in a pagemap message")),
        }
    }
    if at > body.len() {
        return Err("field past the end of its message".into());
    }
    Ok(out)
}

fn field(fields: &[(u32, u64)], number: u32) -> Option<u64> {
    fields
        .iter()
        .rev()
        .find(|(n, _)| *n == number)
        .map(|(_, v)| *v)
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at).ok_or("truncated varint")?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint too long".into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn message(fields: &[(u32, u64)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (number, value) in fields {
            put_varint(&mut body, u64::from(*number) << 3);
            put_varint(&mut body, *value);
        }
        let mut out = (body.len() as u32).to_le_bytes().to_vec();
        out.extend(body);
        out
    }

    /// A pagemap image as CRIU writes it: `(vaddr, nr_pages, flags)` entries over pages file `id`.
    pub(crate) fn image(id: u32, entries: &[(u64, u32, u32)]) -> Vec<u8> {
        let mut out = IMG_COMMON_MAGIC.to_le_bytes().to_vec();
        out.extend(PAGEMAP_MAGIC.to_le_bytes());
        out.extend(message(&[(1, u64::from(id))]));
        for (vaddr, nr, flags) in entries {
            out.extend(message(&[
                (1, *vaddr),
                (2, u64::from(*nr)),
                (4, u64::from(*flags)),
            ]));
        }
        out
    }

    #[test]
    fn entries_are_located_in_the_pages_file() {
        let bytes = image(
            7,
            &[
                (0x1000, 2, PE_PRESENT),
                (0x10000, 1, PE_PARENT),
                (0x20000, 4, PE_PRESENT | PE_LAZY),
            ],
        );
        let map = Pagemap::parse(&bytes).unwrap();
        assert_eq!(map.pages_id, 7);
        assert_eq!(map.stored_bytes(), 6 * PAGE_SIZE);
        assert_eq!(map.locate(0x2000, 5), Some((PAGE_SIZE, 1)));
        assert_eq!(map.locate(0x21000, 2), Some((3 * PAGE_SIZE, 2)));
        assert_eq!(map.locate(0x23000, 9), Some((5 * PAGE_SIZE, 1)));
        assert_eq!(map.locate(0x10000, 1), None, "not present");
        assert_eq!(map.locate(0x5000, 1), None, "not mapped");
        assert!(map.entries[2].lazy() && !map.entries[0].lazy());

        assert!(Pagemap::parse(&bytes[..bytes.len() - 1]).is_err());
        assert!(Pagemap::parse(&[0u8; 8]).is_err());
        let unordered = image(1, &[(0x5000, 1, PE_PRESENT), (0x1000, 1, PE_PRESENT)]);
        assert!(Pagemap::parse(&unordered).is_err());
    }
}
