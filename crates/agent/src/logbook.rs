//! The agent's log of the sandbox's life: every line a command printed on stdout or stderr, and
//! when each process started and ended. It is a bounded ring in the agent's memory (so a paused
//! sandbox keeps it, and a restored one carries on numbering), read by the server with
//! `GET /warren/logs?after=<seq>`, which stores what it collects for `/sandboxes/{id}/logs`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

/// A line longer than this is recorded in pieces of this size.
pub const MAX_LINE: usize = 8 << 10;
/// The ring drops its oldest entries beyond this many bytes of messages...
const MAX_BYTES: usize = 4 << 20;
/// ...or this many entries.
const MAX_ENTRIES: usize = 20_000;
/// At most this many bytes of messages in one answer (the server asks again for the rest).
pub const PAGE_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Entry {
    /// 1, 2, 3... in the order recorded; never reused.
    pub seq: u64,
    /// Unix milliseconds.
    pub at: i64,
    pub level: &'static str,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
pub struct Page {
    pub entries: Vec<Entry>,
    /// The oldest sequence number still held (entries before it were dropped unread, or never
    /// existed); the next one to be recorded when the ring is empty.
    pub oldest: u64,
}

#[derive(Default)]
struct Ring {
    entries: VecDeque<Entry>,
    bytes: usize,
    last_seq: u64,
}

pub struct Logbook {
    ring: Mutex<Ring>,
    /// The last sequence number recorded, for readers waiting for more ([`Logbook::after_waiting`]).
    last_seq: watch::Sender<u64>,
}

impl Default for Logbook {
    fn default() -> Self {
        Logbook {
            ring: Mutex::default(),
            last_seq: watch::Sender::new(0),
        }
    }
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Logbook {
    pub fn record(&self, level: &'static str, message: String, fields: BTreeMap<String, String>) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.last_seq += 1;
        ring.bytes += message.len();
        let seq = ring.last_seq;
        ring.entries.push_back(Entry {
            seq,
            at: now_millis(),
            level,
            message,
            fields,
        });
        while ring.entries.len() > MAX_ENTRIES || ring.bytes > MAX_BYTES {
            let Some(dropped) = ring.entries.pop_front() else {
                break;
            };
            ring.bytes -= dropped.message.len();
        }
        drop(ring);
        self.last_seq.send_replace(seq);
    }

    /// [`Logbook::after`], but when there is nothing after `after` yet, waits up to `wait` for an
    /// entry to be recorded (a long poll: the server's live tail of the log asks this way).
    pub async fn after_waiting(&self, after: u64, limit: usize, wait: Duration) -> Page {
        let mut recorded = self.last_seq.subscribe();
        let page = self.after(after, limit);
        if !page.entries.is_empty() || wait.is_zero() {
            return page;
        }
        // `wait_for` looks at the current value first: an entry recorded since `after` above
        // returns at once.
        let _ = tokio::time::timeout(wait, recorded.wait_for(|last| *last > after)).await;
        self.after(after, limit)
    }

    /// Entries after `after`, oldest first: at most `limit`, and at most [`PAGE_BYTES`] of
    /// messages (always at least one entry when there is one).
    pub fn after(&self, after: u64, limit: usize) -> Page {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let oldest = ring
            .entries
            .front()
            .map_or(ring.last_seq + 1, |entry| entry.seq);
        let skip = after.saturating_sub(oldest.saturating_sub(1));
        let mut entries = Vec::new();
        let mut bytes = 0;
        for entry in ring.entries.iter().skip(skip as usize).take(limit) {
            bytes += entry.message.len();
            if bytes > PAGE_BYTES && !entries.is_empty() {
                break;
            }
            entries.push(entry.clone());
        }
        Page { entries, oldest }
    }
}

/// Cuts a stream of output chunks into lines (without their `\n` or `\r\n`), each at most
/// [`MAX_LINE`] bytes; bytes that are not UTF-8 are replaced.
#[derive(Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut lines = Vec::new();
        for &byte in chunk {
            if byte == b'\n' {
                lines.push(self.take());
            } else {
                self.partial.push(byte);
                if self.partial.len() >= MAX_LINE {
                    lines.push(self.take());
                }
            }
        }
        lines
    }

    /// What is left after the last newline, when the stream ends.
    pub fn finish(&mut self) -> Option<String> {
        (!self.partial.is_empty()).then(|| self.take())
    }

    fn take(&mut self) -> String {
        let mut line = std::mem::take(&mut self.partial);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        String::from_utf8_lossy(&line).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    #[test]
    fn lines_are_split_across_chunks_and_long_ones_are_cut() {
        let mut split = LineSplitter::default();
        assert_eq!(split.feed(b"one\r\ntw"), vec!["one".to_string()]);
        assert_eq!(
            split.feed(b"o\n\nthree"),
            vec!["two".to_string(), String::new()]
        );
        assert_eq!(split.finish(), Some("three".to_string()));
        assert_eq!(split.finish(), None);
        let long = vec![b'x'; MAX_LINE + 10];
        let pieces = split.feed(&long);
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0].len(), MAX_LINE);
        assert_eq!(split.finish().map(|rest| rest.len()), Some(10));
        assert_eq!(split.feed(&[0xff, b'\n']), vec!["\u{fffd}".to_string()]);
    }

    #[test]
    fn pages_continue_after_a_sequence_number_and_skip_what_was_dropped() {
        let book = Logbook::default();
        assert_eq!(book.after(0, 10).oldest, 1);
        for n in 0..5 {
            book.record("info", format!("line {n}"), fields());
        }
        let page = book.after(0, 2);
        let seqs: Vec<u64> = page.entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![1, 2]);
        let rest: Vec<u64> = book.after(2, 10).entries.iter().map(|e| e.seq).collect();
        assert_eq!(rest, vec![3, 4, 5]);
        assert!(book.after(5, 10).entries.is_empty());
        assert!(book.after(99, 10).entries.is_empty());

        // Fill past the entry bound: the oldest go, numbering goes on.
        for n in 0..MAX_ENTRIES {
            book.record("info", format!("more {n}"), fields());
        }
        let page = book.after(0, 1);
        assert_eq!(page.oldest, 6);
        assert_eq!(page.entries[0].seq, 6);
        assert_eq!(page.entries[0].message, "more 0");
    }

    #[tokio::test]
    async fn a_waiting_read_returns_when_an_entry_is_recorded_or_when_the_wait_ends() {
        let book = std::sync::Arc::new(Logbook::default());
        book.record("info", "first".into(), fields());
        // Something is there already: no wait.
        let page = book.after_waiting(0, 10, Duration::from_secs(30)).await;
        assert_eq!(page.entries.len(), 1);
        // Nothing after 1: the read waits until line 2 is recorded.
        let writer = book.clone();
        let recorder = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            writer.record("info", "second".into(), fields());
        });
        let started = std::time::Instant::now();
        let page = book.after_waiting(1, 10, Duration::from_secs(30)).await;
        recorder.await.unwrap();
        assert_eq!(page.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
        assert!(started.elapsed() < Duration::from_secs(30));
        // Nothing comes: an empty page once the wait is over.
        let page = book.after_waiting(2, 10, Duration::from_millis(50)).await;
        assert!(page.entries.is_empty());
    }

    #[test]
    fn the_ring_and_a_page_are_bounded_in_bytes() {
        let book = Logbook::default();
        let line = "y".repeat(MAX_LINE);
        let count = MAX_BYTES / MAX_LINE + 50;
        for _ in 0..count {
            book.record("info", line.clone(), fields());
        }
        let page = book.after(0, usize::MAX);
        assert_eq!(page.oldest, 51);
        assert_eq!(page.entries.len(), PAGE_BYTES / MAX_LINE);
        let held: usize = MAX_BYTES / MAX_LINE;
        let mut seen = 0;
        let mut after = 0;
        loop {
            let page = book.after(after, usize::MAX);
            let Some(last) = page.entries.last() else {
                break;
            };
            seen += page.entries.len();
            after = last.seq;
        }
        assert_eq!(seen, held);
    }
}
