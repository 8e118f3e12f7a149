//! `warren up`: runs the server in the foreground.
//!
//! TEMPORARY until the server crate's `serve` lands: reports that this build has no server.

use super::CommandError;
use crate::args::{GlobalArgs, UpArgs};

#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("this build of warren has no server yet")]
    Unavailable,
}

pub async fn run(_global: &GlobalArgs, _args: UpArgs) -> Result<i32, CommandError> {
    Err(UpError::Unavailable.into())
}
