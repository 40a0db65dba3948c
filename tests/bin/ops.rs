//! The `outbox` operations command line, built in the test package so its tests can run it.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    outbox::cli::ops::main().await
}
