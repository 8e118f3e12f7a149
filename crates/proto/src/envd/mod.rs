//! envd wire types: the `process` and `filesystem` protobuf packages (prost messages with
//! proto3-JSON serde impls) and the version string the agent reports.

/// The envd version Warren's agent reports (REST `envdVersion`, `/health`, `X-Envd-Version`).
/// The SDK gates features on it: >= 0.6.4 enables recursive watch, default user, stdin control,
/// octet-stream/gzip uploads, file metadata, watch entry info and the network-mount flag, all of
/// which the agent implements.
pub const ENVD_VERSION: &str = "0.6.4";

/// The TCP port envd listens on inside a sandbox.
pub const ENVD_PORT: u16 = 49983;

pub mod signature;

#[allow(clippy::all, missing_docs)]
pub mod process {
    include!(concat!(env!("OUT_DIR"), "/process.rs"));
    include!(concat!(env!("OUT_DIR"), "/process.serde.rs"));
}

#[allow(clippy::all, missing_docs)]
pub mod filesystem {
    include!(concat!(env!("OUT_DIR"), "/filesystem.rs"));
    include!(concat!(env!("OUT_DIR"), "/filesystem.serde.rs"));
}

#[cfg(test)]
mod tests {
    use super::filesystem::{EntryInfo, FileType};
    use super::process::{process_event, ProcessEvent};

    #[test]
    fn json_uses_camel_case_enum_names_and_base64_bytes() {
        let event = ProcessEvent {
            event: Some(process_event::Event::Data(process_event::DataEvent {
                output: Some(process_event::data_event::Output::Stdout(b"hi".to_vec())),
            })),
        };
        let json = serde_json::to_string(&event).unwrap();
        assert_eq!(json, r#"{"data":{"stdout":"aGk="}}"#);
        let entry = EntryInfo {
            name: "a".into(),
            r#type: FileType::Directory as i32,
            is_symlink: true,
            size: 5,
            ..Default::default()
        };
        let json = serde_json::to_string(&entry).unwrap();
        assert!(json.contains(r#""type":"FILE_TYPE_DIRECTORY""#), "{json}");
        assert!(json.contains(r#""isSymlink":true"#), "{json}");
        assert!(json.contains(r#""size":"5""#), "{json}");
    }

    #[test]
    fn json_decoding_accepts_snake_case_and_ignores_unknown_fields() {
        let req: super::process::StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/true","args":["x"]},"stdin":false,"future_field":1}"#,
        )
        .unwrap();
        assert_eq!(req.process.unwrap().cmd, "/bin/true");
        assert_eq!(req.stdin, Some(false));
    }
}
