//! The machine line (CPU model, cores, kernel), the CPUs to pin to, the source revision and
//! UTC timestamps, so every result says where and from what it came.

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where a run happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model from /proc/cpuinfo.
    pub cpu: String,
    /// Online logical CPUs.
    pub cores: usize,
    /// Kernel name and release (uname -sr).
    pub kernel: String,
    /// One line with all three, as printed.
    pub line: String,
}

impl Machine {
    /// Reads /proc and uname.
    pub fn detect() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                matches!(k.trim(), "model name" | "Model" | "cpu model" | "Processor")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        // SAFETY: sysconf has no memory effects.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let cores = if online > 0 {
            online as usize
        } else {
            cpuinfo
                .lines()
                .filter(|l| l.starts_with("processor"))
                .count()
                .max(1)
        };
        let kernel = uname();
        let line = format!("{cpu}, {cores} cores, {kernel}");
        Machine {
            cpu,
            cores,
            kernel,
            line,
        }
    }
}

fn uname() -> String {
    // SAFETY: utsname is plain data that uname fills with NUL-terminated strings.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "unknown kernel".into();
        }
        let s = |f: &[libc::c_char]| {
            std::ffi::CStr::from_ptr(f.as_ptr())
                .to_string_lossy()
                .into_owned()
        };
        format!("{} {}", s(&u.sysname), s(&u.release))
    }
}

/// The 1, 5 and 15 minute load averages (/proc/loadavg).
pub fn load_average() -> Option<[f64; 3]> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = s.split_whitespace().map(|x| x.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// The CPUs this process may run on (its affinity mask), in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it; CPU_ISSET reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Where the client and the server run: the first two allowed CPUs, or anywhere with fewer.
pub fn client_server_cpus() -> (Option<usize>, Option<usize>) {
    match allowed_cpus()[..] {
        [c, s, ..] => (Some(c), Some(s)),
        _ => (None, None),
    }
}

/// How many sockets are in TIME_WAIT on a local port of the ephemeral range, and the size of
/// that range (from /proc/net/tcp{,6} and ip_local_port_range).
pub fn ephemeral_time_wait() -> Option<(usize, usize)> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = range.split_whitespace().map(|x| x.parse::<u32>());
    let (lo, hi) = (it.next()?.ok()?, it.next()?.ok()?);
    let mut tw = 0;
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(s) = std::fs::read_to_string(f) else {
            continue;
        };
        for line in s.lines().skip(1) {
            let mut cols = line.split_whitespace();
            let local = cols.nth(1).unwrap_or_default();
            let state = cols.nth(1).unwrap_or_default();
            let port = local
                .rsplit(':')
                .next()
                .and_then(|p| u32::from_str_radix(p, 16).ok());
            if state == "06" && port.is_some_and(|p| (lo..=hi).contains(&p)) {
                tw += 1;
            }
        }
    }
    Some((tw, (hi - lo + 1) as usize))
}

/// `git describe`-like revision of the workspace: short hash, `-dirty` when modified.
pub fn git_revision(root: &Path) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let mut rev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dirty = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    if dirty {
        rev.push_str("-dirty");
    }
    Some(rev)
}

/// Seconds since the epoch → (year, month, day, hour, minute, second) in UTC.
fn civil(secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days_from_civil inverse.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

/// Now, as `2026-11-30T14:16:32Z`.
pub fn now_iso() -> String {
    let (y, mo, d, h, mi, s) = civil(epoch_secs());
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// Now, as `20261130-141632` (for file names).
pub fn now_stamp() -> String {
    let (y, mo, d, h, mi, s) = civil(epoch_secs());
    format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}")
}

fn epoch_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::civil;

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1, 0, 0, 0));
        // 2000-02-29 12:34:56
        assert_eq!(civil(951_827_696), (2000, 2, 29, 12, 34, 56));
        // 2026-11-30 00:00:00
        assert_eq!(civil(1_795_996_800), (2026, 11, 30, 0, 0, 0));
    }
}
