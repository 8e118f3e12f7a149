//! `warren`: the command-line interface of Warren (see docs/cli.md).

mod args;
mod commands;
mod exit_code;
mod state_dir;
mod table;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let json = cli.global.json;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("warren: error: cannot start the async runtime: {err}");
            return ExitCode::from(exit_code::ERROR as u8);
        }
    };
    let outcome = runtime.block_on(commands::run(cli));
    // `shell` leaves a blocking read of stdin behind that never returns; do not wait for it.
    runtime.shutdown_background();
    let code = match outcome {
        Ok(code) => code,
        Err(err) => {
            report_error(&err, json);
            err.exit_code()
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(exit_code::ERROR as u8))
}

/// Prints the error and its causes on stderr (as one JSON object with `--json`).
fn report_error(err: &commands::CommandError, json: bool) {
    let mut chain = vec![err.to_string()];
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        chain.push(cause.to_string());
        source = cause.source();
    }
    chain.dedup();
    let message = chain.join(": ");
    if json {
        eprintln!(
            "{}",
            serde_json::json!({ "error": message, "exitCode": err.exit_code() })
        );
    } else {
        eprintln!("warren: error: {message}");
    }
}
