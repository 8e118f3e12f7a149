//! Development aid: a real Warren server on the tests' fake runtime (no namespaces needed), for poking at
//! the API and proxy with the official SDK. Prints the SDK's environment variables, serves until Ctrl-C.
//!
//! `cargo run -p warren-server --example fake_server`

#[path = "../tests/support/fake_runtime.rs"]
#[allow(dead_code)]
mod fake_runtime;

use std::path::PathBuf;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter("warren_server=info")
        .init();
    let runtime = fake_runtime::FakeRuntime::new(std::env::var_os("WT_FAKE_CHECKPOINT").is_some());
    let server =
        warren_testkit::TestServer::start(runtime, PathBuf::from("/nonexistent/wt-rootfs"), |_| {})
            .await?;
    for (name, value) in server.sdk_env() {
        println!("export {name}={value}");
    }
    tokio::signal::ctrl_c().await?;
    server.stop().await?;
    Ok(())
}
