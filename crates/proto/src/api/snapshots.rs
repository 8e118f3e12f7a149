//! Fork and snapshot bodies (`POST /sandboxes/{id}/fork`, `POST /sandboxes/{id}/snapshots`,
//! `GET /snapshots`), as the official SDK 2.63 sends and parses them.

use serde::{Deserialize, Serialize};

use super::{Error, Sandbox};

/// Body of `POST /sandboxes/{id}/fork`; E2B's defaults are 15 s and one fork.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxForkRequest {
    /// Time to live of every fork, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
    /// How many forks, 1..=20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
}

/// One requested fork: exactly one of `sandbox` and `error` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxForkResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Error>,
}

/// Body of `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxSnapshotRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `false` asks for a filesystem-only snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// A snapshot as `create_snapshot` returns it and `GET /snapshots` lists it. The `snapshotID` is usable as
/// a `templateID` in `POST /sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
    /// Warren's additions (the SDK keeps unknown fields): the source sandbox, bytes on disk, creation time.
    #[serde(rename = "sandboxID", default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_result_carries_one_of_sandbox_or_error() {
        let failed = SandboxForkResult {
            sandbox: None,
            error: Some(Error {
                code: 429,
                message: "full".into(),
                error_code: None,
            }),
        };
        let json = serde_json::to_value(&failed).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"error": {"code": 429, "message": "full"}})
        );
        let request: SandboxForkRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(request, SandboxForkRequest::default());
    }

    #[test]
    fn snapshot_info_uses_e2b_names() {
        let info = SnapshotInfo {
            snapshot_id: "snap-a".into(),
            names: vec!["snap-a".into()],
            sandbox_id: None,
            size_bytes: None,
            created_at: None,
        };
        assert_eq!(
            serde_json::to_value(&info).unwrap(),
            serde_json::json!({"snapshotID": "snap-a", "names": ["snap-a"]})
        );
    }
}
