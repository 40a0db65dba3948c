//! The host this process runs on, for the names of workers and pauses.

/// The name of the host this process runs on: `HOSTNAME` when the environment sets it (a
/// deployment that names its workers, as a container runtime does), else the kernel's (Linux),
/// else `/etc/hostname`, else `unknown`.
pub(crate) fn host() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .into_iter()
        .chain(
            ["/proc/sys/kernel/hostname", "/etc/hostname"]
                .into_iter()
                .filter_map(|p| std::fs::read_to_string(p).ok()),
        )
        .map(|h| h.trim().to_string())
        .find(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
