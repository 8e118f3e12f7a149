//! The envd protobuf messages this client uses, laid out exactly as prost generates them from
//! `crates/proto/proto/{process,filesystem}` (same module paths, names and field numbers).
//!
//! TEMPORARY: replaced by `warren_proto::envd::{process, filesystem}` once the agent's proto crate
//! lands; the rest of the client only names these paths, so the swap is a `use` change.

#![allow(clippy::derive_partial_eq_without_eq)]

pub mod process {
    use std::collections::HashMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Pty {
        #[prost(message, optional, tag = "1")]
        pub size: Option<pty::Size>,
    }
    pub mod pty {
        #[derive(Clone, Copy, PartialEq, prost::Message)]
        pub struct Size {
            #[prost(uint32, tag = "1")]
            pub cols: u32,
            #[prost(uint32, tag = "2")]
            pub rows: u32,
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessConfig {
        #[prost(string, tag = "1")]
        pub cmd: String,
        #[prost(string, repeated, tag = "2")]
        pub args: Vec<String>,
        #[prost(map = "string, string", tag = "3")]
        pub envs: HashMap<String, String>,
        #[prost(string, optional, tag = "4")]
        pub cwd: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessSelector {
        #[prost(oneof = "process_selector::Selector", tags = "1, 2")]
        pub selector: Option<process_selector::Selector>,
    }
    pub mod process_selector {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Selector {
            #[prost(uint32, tag = "1")]
            Pid(u32),
            #[prost(string, tag = "2")]
            Tag(String),
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StartRequest {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessConfig>,
        #[prost(message, optional, tag = "2")]
        pub pty: Option<Pty>,
        #[prost(string, optional, tag = "3")]
        pub tag: Option<String>,
        #[prost(bool, optional, tag = "4")]
        pub stdin: Option<bool>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateRequest {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessSelector>,
        #[prost(message, optional, tag = "2")]
        pub pty: Option<Pty>,
    }
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct UpdateResponse {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessEvent {
        #[prost(oneof = "process_event::Event", tags = "1, 2, 3, 4")]
        pub event: Option<process_event::Event>,
    }
    pub mod process_event {
        #[derive(Clone, Copy, PartialEq, prost::Message)]
        pub struct StartEvent {
            #[prost(uint32, tag = "1")]
            pub pid: u32,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct DataEvent {
            #[prost(oneof = "data_event::Output", tags = "1, 2, 3")]
            pub output: Option<data_event::Output>,
        }
        pub mod data_event {
            #[derive(Clone, PartialEq, prost::Oneof)]
            pub enum Output {
                #[prost(bytes, tag = "1")]
                Stdout(Vec<u8>),
                #[prost(bytes, tag = "2")]
                Stderr(Vec<u8>),
                #[prost(bytes, tag = "3")]
                Pty(Vec<u8>),
            }
        }
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct EndEvent {
            #[prost(sint32, tag = "1")]
            pub exit_code: i32,
            #[prost(bool, tag = "2")]
            pub exited: bool,
            #[prost(string, tag = "3")]
            pub status: String,
            #[prost(string, optional, tag = "4")]
            pub error: Option<String>,
        }
        #[derive(Clone, Copy, PartialEq, prost::Message)]
        pub struct KeepAlive {}

        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Event {
            #[prost(message, tag = "1")]
            Start(StartEvent),
            #[prost(message, tag = "2")]
            Data(DataEvent),
            #[prost(message, tag = "3")]
            End(EndEvent),
            #[prost(message, tag = "4")]
            Keepalive(KeepAlive),
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StartResponse {
        #[prost(message, optional, tag = "1")]
        pub event: Option<ProcessEvent>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessInput {
        #[prost(oneof = "process_input::Input", tags = "1, 2")]
        pub input: Option<process_input::Input>,
    }
    pub mod process_input {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Input {
            #[prost(bytes, tag = "1")]
            Stdin(Vec<u8>),
            #[prost(bytes, tag = "2")]
            Pty(Vec<u8>),
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SendInputRequest {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessSelector>,
        #[prost(message, optional, tag = "2")]
        pub input: Option<ProcessInput>,
    }
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct SendInputResponse {}

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Signal {
        Unspecified = 0,
        Sigkill = 9,
        Sigterm = 15,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SendSignalRequest {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessSelector>,
        #[prost(enumeration = "Signal", tag = "2")]
        pub signal: i32,
    }
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct SendSignalResponse {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CloseStdinRequest {
        #[prost(message, optional, tag = "1")]
        pub process: Option<ProcessSelector>,
    }
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct CloseStdinResponse {}
}

pub mod filesystem {
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum FileType {
        Unspecified = 0,
        File = 1,
        Directory = 2,
        Symlink = 3,
    }

    /// The fields the client reads; prost skips the others (modified time, metadata).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EntryInfo {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(enumeration = "FileType", tag = "2")]
        pub r#type: i32,
        #[prost(string, tag = "3")]
        pub path: String,
        #[prost(int64, tag = "4")]
        pub size: i64,
        #[prost(uint32, tag = "5")]
        pub mode: u32,
        #[prost(string, tag = "6")]
        pub permissions: String,
        #[prost(string, tag = "7")]
        pub owner: String,
        #[prost(string, tag = "8")]
        pub group: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListDirRequest {
        #[prost(string, tag = "1")]
        pub path: String,
        #[prost(uint32, tag = "2")]
        pub depth: u32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListDirResponse {
        #[prost(message, repeated, tag = "1")]
        pub entries: Vec<EntryInfo>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MakeDirRequest {
        #[prost(string, tag = "1")]
        pub path: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MakeDirResponse {
        #[prost(message, optional, tag = "1")]
        pub entry: Option<EntryInfo>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RemoveRequest {
        #[prost(string, tag = "1")]
        pub path: String,
    }
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct RemoveResponse {}
}
