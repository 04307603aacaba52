//! `smcd`: the per-host SMC control plane. It owns the loopback ISM device (GIDs, DMB tokens
//! and the memory behind them), knows the SMC listeners, and serves its socket. Runs in the
//! foreground, logs through `tracing` (`RUST_LOG`), removes its socket and exits cleanly on
//! SIGTERM or SIGINT.

use anyhow::Context;
use clap::Parser;
use rustix::fd::{FromRawFd, OwnedFd};
use smcd_engine::control::daemon::{Daemon, SynOptionInfo};
use smcd_engine::control::device::DeviceState;
use smcd_engine::control::server::Server;
use std::path::PathBuf;

#[derive(Debug, Parser)]
// clap names the program after the package: `--version` printed `smcd-engine 0.1.0` while the
// binary lived there, and still does.
#[command(
    name = "smcd-engine",
    version,
    about = "User-space SMC daemon: the loopback ISM device and the control socket"
)]
struct Args {
    /// Socket path.
    #[arg(long, env = "SMCD_SOCKET", default_value = smcd_engine::ipc::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Most DMBs the loopback device holds at once (the kernel's loopback-ism: 5000).
    #[arg(long, default_value_t = smcd_engine::control::device::DEFAULT_MAX_DMBS)]
    max_dmbs: usize,
    /// Members of this group (name or number) may change state, besides root.
    #[arg(long)]
    admin_group: Option<String>,
    /// The cgroup v2 directory to attach the SMC TCP option program to (its sockets and
    /// those of every cgroup below it carry the option). Default: the cgroup2 mount.
    #[arg(long, value_name = "PATH", conflicts_with = "no_bpf")]
    bpf_cgroup: Option<PathBuf>,
    /// Do not load the SMC TCP option program: engines use intents only.
    #[arg(long)]
    no_bpf: bool,
}

/// Loads and attaches the SMC option program, or says why not: smcd then runs as without it
/// (intents), which is never an error. The second value is what `INFO` reports.
fn attach_syn_option(args: &Args) -> (Option<smcd_engine::bpf::loader::Attached>, SynOptionInfo) {
    use smcd_engine::bpf::loader;
    let off = |status: String| {
        (
            None,
            SynOptionInfo {
                attached: false,
                cgroup: None,
                status,
            },
        )
    };
    if args.no_bpf {
        tracing::info!("SMC TCP option: off (--no-bpf); engines use intents");
        return off("off (--no-bpf)".into());
    }
    let Some(cgroup) = args.bpf_cgroup.clone().or_else(loader::default_cgroup) else {
        tracing::warn!("SMC TCP option: no cgroup2 mount found; engines use intents");
        return off("no cgroup2 mount found".into());
    };
    match loader::attach(&cgroup) {
        Ok(a) => {
            tracing::info!(cgroup = %cgroup.display(), "SMC TCP option: BPF program attached");
            let info = SynOptionInfo {
                attached: true,
                cgroup: Some(cgroup.display().to_string()),
                status: "BPF sock_ops program attached".into(),
            };
            (Some(a), info)
        }
        Err(e) => {
            tracing::warn!(cgroup = %cgroup.display(), "SMC TCP option: not attached ({e}); engines use intents");
            // The first line of the reason (a verifier log can follow it).
            let why = e.to_string();
            let why = why.lines().next().unwrap_or_default();
            off(format!("not attached to {}: {why}", cgroup.display()))
        }
    }
}

/// A group name or number to its id (`/etc/group`).
fn group_id(g: &str) -> anyhow::Result<u32> {
    if let Ok(n) = g.parse() {
        return Ok(n);
    }
    let groups = std::fs::read_to_string("/etc/group").context("reading /etc/group")?;
    groups
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let _ = f.next();
            let gid = f.next()?.parse().ok()?;
            (name == g).then_some(gid)
        })
        .next()
        .with_context(|| format!("no group named {g}"))
}

/// Blocks SIGTERM and SIGINT and returns a signalfd that becomes readable when one arrives.
fn signal_fd() -> anyhow::Result<OwnedFd> {
    // SAFETY: plain libc calls on a zeroed sigset_t we own; called before any thread starts, so
    // the mask is inherited by none we did not intend.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            anyhow::bail!("pthread_sigmask failed");
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("signalfd");
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// The host's system EID. The kernel has none off s390 (there a user EID must be set);
/// `smcd` serves exactly one host, so a SEID derived from the machine id names that host's
/// communication space and lets SMC-D work without configuration.
fn system_eid() -> String {
    let id = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    let hex: String = id
        .trim()
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(12)
        .collect::<String>()
        .to_ascii_uppercase();
    format!("SMCD-USERSPACE-SEID-{hex:0>12}")
}

/// Every client holds a descriptor here: allow as many as the hard limit does.
fn raise_nofile() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: lim.maximum,
                maximum: lim.maximum,
            },
        );
    }
}

fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    raise_nofile();
    let sig = signal_fd()?;
    // After SIGTERM and SIGINT are blocked (the reporter thread inherits the mask, so they
    // still reach only the signalfd) and before any other thread starts: `cargo xtask bench`
    // counts smcd's wake-ups per connection with it.
    smcd_engine::sys::report_context_switches_on_sigusr1("smcd")?;
    let mut device = DeviceState::new(system_eid(), hostname()).context("device state")?;
    device.max_dmbs = args.max_dmbs;
    // Attached before the socket exists, so every engine's HELLO gets the maps. The link's
    // only descriptor is in `syn_option`: the program is detached when smcd ends, however.
    let (syn_option, mut info) = attach_syn_option(&args);
    if let Some(a) = &syn_option {
        match a.maps().try_clone() {
            Ok(m) => device.set_syn_option(m),
            Err(e) => {
                tracing::warn!("SMC TCP option: cannot share the maps ({e}); engines use intents");
                info.attached = false;
                info.status = format!("attached, but the maps cannot be shared: {e}");
            }
        }
    }
    let mut daemon = Daemon::new(device);
    daemon.syn_option = info;
    match &daemon.rnics.why_none {
        None => {
            let names: Vec<&str> = daemon
                .rnics
                .list
                .iter()
                .map(|r| r.info.name.as_str())
                .collect();
            tracing::info!("RDMA devices: {}", names.join(", "));
        }
        Some(why) => tracing::info!("RDMA devices: none ({why})"),
    }
    daemon.admin_gid = args.admin_group.as_deref().map(group_id).transpose()?;
    let mut server = Server::bind(&args.socket, daemon, Some(&sig))
        .with_context(|| format!("cannot listen on {}", args.socket.display()))?;
    tracing::info!(socket = %args.socket.display(), seid = %server.daemon.device.seid, "smcd ready");
    server.run().context("server loop")?;
    tracing::info!("smcd stopping");
    drop(server);
    if let Some(a) = syn_option {
        a.detach();
    }
    Ok(())
}
