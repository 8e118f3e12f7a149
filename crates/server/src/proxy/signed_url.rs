//! The sandbox of a pre-signed `/files` URL that names none. With `E2B_SANDBOX_URL` set, the SDK's
//! `download_url()` / `upload_url()` are `<sandbox url>/files?path=…&signature=…`: no sandbox ID in
//! the host and no headers (a browser or `curl` follows the link bare). The signature is a hash over
//! the request and the sandbox's access token, so exactly one sandbox's token reproduces it; the
//! proxy routes to that one, and its agent then checks the signature and expiry itself as usual.

use hyper::http::request::Parts;
use hyper::Method;
use warren_proto::envd::signature::{self, constant_time_eq, file_signature};
use warren_proto::envd::ENVD_PORT;

use super::target::Target;
use crate::lifecycle::state::SandboxState;
use crate::store::{SandboxFilter, Store, StoreError};

/// The signed parameters of a `/files` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedFileRequest {
    path: String,
    operation: &'static str,
    username: String,
    signature: String,
    expiration: Option<i64>,
}

/// The signed parameters, when `parts` is a `/files` download or upload that carries a signature.
pub fn signed_file_request(parts: &Parts) -> Option<SignedFileRequest> {
    if parts.uri.path() != "/files" {
        return None;
    }
    let operation = match parts.method {
        Method::GET => signature::READ,
        Method::POST => signature::WRITE,
        _ => return None,
    };
    let query: Vec<(String, String)> = serde_urlencoded::from_str(parts.uri.query()?).ok()?;
    let get = |name: &str| {
        query
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    Some(SignedFileRequest {
        path: get("path").unwrap_or_default(),
        operation,
        username: get("username").unwrap_or_default(),
        signature: get("signature")?,
        expiration: match get("signature_expiration") {
            Some(raw) => Some(raw.parse().ok()?),
            None => None,
        },
    })
}

/// The live sandbox whose access token produced the request's signature, if any.
pub async fn sandbox_of(
    store: &dyn Store,
    request: &SignedFileRequest,
) -> Result<Option<Target>, StoreError> {
    let filter = SandboxFilter {
        states: vec![
            SandboxState::Running,
            SandboxState::Paused,
            SandboxState::Pausing,
            SandboxState::Resuming,
        ],
        ..SandboxFilter::default()
    };
    let found = store
        .list_sandboxes(&filter)
        .await?
        .into_iter()
        .find(|sandbox| {
            sandbox.envd_access_token.as_deref().is_some_and(|token| {
                let expected = file_signature(
                    &request.path,
                    request.operation,
                    &request.username,
                    token,
                    request.expiration,
                );
                constant_time_eq(expected.as_bytes(), request.signature.as_bytes())
            })
        });
    Ok(found.map(|sandbox| Target {
        sandbox_id: sandbox.id,
        port: ENVD_PORT,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: Method, uri: &str) -> Parts {
        hyper::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn only_signed_file_requests_qualify() {
        let download = signed_file_request(&parts(
            Method::GET,
            "/files?path=%2Fhome%2Fuser%2Fa%20b.txt&username=user&signature=v1_x&signature_expiration=17",
        ))
        .unwrap();
        assert_eq!(download.path, "/home/user/a b.txt");
        assert_eq!(download.operation, signature::READ);
        assert_eq!(download.username, "user");
        assert_eq!(download.expiration, Some(17));
        let upload =
            signed_file_request(&parts(Method::POST, "/files?path=a&signature=v1_y")).unwrap();
        assert_eq!(
            (
                upload.operation,
                upload.username.as_str(),
                upload.expiration
            ),
            (signature::WRITE, "", None)
        );
        assert_eq!(
            signed_file_request(&parts(Method::GET, "/files?path=a")),
            None
        );
        assert_eq!(
            signed_file_request(&parts(Method::GET, "/health?signature=v1_x")),
            None
        );
        assert_eq!(
            signed_file_request(&parts(Method::DELETE, "/files?signature=v1_x")),
            None
        );
        assert_eq!(
            signed_file_request(&parts(
                Method::GET,
                "/files?signature=v1_x&signature_expiration=soon"
            )),
            None
        );
    }
}
