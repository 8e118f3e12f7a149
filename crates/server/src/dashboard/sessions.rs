//! Dashboard sessions: an opaque random id in an `HttpOnly`, `SameSite=Strict` cookie, mapped here to
//! the hash of the API key that logged in (so revoking the key ends its sessions at the next request),
//! the key's team, a CSRF token and an expiry.
//!
//! The table lives in memory on purpose: a session is a short-lived credential derived from an API
//! key, and a server restart logging everyone out is the safe failure. Nothing about a session is ever
//! written to disk.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::TryRngCore;

/// The cookie that carries the session id.
pub const COOKIE: &str = "warren_session";
/// The header a state-changing request made with a session must carry.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a session lives after login.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);
/// Sessions kept at most; the oldest go first beyond this (a login loop cannot grow memory).
const MAX_SESSIONS: usize = 10_000;

#[derive(Debug, Clone)]
pub struct Session {
    /// `keys::hash_secret` of the API key that logged in.
    pub key_hash: String,
    pub team_id: String,
    pub csrf: String,
    expires: Instant,
}

#[derive(Debug)]
pub struct Sessions {
    /// Whether the API listener speaks TLS: cookies then carry `Secure`.
    secure: bool,
    ttl: Duration,
    table: Mutex<HashMap<String, Session>>,
}

fn random_token() -> String {
    let mut bytes = [0u8; 32];
    // The kernel's generator directly; a session id must not depend on a user-space state.
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .expect("the kernel's random generator failed");
    hex::encode(bytes)
}

/// Equality that takes as long for a near miss as for a far one.
pub fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Sessions {
    pub fn new(secure: bool) -> Sessions {
        Sessions::with_ttl(secure, SESSION_TTL)
    }

    pub fn with_ttl(secure: bool, ttl: Duration) -> Sessions {
        Sessions {
            secure,
            ttl,
            table: Mutex::new(HashMap::new()),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // A panic while holding the lock cannot leave a half-written entry (inserts and removes are
        // single map operations), so a poisoned table is still sound.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new session for the key with hash `key_hash`; returns its id and the session.
    pub fn create(&self, key_hash: &str, team_id: &str) -> (String, Session) {
        let now = Instant::now();
        let id = random_token();
        let session = Session {
            key_hash: key_hash.to_string(),
            team_id: team_id.to_string(),
            csrf: random_token(),
            expires: now + self.ttl,
        };
        let mut table = self.table();
        table.retain(|_, s| s.expires > now);
        if table.len() >= MAX_SESSIONS {
            if let Some(oldest) = table
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone())
            {
                table.remove(&oldest);
            }
        }
        table.insert(id.clone(), session.clone());
        (id, session)
    }

    /// The live session `id`; an expired one is forgotten.
    pub fn get(&self, id: &str) -> Option<Session> {
        let mut table = self.table();
        match table.get(id) {
            Some(session) if session.expires > Instant::now() => Some(session.clone()),
            Some(_) => {
                table.remove(id);
                None
            }
            None => None,
        }
    }

    pub fn remove(&self, id: &str) {
        self.table().remove(id);
    }

    /// The `Set-Cookie` value that hands session `id` to the browser.
    pub fn cookie(&self, id: &str) -> String {
        format!(
            "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
            self.ttl.as_secs(),
            if self.secure { "; Secure" } else { "" }
        )
    }

    /// The `Set-Cookie` value that makes the browser drop the session cookie.
    pub fn clearing_cookie(&self) -> String {
        format!(
            "{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{}",
            if self.secure { "; Secure" } else { "" }
        )
    }
}

/// The session id among the request's `Cookie` headers.
pub fn session_id(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == COOKIE && !value.is_empty())
        .map(|(_, value)| value.to_string())
}

/// Takes the session cookie out of `headers`, keeping every other cookie: what the sandbox proxy
/// forwards must never carry a dashboard session to code inside a sandbox.
pub fn strip_session_cookie(headers: &mut axum::http::HeaderMap) {
    let values: Vec<axum::http::HeaderValue> = headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .cloned()
        .collect();
    if values.is_empty() {
        return;
    }
    headers.remove(axum::http::header::COOKIE);
    for value in values {
        let Ok(text) = value.to_str() else {
            // Not text: not ours to parse, and no session cookie of ours looks like that.
            headers.append(axum::http::header::COOKIE, value);
            continue;
        };
        let kept: Vec<&str> = text
            .split(';')
            .map(str::trim)
            .filter(|pair| {
                !pair.is_empty() && pair.split('=').next().map(str::trim) != Some(COOKIE)
            })
            .collect();
        if kept.is_empty() {
            continue;
        }
        if let Ok(value) = axum::http::HeaderValue::from_str(&kept.join("; ")) {
            headers.append(axum::http::header::COOKIE, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_until_it_expires_or_is_removed() {
        let sessions = Sessions::new(false);
        let (id, session) = sessions.create("hash", "team-a");
        assert_eq!(sessions.get(&id).unwrap().team_id, "team-a");
        assert_eq!(sessions.get(&id).unwrap().csrf, session.csrf);
        assert_ne!(id, session.csrf);
        sessions.remove(&id);
        assert!(sessions.get(&id).is_none());

        let short = Sessions::with_ttl(false, Duration::ZERO);
        let (id, _) = short.create("hash", "team-a");
        assert!(
            short.get(&id).is_none(),
            "a session past its expiry is gone"
        );
    }

    #[test]
    fn ids_and_tokens_are_random_and_long() {
        let sessions = Sessions::new(false);
        let (a, sa) = sessions.create("h", "t");
        let (b, sb) = sessions.create("h", "t");
        assert_ne!(a, b);
        assert_ne!(sa.csrf, sb.csrf);
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn cookies_are_http_only_strict_and_secure_only_with_tls() {
        let plain = Sessions::new(false).cookie("abc");
        assert!(plain.starts_with("warren_session=abc;"));
        assert!(plain.contains("HttpOnly") && plain.contains("SameSite=Strict"));
        assert!(!plain.contains("Secure"));
        assert!(Sessions::new(true).cookie("abc").ends_with("; Secure"));
        assert!(Sessions::new(false).clearing_cookie().contains("Max-Age=0"));
    }

    #[test]
    fn the_proxy_strips_only_the_session_cookie() {
        let mut headers = axum::http::HeaderMap::new();
        headers.append("cookie", "a=1; warren_session=xyz; b=2".parse().unwrap());
        headers.append("cookie", "warren_session=abc".parse().unwrap());
        headers.append("cookie", "c=3".parse().unwrap());
        strip_session_cookie(&mut headers);
        let left: Vec<&str> = headers
            .get_all("cookie")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(left, ["a=1; b=2", "c=3"]);
        assert_eq!(session_id(&headers), None);
    }

    #[test]
    fn the_session_cookie_is_read_among_others() {
        let mut headers = axum::http::HeaderMap::new();
        headers.append("cookie", "a=1; warren_session=xyz; b=2".parse().unwrap());
        assert_eq!(session_id(&headers).as_deref(), Some("xyz"));
        let mut none = axum::http::HeaderMap::new();
        none.append("cookie", "warren_session=".parse().unwrap());
        assert_eq!(session_id(&none), None);
    }

    #[test]
    fn token_comparison() {
        assert!(same_token("abc", "abc"));
        assert!(!same_token("abc", "abd"));
        assert!(!same_token("abc", "ab"));
    }
}
