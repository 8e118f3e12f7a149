//! Template builds: an e2b.Dockerfile + e2b.toml, or the SDK's Template builder request, becomes a build
//! plan (base + cached, content-addressed layer steps), each RUN executed inside a real Warren sandbox,
//! and the result recorded as a template version the server can start sandboxes from.
//!
//! Pure parts (`words`, `dockerfile`, `e2b_toml`, `dockerignore`, `base_image`, `context`, `plan`,
//! `dockerfile_plan`, `sdk_template`) have no side effects beyond reading the build context.

pub mod agent_commands;
pub mod base_image;
pub mod context;
pub mod dockerfile;
pub mod dockerfile_plan;
pub mod dockerignore;
pub mod e2b_toml;
pub mod instantiate;
pub mod job;
pub mod layers;
pub mod plan;
pub mod runner;
pub mod sdk_template;
pub mod service;
pub mod uploads;
pub mod versions;
pub mod words;
