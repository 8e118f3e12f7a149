//! Development aid: `warren_server::serve` on this host's Linux runtime, as `warren up` runs it, with
//! state in the directory given as the first argument. Creates an API key and prints the SDK's
//! environment variables.
//!
//! `cargo run -p warren-server --example serve -- /tmp/wt-state [agent-binary]`; `WARREN_API_LISTEN` and
//! `WARREN_PROXY_LISTEN` override the listeners.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

use std::path::PathBuf;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter("warren_server=info,warren_runtime=info")
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let state_dir = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "/tmp/wt-warren-state".to_string()),
    );
    let mut config = warren_server::ServerConfig::new(state_dir.clone());
    config.agent_binary = args.next().map(PathBuf::from);
    if let Ok(listen) = std::env::var("WARREN_API_LISTEN") {
        config.api_listen = listen.parse()?;
    }
    if let Ok(listen) = std::env::var("WARREN_PROXY_LISTEN") {
        config.proxy_listen = listen.parse()?;
    }
    let store = warren_server::open_store(&state_dir).await?;
    let key = warren_server::keys::create_key(store.as_ref(), "example", "default", true).await?;
    println!("export E2B_API_URL=http://{}", config.api_listen);
    println!(
        "export E2B_SANDBOX_URL=http://127.0.0.1:{}",
        config.proxy_listen.port()
    );
    println!("export E2B_API_KEY={}", key.secret);
    warren_server::serve(config).await?;
    Ok(())
}
