//! What each `warren` subcommand does. Each returns the process exit code on success paths that
//! still need a non-zero code (exec, partial kill), or a [`CommandError`] that maps to one.

pub mod down;
pub mod events;
pub mod gc;
pub mod key;
pub mod lab;
pub mod logs;
pub mod node;
pub mod nodes;
pub mod sandbox;
pub mod shell;
pub mod template;
pub mod up;
pub mod workspace;

use serde::Serialize;
use warren_client::{ApiClient, ApiError, EnvdError};

use crate::args::{Cli, Command, GlobalArgs};
use crate::exit_code;

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(transparent)]
    Envd(#[from] EnvdError),
    #[error("{0}")]
    Usage(String),
    #[error("terminal")]
    Terminal(#[source] std::io::Error),
    #[error("writing output")]
    Output(#[source] std::io::Error),
    #[error(transparent)]
    Server(#[from] up::UpError),
    #[error(transparent)]
    Key(#[from] key::KeyError),
    #[error(transparent)]
    Template(#[from] template::TemplateError),
    #[error(transparent)]
    Down(#[from] down::DownError),
    #[error(transparent)]
    Lab(#[from] lab::LabError),
    #[error(transparent)]
    Node(#[from] node::NodeCommandError),
}

impl CommandError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CommandError::Api(err) => exit_code::for_kind(err.kind()),
            CommandError::Envd(err) => exit_code::for_kind(err.kind()),
            CommandError::Usage(_) => exit_code::USAGE,
            CommandError::Key(err) => err.exit_code(),
            CommandError::Template(_) | CommandError::Down(_) | CommandError::Node(_) => {
                exit_code::ERROR
            }
            CommandError::Lab(lab::LabError::NoLevel(_)) => exit_code::USAGE,
            CommandError::Lab(_) => exit_code::ERROR,
            CommandError::Terminal(_) | CommandError::Output(_) | CommandError::Server(_) => {
                exit_code::ERROR
            }
        }
    }
}

/// Runs the parsed command line; returns the exit code.
pub async fn run(cli: Cli) -> Result<i32, CommandError> {
    let global = cli.global;
    match cli.command {
        Command::Up(args) => up::run(&global, *args).await,
        Command::Sandbox(command) => sandbox::run(&global, command).await,
        Command::Template(command) => template::run(&global, command).await,
        Command::Key(command) => key::run(&global, command).await,
        Command::Team(command) => key::run_team(&global, command).await,
        Command::Workspace(command) => workspace::run(&global, command).await,
        Command::Events(args) => events::run(&global, args).await,
        Command::Down(args) => down::run(&global, args).await,
        Command::Node(args) => node::run(*args).await,
        Command::Nodes(command) => nodes::run(&global, command).await,
        Command::Servers(command) => nodes::servers(&global, command).await,
        Command::Gc(args) => gc::run(&global, args),
        Command::Lab(command) => lab::run(&global, command).await,
    }
}

/// The API key: `--api-key`, else `E2B_API_KEY` (both through clap), else `WARREN_API_KEY`.
pub fn api_key(global: &GlobalArgs) -> Option<String> {
    global
        .api_key
        .clone()
        .or_else(|| std::env::var("WARREN_API_KEY").ok())
        .filter(|key| !key.is_empty())
}

pub fn api_client(global: &GlobalArgs) -> Result<ApiClient, CommandError> {
    Ok(ApiClient::new(&global.api_url, api_key(global))?)
}

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> Result<(), CommandError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| CommandError::Output(e.into()))?;
    println!("{text}");
    Ok(())
}
