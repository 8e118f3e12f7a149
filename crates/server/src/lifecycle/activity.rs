//! When each sandbox was last used through the proxy: requests in flight (a command's output stream,
//! a PTY, a websocket, an upload) and the end of the last one. The idle policy
//! (`lifecycle::monitor`) reads it; the proxy writes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::store::Millis;

#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Use {
    /// Requests (or upgraded connections) to the sandbox still open.
    pub open: u32,
    /// When the last one began or ended.
    pub last: Millis,
}

#[derive(Debug, Default)]
pub struct Activity {
    sandboxes: Mutex<HashMap<String, Use>>,
}

impl Activity {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Use>> {
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request to sandbox `id` begins at `now`; it ends when the guard is dropped.
    pub fn begin(self: &Arc<Self>, id: &str, now: Millis) -> ActivityGuard {
        let mut sandboxes = self.lock();
        let entry = sandboxes.entry(id.to_string()).or_default();
        entry.open += 1;
        entry.last = entry.last.max(now);
        ActivityGuard {
            activity: Arc::clone(self),
            id: id.to_string(),
        }
    }

    fn end(&self, id: &str, now: Millis) {
        if let Some(entry) = self.lock().get_mut(id) {
            entry.open = entry.open.saturating_sub(1);
            entry.last = entry.last.max(now);
        }
    }

    /// How sandbox `id` has been used since this server started (`None`: not at all).
    pub fn of(&self, id: &str) -> Option<Use> {
        self.lock().get(id).copied()
    }

    /// Forgets sandboxes for which `keep` is false (ended ones).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|id, used| used.open > 0 || keep(id));
    }
}

/// One open request; its drop records the end.
#[derive(Debug)]
pub struct ActivityGuard {
    activity: Arc<Activity>,
    id: String,
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.activity.end(&self.id, super::now_millis());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_requests_count_until_their_guards_drop_and_the_last_end_is_kept() {
        let activity = Arc::new(Activity::default());
        assert_eq!(activity.of("a"), None);
        let first = activity.begin("a", 1_000);
        let second = activity.begin("a", 2_000);
        assert_eq!(
            activity.of("a"),
            Some(Use {
                open: 2,
                last: 2_000
            })
        );
        drop(first);
        let used = activity.of("a").unwrap();
        assert_eq!(used.open, 1);
        assert!(used.last >= 2_000);
        drop(second);
        assert_eq!(activity.of("a").unwrap().open, 0);
        activity.retain(|_| false);
        assert_eq!(activity.of("a"), None, "an ended sandbox is forgotten");
    }
}
