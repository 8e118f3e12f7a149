//! `warren sandbox shell`: an interactive terminal in a sandbox, like `e2b sandbox connect`.
//!
//! Starts a login shell on a PTY through envd, puts the local terminal in raw mode, copies keystrokes
//! to the PTY and its output to stdout, and forwards the window size on SIGWINCH. The terminal is
//! restored however the session ends.

use std::io::Write;

use tokio::io::AsyncReadExt;
use tokio::signal::unix::{signal, SignalKind};
use warren_client::{ProcessOutput, ProcessSpec};

use super::{sandbox::envd_client, CommandError};
use crate::args::{GlobalArgs, ShellArgs};
use crate::exit_code;

/// Puts the terminal in raw mode for as long as it lives.
struct RawModeGuard;

impl RawModeGuard {
    fn enable() -> Result<RawModeGuard, CommandError> {
        crossterm::terminal::enable_raw_mode().map_err(CommandError::Terminal)?;
        Ok(RawModeGuard)
    }
}

impl Drop for RawModeGuard {
    fn drop(&mut self) {
        // Nothing useful can be done if restoring fails; the user's shell `reset` still works.
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

fn terminal_size() -> (u16, u16) {
    crossterm::terminal::size().unwrap_or((80, 24))
}

pub async fn run(global: &GlobalArgs, args: ShellArgs) -> Result<i32, CommandError> {
    if !crossterm::tty::IsTty::is_tty(&std::io::stdin()) {
        return Err(CommandError::Usage(
            "`warren sandbox shell` needs a terminal on stdin; use `warren sandbox exec` for scripts".into(),
        ));
    }
    let envd = envd_client(global, &args.id, &args.user).await?;
    let term = std::env::var("TERM")
        .ok()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "xterm-256color".into());
    let spec = ProcessSpec {
        cmd: args.shell,
        args: vec!["-i".into(), "-l".into()],
        envs: [
            ("TERM", term.as_str()),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C.UTF-8"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        cwd: args.cwd,
        pty: Some(terminal_size()),
        stdin: false,
    };
    let mut stream = envd.start(&spec).await?;
    let pid = match stream.next().await? {
        Some(ProcessOutput::Started { pid }) => pid,
        other => {
            return Err(CommandError::Envd(warren_client::EnvdError::Rpc {
                code: "internal".into(),
                message: format!("envd did not start the shell (first event: {other:?})"),
            }))
        }
    };

    let _raw = RawModeGuard::enable()?;
    let mut resized = signal(SignalKind::window_change()).map_err(CommandError::Terminal)?;
    let mut stdin = tokio::io::stdin();
    let mut stdout = std::io::stdout();
    let mut keys = [0u8; 4096];
    let mut stdin_open = true;
    let code = loop {
        tokio::select! {
            event = stream.next() => match event? {
                Some(ProcessOutput::Pty(bytes) | ProcessOutput::Stdout(bytes) | ProcessOutput::Stderr(bytes)) => {
                    stdout.write_all(&bytes).and_then(|()| stdout.flush()).map_err(CommandError::Output)?;
                }
                Some(ProcessOutput::Ended(end)) => break end.shell_exit_code(),
                Some(ProcessOutput::Started { .. }) => {}
                None => break exit_code::ERROR,
            },
            read = stdin.read(&mut keys), if stdin_open => match read {
                Ok(0) => stdin_open = false,
                Ok(n) => envd.send_pty_input(pid, keys[..n].to_vec()).await?,
                Err(err) => return Err(CommandError::Terminal(err)),
            },
            _ = resized.recv() => {
                let (cols, rows) = terminal_size();
                envd.resize_pty(pid, cols, rows).await?;
            }
        }
    };
    Ok(code)
}
