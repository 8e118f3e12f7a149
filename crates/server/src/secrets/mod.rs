//! Stored secrets (E2B's `/secrets`): a team's named values, kept encrypted, that sandboxes use
//! through `${e2b.secrets.<name>}` placeholders the host resolves (docs/secrets.md).
//!
//! This module holds what needs no store: the rules for names, values and metadata, the operator's
//! key and the AEAD that seals values with it ([`SecretKey`]), and the placeholder syntax
//! ([`placeholders`]). No message made here ever contains a value.

pub mod placeholders;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// File name of the key made in the state directory when the operator gives none.
pub const DEFAULT_KEY_FILE: &str = "secrets.key";
/// The prefix of every secret's id; names may not start with it.
pub const ID_PREFIX: &str = "sec_";
/// Longest name, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// Longest value, in bytes.
pub const MAX_VALUE_LEN: usize = 64 * 1024;
/// E2B's metadata limits.
pub const MAX_METADATA_ENTRIES: usize = 32;
pub const MAX_METADATA_KEY_LEN: usize = 128;
pub const MAX_METADATA_VALUE_LEN: usize = 1024;
pub const MAX_METADATA_TOTAL: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("cannot read the secrets key file {path}")]
    ReadKey {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create the secrets key file {path}")]
    CreateKey {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the secrets key file {path} must hold 32 bytes (raw, or as 64 hex digits)")]
    BadKey { path: PathBuf },
    #[error("no secrets key is loaded: {0}")]
    NoKey(String),
    #[error("the system random generator failed")]
    Random,
    /// The stored value does not open with this server's key: the key file was replaced or lost,
    /// or the row was altered.
    #[error(
        "secret '{name}' cannot be decrypted with this server's secrets key (was the key file \
         replaced?)"
    )]
    Undecryptable { name: String },
    #[error("secret '{name}' is not valid UTF-8 once decrypted")]
    NotText { name: String },
}

/// A valid name in its stored (lower-case) form, or the reason it is refused. The reason names the
/// rule, never echoes anything but the name.
pub fn canonical_name(name: &str) -> Result<String, String> {
    if name.is_empty() {
        return Err("name must not be empty".to_string());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("name is longer than {MAX_NAME_LEN} bytes"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(format!(
            "name {name:?} may hold only ASCII letters, digits, '_', '-' and '.'"
        ));
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with(ID_PREFIX) {
        return Err(format!(
            "name {name:?} starts with {ID_PREFIX:?}, which is reserved for secret ids"
        ));
    }
    Ok(lower)
}

/// Whether `value` may be stored; the reason never contains the value.
pub fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("value must not be empty".to_string());
    }
    if value.len() > MAX_VALUE_LEN {
        return Err(format!("value is longer than {MAX_VALUE_LEN} bytes"));
    }
    if value.contains('\0') {
        return Err("value must not contain NUL characters".to_string());
    }
    Ok(())
}

/// E2B's metadata limits: at most 32 entries, keys up to 128 bytes, values up to 1024, 8192 in all.
pub fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), String> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(format!(
            "metadata has {} entries, at most {MAX_METADATA_ENTRIES} are allowed",
            metadata.len()
        ));
    }
    let mut total = 0;
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_METADATA_KEY_LEN {
            return Err(format!(
                "metadata key {key:?} must be 1 to {MAX_METADATA_KEY_LEN} bytes"
            ));
        }
        if value.len() > MAX_METADATA_VALUE_LEN {
            return Err(format!(
                "metadata.{key} is longer than {MAX_METADATA_VALUE_LEN} bytes"
            ));
        }
        total += key.len() + value.len();
    }
    if total > MAX_METADATA_TOTAL {
        return Err(format!(
            "metadata holds {total} bytes, at most {MAX_METADATA_TOTAL} are allowed"
        ));
    }
    Ok(())
}

/// A fresh secret id: `sec_` and 24 hex digits.
pub fn new_secret_id() -> String {
    use rand::Rng;
    let bytes: [u8; 12] = rand::rng().random();
    format!("{ID_PREFIX}{}", hex::encode(bytes))
}

/// A sealed value as the store keeps it.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealed({} bytes)", self.ciphertext.len())
    }
}

/// The operator's 32-byte key. Values are sealed with ChaCha20-Poly1305, a fresh random 96-bit
/// nonce each, and the secret's id and version as associated data, so a sealed value copied to
/// another row or version does not open.
pub struct SecretKey {
    key: LessSafeKey,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

fn associated_data(id: &str, version: i64) -> Vec<u8> {
    format!("warren-secret:{id}:{version}").into_bytes()
}

impl SecretKey {
    pub fn from_bytes(bytes: &[u8; 32]) -> SecretKey {
        // A 32-byte key is exactly what CHACHA20_POLY1305 takes, so this cannot fail.
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes).expect("32-byte key");
        SecretKey {
            key: LessSafeKey::new(unbound),
        }
    }

    /// Reads the key at `path`: 32 raw bytes, or 64 hex digits (surrounding whitespace ignored).
    pub fn read(path: &Path) -> Result<SecretKey, SecretsError> {
        let bytes = std::fs::read(path).map_err(|source| SecretsError::ReadKey {
            path: path.to_path_buf(),
            source,
        })?;
        let bad = || SecretsError::BadKey {
            path: path.to_path_buf(),
        };
        let raw: Vec<u8> = if bytes.len() == 32 {
            bytes
        } else {
            let text = std::str::from_utf8(&bytes).map_err(|_| bad())?.trim();
            hex::decode(text).map_err(|_| bad())?
        };
        let array: [u8; 32] = raw.as_slice().try_into().map_err(|_| bad())?;
        Ok(SecretKey::from_bytes(&array))
    }

    /// The key at `path`; when no file is there, a new random key is written to it (hex, mode 0600,
    /// created exclusively so two starting servers cannot both write one).
    pub fn read_or_create(path: &Path) -> Result<SecretKey, SecretsError> {
        match SecretKey::read(path) {
            Err(SecretsError::ReadKey { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            other => return other,
        }
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| SecretsError::Random)?;
        let create = |source| SecretsError::CreateKey {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(create)?;
        }
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(create)?;
        file.write_all(format!("{}\n", hex::encode(bytes)).as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(create)?;
        Ok(SecretKey::from_bytes(&bytes))
    }

    /// Seals `value` as version `version` of secret `id`.
    pub fn seal(&self, id: &str, version: i64, value: &str) -> Result<Sealed, SecretsError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SecretsError::Random)?;
        let mut buffer = value.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated_data(id, version)),
                &mut buffer,
            )
            .map_err(|_| SecretsError::Random)?;
        Ok(Sealed {
            nonce: nonce.to_vec(),
            ciphertext: buffer,
        })
    }

    /// Opens version `version` of secret `id` (named `name` in errors).
    pub fn open(
        &self,
        id: &str,
        name: &str,
        version: i64,
        sealed: &Sealed,
    ) -> Result<String, SecretsError> {
        let undecryptable = || SecretsError::Undecryptable {
            name: name.to_string(),
        };
        let nonce: [u8; NONCE_LEN] = sealed
            .nonce
            .as_slice()
            .try_into()
            .map_err(|_| undecryptable())?;
        let mut buffer = sealed.ciphertext.clone();
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated_data(id, version)),
                &mut buffer,
            )
            .map_err(|_| undecryptable())?;
        String::from_utf8(plain.to_vec()).map_err(|_| SecretsError::NotText {
            name: name.to_string(),
        })
    }
}

/// The key a server uses: loaded (or made) once at start; a failure is kept and reported each time
/// a secret is used, so a bad key file never stops sandboxes that use no secrets.
#[derive(Debug)]
pub struct Keyring {
    key: Result<SecretKey, String>,
}

impl Keyring {
    /// The key at `given` (which must exist), or else `<state_dir>/secrets.key` (made when absent).
    pub fn load(given: Option<&Path>, state_dir: &Path) -> Keyring {
        let key = match given {
            Some(path) => SecretKey::read(path),
            None => SecretKey::read_or_create(&state_dir.join(DEFAULT_KEY_FILE)),
        };
        let key = key.map_err(|error| {
            let mut chain = error.to_string();
            if let Some(source) = std::error::Error::source(&error) {
                chain.push_str(&format!(": {source}"));
            }
            tracing::error!(error = %chain, "stored secrets are unusable");
            chain
        });
        Keyring { key }
    }

    pub fn with_key(key: SecretKey) -> Keyring {
        Keyring { key: Ok(key) }
    }

    pub fn key(&self) -> Result<&SecretKey, SecretsError> {
        self.key
            .as_ref()
            .map_err(|reason| SecretsError::NoKey(reason.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_key_id_and_version() {
        let key = SecretKey::from_bytes(&[7; 32]);
        let sealed = key.seal("sec_a", 1, "hunter2-value").unwrap();
        assert!(!sealed
            .ciphertext
            .windows(b"hunter2".len())
            .any(|w| w == b"hunter2"));
        assert_eq!(key.open("sec_a", "a", 1, &sealed).unwrap(), "hunter2-value");
        // Another version, another id, another key: all refused, and the error names no value.
        for (id, version) in [("sec_a", 2), ("sec_b", 1)] {
            let error = key.open(id, "a", version, &sealed).unwrap_err();
            assert!(matches!(error, SecretsError::Undecryptable { .. }));
        }
        let other = SecretKey::from_bytes(&[8; 32]);
        let error = other.open("sec_a", "a", 1, &sealed).unwrap_err();
        assert!(!error.to_string().contains("hunter2"));
        assert!(error.to_string().contains("'a'"), "{error}");
        // A fresh nonce each time.
        assert_ne!(key.seal("sec_a", 1, "hunter2-value").unwrap(), sealed);
    }

    #[test]
    fn a_missing_key_file_is_made_0600_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("secrets.key");
        let made = SecretKey::read_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let sealed = made.seal("sec_x", 1, "v").unwrap();
        let again = SecretKey::read_or_create(&path).unwrap();
        assert_eq!(again.open("sec_x", "x", 1, &sealed).unwrap(), "v");
        std::fs::write(&path, "too short").unwrap();
        assert!(matches!(
            SecretKey::read(&path),
            Err(SecretsError::BadKey { .. })
        ));
        let keyring = Keyring::load(Some(&dir.path().join("absent")), dir.path());
        assert!(keyring.key().is_err());
    }

    #[test]
    fn names_are_lower_cased_and_checked() {
        assert_eq!(
            canonical_name("OpenAI-Key_1.v2").unwrap(),
            "openai-key_1.v2"
        );
        for bad in [
            "",
            "a b",
            "a}b",
            "a{b",
            "sec_x",
            "SEC_x",
            "ä",
            &"x".repeat(129),
        ] {
            assert!(canonical_name(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(check_value("").is_err());
        let error = check_value(&"s".repeat(MAX_VALUE_LEN + 1)).unwrap_err();
        assert!(!error.contains("sss"));
        let many: BTreeMap<String, String> = (0..33)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        assert!(check_metadata(&many).is_err());
        let big: BTreeMap<String, String> = (0..10)
            .map(|i| (format!("k{i}"), "v".repeat(1000)))
            .collect();
        assert!(check_metadata(&big).is_err());
    }
}
