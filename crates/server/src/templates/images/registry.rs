//! Talking to OCI / Docker v2 registries through `oci-client`: resolve a reference to one linux/amd64
//! image manifest and its config (a manifest list or OCI index picks linux/amd64), and fetch layer
//! blobs, which `oci-client` verifies against their digest while streaming.
//!
//! Auth: anonymous (with the registry's token flow when it asks for one) or basic user/password
//! (exchanged for a token the same way when the registry uses tokens). Credentials live only in
//! [`RegistryCredentials`], which never prints its password and is not serialisable.
//!
//! The client is async; the build code is not. Each call runs on a short-lived thread with its own
//! current-thread tokio runtime, so it works from a plain thread, a `spawn_blocking` thread or a test.
//!
//! Plain HTTP is used only for registries on loopback (`127.0.0.0/8`, `[::1]`, `localhost`), as Docker
//! does, and for hosts listed in [`RegistrySettings::insecure`]; everything else is HTTPS (rustls).

use std::fmt;
use std::path::Path;
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("image reference {image:?} is not valid: {message}")]
    BadReference { image: String, message: String },
    #[error("pulling {image}: {message}")]
    Pull { image: String, message: String },
    #[error("pulling {image}: the registry refused access (unauthorized): give the registry's username and password (from_image(image, username, password))")]
    Unauthorized { image: String },
    #[error("pulling {image}: the image config is not valid JSON")]
    Config {
        image: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("pulling {image}: {context}")]
    Io {
        image: String,
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the registry client")]
    Runtime(#[source] std::io::Error),
}

/// A registry user name and password. The password is never printed, logged or serialised.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryCredentials {
    pub username: String,
    password: String,
}

impl RegistryCredentials {
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> RegistryCredentials {
        RegistryCredentials {
            username: username.into(),
            password: password.into(),
        }
    }

    fn auth(&self) -> RegistryAuth {
        RegistryAuth::Basic(self.username.clone(), self.password.clone())
    }
}

impl fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryCredentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Which registries may be reached over plain HTTP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrySettings {
    /// `host[:port]` of registries without TLS besides loopback ones (`WARREN_INSECURE_REGISTRIES`,
    /// comma-separated).
    pub insecure: Vec<String>,
}

impl RegistrySettings {
    pub fn from_env() -> RegistrySettings {
        let insecure = std::env::var("WARREN_INSECURE_REGISTRIES")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        RegistrySettings { insecure }
    }

    fn plain_http(&self, registry: &str) -> bool {
        is_loopback_registry(registry) || self.insecure.iter().any(|h| h == registry)
    }
}

/// `127.0.0.1:5000`, `localhost`, `[::1]:5000`: a registry on this host.
pub fn is_loopback_registry(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        registry.split(':').next().unwrap_or("")
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// One layer of a resolved image, bottom-most first in [`ResolvedImage::layers`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageLayer {
    /// `sha256:<hex>` of the (compressed) blob.
    pub digest: String,
    pub media_type: String,
    pub size: i64,
}

/// What an image's config says about how to run it (Docker's `config` object).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRunConfig {
    /// `KEY=value` entries.
    pub env: Vec<String>,
    pub user: Option<String>,
    pub working_dir: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

/// A reference resolved to one image manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedImage {
    /// The reference as the template named it.
    pub image: String,
    /// Fully qualified (`registry/repository:tag`).
    pub canonical: String,
    /// Digest of the platform manifest: the image's identity, and part of every cache key above it.
    pub manifest_digest: String,
    pub layers: Vec<ImageLayer>,
    pub config: ImageRunConfig,
    /// Kept for the layer pulls of this build only (never written anywhere).
    pub credentials: Option<RegistryCredentials>,
}

/// Parses `image` as Docker does (`alpine` → `docker.io/library/alpine:latest`).
pub fn parse_reference(image: &str) -> Result<Reference, RegistryError> {
    image
        .trim()
        .parse::<Reference>()
        .map_err(|e| RegistryError::BadReference {
            image: image.to_string(),
            message: e.to_string(),
        })
}

/// A registry client for one image.
pub struct RegistryClient {
    settings: RegistrySettings,
}

impl RegistryClient {
    pub fn new(settings: RegistrySettings) -> RegistryClient {
        RegistryClient { settings }
    }

    fn client(&self, reference: &Reference) -> Client {
        install_crypto_provider();
        let registry = reference.resolve_registry().to_string();
        let protocol = if self.settings.plain_http(&registry) {
            ClientProtocol::HttpsExcept(vec![registry])
        } else {
            ClientProtocol::Https
        };
        Client::new(ClientConfig {
            protocol,
            platform_resolver: Some(Box::new(oci_client::client::linux_amd64_resolver)),
            connect_timeout: Some(Duration::from_secs(15)),
            read_timeout: Some(Duration::from_secs(120)),
            ..ClientConfig::default()
        })
    }

    /// The linux/amd64 manifest and config of `image`.
    pub fn resolve(
        &self,
        image: &str,
        credentials: Option<&RegistryCredentials>,
    ) -> Result<ResolvedImage, RegistryError> {
        let reference = parse_reference(image)?;
        let auth = credentials.map_or(RegistryAuth::Anonymous, RegistryCredentials::auth);
        let client = self.client(&reference);
        let (manifest, digest, config) =
            run_blocking(async { client.pull_manifest_and_config(&reference, &auth).await })?
                .map_err(|e| pull_error(image, e))?;
        let file: oci_client::config::ConfigFile =
            serde_json::from_str(&config).map_err(|source| RegistryError::Config {
                image: image.to_string(),
                source,
            })?;
        let run = file.config.unwrap_or_default();
        Ok(ResolvedImage {
            image: image.to_string(),
            canonical: reference.whole(),
            manifest_digest: digest,
            layers: manifest
                .layers
                .iter()
                .map(|l| ImageLayer {
                    digest: l.digest.clone(),
                    media_type: l.media_type.clone(),
                    size: l.size,
                })
                .collect(),
            config: ImageRunConfig {
                env: run.env.unwrap_or_default(),
                user: run.user.filter(|u| !u.is_empty()),
                working_dir: run.working_dir.filter(|w| !w.is_empty()),
                entrypoint: run.entrypoint.unwrap_or_default(),
                cmd: run.cmd.unwrap_or_default(),
            },
            credentials: credentials.cloned(),
        })
    }

    /// Downloads the blob of `layer` into `dest` (created), verified against its digest.
    pub fn fetch_blob(
        &self,
        image: &ResolvedImage,
        layer: &ImageLayer,
        dest: &Path,
    ) -> Result<(), RegistryError> {
        let reference = parse_reference(&image.canonical)?;
        let auth = image
            .credentials
            .as_ref()
            .map_or(RegistryAuth::Anonymous, RegistryCredentials::auth);
        let client = self.client(&reference);
        let io = |context: String| {
            let image = image.image.clone();
            move |source| RegistryError::Io {
                image,
                context,
                source,
            }
        };
        let limit = max_layer_bytes();
        let declared = u64::try_from(layer.size).unwrap_or(u64::MAX);
        if declared > limit {
            return Err(RegistryError::Pull {
                image: image.image.clone(),
                message: format!(
                    "layer {} is {declared} bytes, above the limit of {limit} \
                     (WARREN_MAX_IMAGE_LAYER_BYTES)",
                    layer.digest
                ),
            });
        }
        let file =
            std::fs::File::create(dest).map_err(io(format!("creating {}", dest.display())))?;
        let descriptor = OciDescriptor {
            media_type: layer.media_type.clone(),
            digest: layer.digest.clone(),
            size: layer.size,
            ..OciDescriptor::default()
        };
        run_blocking(async {
            client
                .auth(&reference, &auth, RegistryOperation::Pull)
                .await?;
            // The digest is checked only at the end: a registry that streams more than the layer's
            // declared size is cut off at that size rather than left to fill the disk.
            let mut out = Bounded::new(tokio::fs::File::from_std(file), declared);
            client.pull_blob(&reference, &descriptor, &mut out).await?;
            tokio::io::AsyncWriteExt::flush(&mut out).await?;
            out.inner.sync_all().await?;
            Ok::<(), oci_client::errors::OciDistributionError>(())
        })?
        .map_err(|e| pull_error(&image.image, e))
    }
}

/// The largest layer blob a pull takes: `WARREN_MAX_IMAGE_LAYER_BYTES`, 8 GiB by default.
fn max_layer_bytes() -> u64 {
    std::env::var("WARREN_MAX_IMAGE_LAYER_BYTES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(8 << 30)
}

/// A writer that takes at most `limit` bytes; more is an error, and nothing past the limit is
/// written.
struct Bounded<W> {
    inner: W,
    written: u64,
    limit: u64,
}

impl<W> Bounded<W> {
    fn new(inner: W, limit: u64) -> Bounded<W> {
        Bounded {
            inner,
            written: 0,
            limit,
        }
    }
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Bounded<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.written + data.len() as u64 > self.limit {
            let limit = self.limit;
            return std::task::Poll::Ready(Err(std::io::Error::other(format!(
                "the registry sent more than the layer's declared {limit} bytes"
            ))));
        }
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, data);
        if let std::task::Poll::Ready(Ok(n)) = &polled {
            self.written += *n as u64;
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn pull_error(image: &str, error: oci_client::errors::OciDistributionError) -> RegistryError {
    use oci_client::errors::OciDistributionError as E;
    match &error {
        E::AuthenticationFailure(_) | E::UnauthorizedError { .. } => RegistryError::Unauthorized {
            image: image.to_string(),
        },
        E::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::Unauthorized
                        | oci_client::errors::OciErrorCode::Denied
                )
            }) =>
        {
            RegistryError::Unauthorized {
                image: image.to_string(),
            }
        }
        _ => RegistryError::Pull {
            image: image.to_string(),
            message: warren_runtime::error_chain(&error),
        },
    }
}

/// rustls needs a process-wide crypto provider when built without a default one (no aws-lc, no
/// OpenSSL): ring. Installing twice is harmless (the second call reports the first one won).
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Runs `future` to completion on its own thread and runtime.
fn run_blocking<F, T>(future: F) -> Result<T, RegistryError>
where
    F: std::future::Future<Output = T> + Send,
    T: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(RegistryError::Runtime)?;
                Ok(runtime.block_on(future))
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_longer_than_declared_is_cut_off_at_its_size() {
        use tokio::io::AsyncWriteExt;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut exact = Bounded::new(Vec::new(), 8);
            exact.write_all(b"12345678").await.unwrap();
            assert_eq!(exact.inner, b"12345678");
            let mut over = Bounded::new(Vec::new(), 8);
            over.write_all(b"1234").await.unwrap();
            let error = over.write_all(b"56789").await.unwrap_err();
            assert!(error.to_string().contains("declared 8 bytes"), "{error}");
            assert_eq!(over.inner, b"1234", "nothing past the limit is written");
        });
    }

    #[test]
    fn loopback_registries_use_plain_http_and_others_do_not() {
        for host in [
            "127.0.0.1:5000",
            "localhost",
            "localhost:5000",
            "[::1]:5000",
            "127.3.4.5",
        ] {
            assert!(is_loopback_registry(host), "{host}");
        }
        for host in [
            "docker.io",
            "10.0.0.1:5000",
            "registry.example:5000",
            "ghcr.io",
        ] {
            assert!(!is_loopback_registry(host), "{host}");
        }
        let settings = RegistrySettings {
            insecure: vec!["registry.lan:5000".into()],
        };
        assert!(settings.plain_http("registry.lan:5000"));
        assert!(!settings.plain_http("registry.lan"));
    }

    #[test]
    fn references_qualify_like_docker() {
        assert_eq!(
            parse_reference("alpine").unwrap().whole(),
            "docker.io/library/alpine:latest"
        );
        assert_eq!(
            parse_reference("127.0.0.1:5000/team/busybox:1")
                .unwrap()
                .whole(),
            "127.0.0.1:5000/team/busybox:1"
        );
        assert!(matches!(
            parse_reference("has space/x:1"),
            Err(RegistryError::BadReference { .. })
        ));
    }

    #[test]
    fn credentials_never_print_the_password() {
        let creds = RegistryCredentials::new("alice", "s3cret-pw");
        let text = format!("{creds:?}");
        assert!(
            text.contains("alice") && !text.contains("s3cret-pw"),
            "{text}"
        );
    }
}
