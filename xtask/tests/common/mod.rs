//! What the bench's and the soak's smoke tests share.

/// Pids of live processes whose environment contains `needle` (every child of a bench or
/// soak run has `SMCD_SOCKET` pointing into its run's directory, named after its pid).
pub fn processes_with_env(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(env) = std::fs::read(e.path().join("environ"))
            && String::from_utf8_lossy(&env).contains(needle)
        {
            found.push(pid);
        }
    }
    found
}
