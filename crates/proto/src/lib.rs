//! warren-proto: wire types shared by Warren's crates.
pub mod api;
pub mod body_drain;
pub mod connect;
pub mod envd;
