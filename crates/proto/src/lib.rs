//! warren-proto: wire types shared by Warren's crates.
pub mod connect;
pub mod envd;
