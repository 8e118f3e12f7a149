//! Starting a sandbox from a finished template version: restore its checkpoint, or create it on the
//! template's layers and (for a cold template) run start_cmd and wait for ready_cmd, as the build's
//! finalize step did. The server's lifecycle calls this from its create path.

use std::time::{Duration, Instant};

use warren_runtime::{NetworkSpec, Resources, Runtime, RuntimeError, Sandbox, SandboxSpec};

use super::agent_commands::{BackgroundProcess, CommandError, CommandRunner, CommandSpec};
use super::versions::{BuiltTemplate, TemplateStart};

#[derive(Debug, thiserror::Error)]
pub enum InstantiateError {
    #[error("starting sandbox {id} from template {template_id}: {source}")]
    Runtime {
        id: String,
        template_id: String,
        #[source]
        source: RuntimeError,
    },
    #[error("sandbox {id}: start_cmd: {source}")]
    Command {
        id: String,
        #[source]
        source: Box<CommandError>,
    },
    #[error("sandbox {id}: start_cmd exited with code {code} before ready_cmd succeeded")]
    StartExited { id: String, code: i32 },
    #[error("sandbox {id}: ready_cmd did not succeed within {seconds}s")]
    NotReady { id: String, seconds: u64 },
}

/// A sandbox of a template; `start_process` follows a cold template's start_cmd (drop it to stop
/// following; the process keeps running).
pub struct TemplateSandbox {
    pub sandbox: Sandbox,
    pub start_process: Option<Box<dyn BackgroundProcess>>,
}

/// Creates sandbox `id` from `built`. On failure after the sandbox exists it is destroyed again.
pub fn start_sandbox(
    runtime: &dyn Runtime,
    commands: &dyn CommandRunner,
    built: &BuiltTemplate,
    id: &str,
    resources: Resources,
    network: NetworkSpec,
    ready_timeout: Duration,
) -> Result<TemplateSandbox, InstantiateError> {
    let spec = SandboxSpec {
        id: id.to_string(),
        layers: built.layers.clone(),
        resources,
        network,
        syscalls: Default::default(),
        volumes: Vec::new(),
    };
    let runtime_err = |source| InstantiateError::Runtime {
        id: id.to_string(),
        template_id: built.template_id.clone(),
        source,
    };
    let sandbox = match &built.start {
        TemplateStart::Checkpoint { dir } => runtime.restore(dir, &spec).map_err(runtime_err)?,
        TemplateStart::Plain | TemplateStart::Cold => runtime.create(&spec).map_err(runtime_err)?,
    };
    if built.start != TemplateStart::Cold {
        return Ok(TemplateSandbox {
            sandbox,
            start_process: None,
        });
    }
    match run_start_cmd(commands, built, &sandbox, ready_timeout) {
        Ok(process) => Ok(TemplateSandbox {
            sandbox,
            start_process: Some(process),
        }),
        Err(e) => {
            if let Err(destroy) = runtime.destroy(id) {
                tracing::warn!(sandbox = id, error = %destroy, "destroying a sandbox whose start failed");
            }
            Err(e)
        }
    }
}

/// Runs start_cmd in `sandbox` and waits until ready_cmd succeeds (the server's create path uses this
/// for templates whose sandboxes it creates itself).
pub fn run_start_cmd(
    commands: &dyn CommandRunner,
    built: &BuiltTemplate,
    sandbox: &Sandbox,
    ready_timeout: Duration,
) -> Result<Box<dyn BackgroundProcess>, InstantiateError> {
    let id = sandbox.id.clone();
    let command_err = |source| InstantiateError::Command {
        id: id.clone(),
        source: Box::new(source),
    };
    let shell = |cmd: &str| CommandSpec {
        argv: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
        env: built.env.clone(),
        cwd: built.workdir.clone(),
        user: built.user.clone(),
        tag: None,
    };
    let Some(start_cmd) = built.start_cmd.as_deref() else {
        return Err(InstantiateError::StartExited { id, code: -1 });
    };
    let process = commands
        .spawn(
            sandbox.agent_addr(),
            &CommandSpec {
                tag: Some(super::agent_commands::START_CMD_TAG.into()),
                ..shell(start_cmd)
            },
            Box::new(|_, _| {}),
        )
        .map_err(command_err)?;
    let started = Instant::now();
    loop {
        if let Some(code) = process.exit_code() {
            return Err(InstantiateError::StartExited { id, code });
        }
        let ready = match built.ready_cmd.as_deref() {
            Some(cmd) => {
                commands
                    .run(sandbox.agent_addr(), &shell(cmd), &mut |_, _| {})
                    .map_err(command_err)?
                    == 0
            }
            None => started.elapsed() >= Duration::from_secs(2),
        };
        if ready {
            return Ok(process);
        }
        if started.elapsed() >= ready_timeout {
            return Err(InstantiateError::NotReady {
                id,
                seconds: ready_timeout.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
