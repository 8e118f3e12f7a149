//! warren-server

/// Template builds. Temporary declaration on the `templates` branch: the server's own `templates/mod.rs`
/// mounts `build` once it exists.
pub mod templates {
    pub mod build;
}
