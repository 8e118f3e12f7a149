//! `warren key create|list|revoke`: API keys, kept in the server's store.
//!
//! TEMPORARY until the server crate's store lands: reports that this build has no store.

use super::CommandError;
use crate::args::{GlobalArgs, KeyCommand};
use crate::exit_code;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("this build of warren has no key store yet")]
    Unavailable,
}

impl KeyError {
    pub fn exit_code(&self) -> i32 {
        exit_code::ERROR
    }
}

pub async fn run(_global: &GlobalArgs, _command: KeyCommand) -> Result<i32, CommandError> {
    Err(KeyError::Unavailable.into())
}
