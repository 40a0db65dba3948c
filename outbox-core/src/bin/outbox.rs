//! `outbox`: operate an outbox without linking any handler: migrate, stats, dead letters,
//! purge. Run `outbox --help`.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    outbox::cli::ops::main().await
}
