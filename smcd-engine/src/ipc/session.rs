//! An engine's registration with `smcd`: its identity (GID, engine id, namespace), the pages
//! smcd shares with it (sysctls, the listener table, listener pages) and its status area, and
//! the requests that stand in for the SMC option of a TCP SYN (connect intents, listener
//! registration). The devices smcd provides build on it (`device::loopback`).
//!
//! An engine keeps a small pool of channels to `smcd`; all carry the same session key, so
//! `smcd` sees one engine with one GID. A request takes a channel from the pool for one round
//! trip and puts it back, so concurrent connection setups do not queue behind each other.

use super::channel::Channel;
use crate::layout::status::StatusArea;
use crate::layout::{ListenerPage, ListenerTable, SysctlPage};
use crate::sys::random_u64;
use rustix::fd::{AsFd, OwnedFd};
use smc_core::gid::Gid;
use smc_proto::netlink::loopback::{LoopbackAttr, LoopbackCmd, LoopbackMessage, Verdict};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::{Condvar, Mutex};

/// Version of the device protocol this engine speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// Most channels a session has open to smcd at once.
const POOL_MAX: usize = 8;

/// What `smcd` said about this engine.
#[derive(Debug, Clone)]
pub struct Hello {
    /// This engine's 128-bit GID.
    pub gid: smc_core::Gid,
    /// smcd's small id for this engine.
    pub engine_id: u32,
    /// The host's system EID.
    pub seid: String,
    /// The host name.
    pub hostname: String,
    /// The device CHID.
    pub chid: u16,
    /// The namespace smcd sees this engine in.
    pub netns: u64,
    /// smcd has the SMC option program attached (its maps came with the reply).
    pub syn_option: bool,
}

/// What `smcd` answered to a connect intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectVerdict {
    /// Propose SMC or go plain TCP.
    pub smc: bool,
    /// Fallback reason when not SMC.
    pub reason: u32,
    /// The intent to report back with [`SmcdSession::intent_done`].
    pub intent: u64,
    /// The listener's GID, to check the Accept against.
    pub peer_gid: Option<smc_core::Gid>,
}

/// The session's channels to smcd.
#[derive(Debug)]
struct Pool {
    /// Channels not in use.
    idle: Vec<Channel>,
    /// Channels open, in use or idle (at most [`POOL_MAX`]).
    open: usize,
}

fn lock_pool(m: &Mutex<Pool>) -> std::sync::MutexGuard<'_, Pool> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An engine's registration with `smcd`.
#[derive(Debug)]
pub struct SmcdSession {
    path: PathBuf,
    session_key: u64,
    netns: u64,
    hello: Hello,
    pool: Mutex<Pool>,
    /// Signalled when a channel comes back to the pool or one closes.
    returned: Condvar,
    /// This engine's status area (smcd reads it).
    pub status: Arc<StatusArea>,
    /// The namespace's knobs, as smcd publishes them.
    pub sysctl: Option<SysctlPage>,
    /// Where the host's SMC listeners are.
    pub table: Option<ListenerTable>,
    /// The SMC option program's maps, when smcd has it attached (the option path; `None`:
    /// intents only).
    pub syn_option: Option<crate::bpf::Maps>,
    /// A marked socket of ours went out without the option: the program does not cover this
    /// process's cgroup, so connects use intents again ([`Self::option_path`]).
    option_uncovered: std::sync::atomic::AtomicBool,
    listener_pages: Mutex<HashMap<u32, Arc<ListenerPage>>>,
}

pub use crate::sys::current_netns;

fn missing(msg: &LoopbackMessage, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("smcd reply to {:?} lacks {what}", msg.cmd),
    )
}

impl SmcdSession {
    /// Connects to `smcd` at `path` and registers this engine.
    pub fn open(path: &Path) -> io::Result<Self> {
        let session_key = random_u64();
        let netns = current_netns();
        let mut ch = Channel::connect(path)?;
        let (status, status_fd) = StatusArea::shared()?;
        let (hello, mut fds) = Self::hello(&mut ch, session_key, netns, Some(status_fd.as_fd()))?;
        // Reply descriptors: the namespace's sysctl page, the listener table, and with
        // `SynOption` the option program's two maps. A map smcd could not duplicate shortens
        // the list: then the option path is off for this engine, never a page mistaken for
        // a map.
        let syn_option = if hello.syn_option && fds.len() == 4 {
            let listeners = fds.pop().expect("four");
            let sk = fds.pop().expect("four");
            match crate::bpf::Maps::from_fds(sk, listeners) {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!("smcd's SMC option maps refused, using intents: {e}");
                    None
                }
            }
        } else {
            fds.truncate(2);
            None
        };
        let table = fds.pop().and_then(|fd| ListenerTable::open(&fd).ok());
        let sysctl = fds.pop().and_then(|fd| SysctlPage::open(&fd).ok());
        Ok(Self {
            path: path.to_owned(),
            session_key,
            netns,
            hello,
            pool: Mutex::new(Pool {
                idle: vec![ch],
                open: 1,
            }),
            returned: Condvar::new(),
            status,
            sysctl,
            table,
            syn_option,
            option_uncovered: std::sync::atomic::AtomicBool::new(false),
            listener_pages: Mutex::new(HashMap::new()),
        })
    }

    fn hello(
        ch: &mut Channel,
        session_key: u64,
        netns: u64,
        status: Option<rustix::fd::BorrowedFd<'_>>,
    ) -> io::Result<(Hello, Vec<OwnedFd>)> {
        let fds: Vec<_> = status.into_iter().collect();
        let (r, got) = ch.request(
            LoopbackMessage::new(
                LoopbackCmd::Hello,
                vec![
                    LoopbackAttr::Version(PROTOCOL_VERSION),
                    LoopbackAttr::Pid(std::process::id()),
                    LoopbackAttr::SessionKey(session_key),
                    LoopbackAttr::Netns(netns),
                ],
            ),
            &fds,
        )?;
        Ok((
            Hello {
                gid: r.gid().ok_or_else(|| missing(&r, "GID"))?,
                engine_id: r.engine_id().unwrap_or(0),
                seid: r.seid().unwrap_or_default(),
                hostname: r.hostname().unwrap_or_default(),
                chid: r.chid().unwrap_or(0xffff),
                netns: r.netns().unwrap_or(netns),
                syn_option: r.syn_option().unwrap_or(false),
            },
            got,
        ))
    }

    /// The option program's maps while the option path is in effect for this engine: smcd
    /// has the program attached and it covers this process's sockets (`docs/syn-option.md`).
    pub fn option_path(&self) -> Option<&crate::bpf::Maps> {
        use std::sync::atomic::Ordering;
        self.syn_option
            .as_ref()
            .filter(|_| !self.option_uncovered.load(Ordering::Relaxed))
    }

    /// A socket marked as SMC client sent its SYN without the option: this process's sockets
    /// are outside the cgroup smcd attached the program to (or the program is gone), so
    /// connects go back to intents for this session.
    pub fn option_not_covering(&self) {
        use std::sync::atomic::Ordering;
        if !self.option_uncovered.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "the SMC option program does not see this process's sockets; using intents"
            );
        }
    }

    /// What `smcd` said at registration.
    pub fn info(&self) -> &Hello {
        &self.hello
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a pooled channel: one round trip. While all are busy another is opened, up
    /// to [`POOL_MAX`]; beyond that the request waits for one to come back (at most the
    /// request timeout). Opening a channel per request when all were busy cost smcd an
    /// accept, a hello and a close each: at 2,048 concurrent crr connections that was most of
    /// smcd's CPU (0.16 new channels per connection), for a daemon that answers one request
    /// at a time anyway.
    pub fn with_channel<R>(&self, f: impl FnOnce(&mut Channel) -> io::Result<R>) -> io::Result<R> {
        let mut pool = lock_pool(&self.pool);
        let until = std::time::Instant::now() + super::channel::REQUEST_TIMEOUT;
        let pooled = loop {
            if let Some(ch) = pool.idle.pop() {
                break Some(ch);
            }
            if pool.open < POOL_MAX {
                pool.open += 1;
                break None;
            }
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "every channel to smcd stayed busy",
                ));
            }
            pool = self
                .returned
                .wait_timeout(pool, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        drop(pool);
        // A channel that is given up (or never opened) makes room for another.
        let closed = || {
            lock_pool(&self.pool).open -= 1;
            self.returned.notify_one();
        };
        let mut ch = match pooled {
            Some(ch) => ch,
            None => {
                let opened = Channel::connect(&self.path).and_then(|mut ch| {
                    let (h, _) = Self::hello(&mut ch, self.session_key, self.netns, None)?;
                    if h.gid != self.hello.gid {
                        return Err(io::Error::other("smcd restarted: engine identity changed"));
                    }
                    Ok(ch)
                });
                match opened {
                    Ok(ch) => ch,
                    Err(e) => {
                        closed();
                        return Err(e);
                    }
                }
            }
        };
        let r = f(&mut ch);
        // A channel that failed at the transport level or timed out (its answer may still
        // come) is dropped, not reused.
        let healthy = match &r {
            Ok(_) => true,
            Err(e) => {
                e.raw_os_error().is_some()
                    && !matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::WouldBlock
                    )
            }
        };
        if healthy {
            lock_pool(&self.pool).idle.push(ch);
            self.returned.notify_one();
        } else {
            drop(ch);
            closed();
        }
        r
    }

    /// Asks whether an SMC listener expects a connection from `local` to `remote` (the role the
    /// SMC option in the TCP SYN plays in the kernel).
    pub fn connect_intent(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> io::Result<ConnectVerdict> {
        self.with_channel(|ch| {
            let (r, _) = ch.request(
                LoopbackMessage::new(
                    LoopbackCmd::Connect,
                    vec![
                        LoopbackAttr::LocalAddr(local),
                        LoopbackAttr::RemoteAddr(remote),
                    ],
                ),
                &[],
            )?;
            Ok(ConnectVerdict {
                smc: r.verdict() == Some(Verdict::Smc),
                reason: r.reason().unwrap_or(0),
                intent: r.intent_id().unwrap_or(0),
                peer_gid: r.gid(),
            })
        })
    }

    /// Reports how the TCP connect of an intent ended.
    pub fn intent_done(&self, intent: u64, ok: bool) {
        let _ = self.with_channel(|ch| {
            ch.notify(
                LoopbackMessage::new(
                    LoopbackCmd::IntentDone,
                    vec![LoopbackAttr::IntentId(intent), LoopbackAttr::Ok(ok)],
                ),
                &[],
            )
        });
    }

    /// Opens a dedicated channel registering a listener on `addr`; `smcd` then sends intents
    /// on it.
    pub fn listen(
        &self,
        addr: SocketAddr,
        backlog: u32,
        hs_limit: bool,
        page: Option<rustix::fd::BorrowedFd<'_>>,
    ) -> io::Result<(Channel, u32)> {
        let mut ch = Channel::connect(&self.path)?;
        Self::hello(&mut ch, self.session_key, self.netns, None)?;
        let fds: Vec<_> = page.into_iter().collect();
        let (r, _) = ch.request(
            LoopbackMessage::new(
                LoopbackCmd::Listen,
                vec![
                    LoopbackAttr::LocalAddr(addr),
                    LoopbackAttr::Backlog(backlog),
                    LoopbackAttr::HsLimit(hs_limit),
                ],
            ),
            &fds,
        )?;
        let id = r.listener_id().ok_or_else(|| missing(&r, "listener id"))?;
        Ok((ch, id))
    }

    /// Opens a dedicated channel on which `smcd` sends this engine's device events
    /// (`PeerGone`), and returns it with the GIDs of peers that had ended already (smcd says
    /// them at subscription, so none is missed before it). The caller polls the channel.
    pub fn events(&self) -> io::Result<(Channel, Vec<Gid>)> {
        let mut ch = Channel::connect(&self.path)?;
        Self::hello(&mut ch, self.session_key, self.netns, None)?;
        let mut gone = Vec::new();
        ch.request_seeing(
            LoopbackMessage::new(LoopbackCmd::Events, vec![]),
            &[],
            |m| {
                if m.cmd == LoopbackCmd::PeerGone {
                    gone.extend(m.gid());
                }
            },
        )?;
        Ok((ch, gone))
    }

    /// Another block of link-group ids (see `LoopbackCmd::LgrIds`).
    pub fn lgr_ids(&self) -> io::Result<u32> {
        self.with_channel(|ch| {
            let (r, _) = ch.request(LoopbackMessage::new(LoopbackCmd::LgrIds, vec![]), &[])?;
            r.engine_id().ok_or_else(|| missing(&r, "block"))
        })
    }

    /// The congestion page of listener `id` (asked for once, then kept).
    pub fn listener_page(&self, id: u32) -> io::Result<Arc<ListenerPage>> {
        if let Some(p) = self
            .listener_pages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
        {
            return Ok(Arc::clone(p));
        }
        let page = self.with_channel(|ch| {
            let (_, mut fds) = ch.request(
                LoopbackMessage::new(
                    LoopbackCmd::ListenerPage,
                    vec![LoopbackAttr::ListenerId(id)],
                ),
                &[],
            )?;
            let fd = fds
                .pop()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no listener page"))?;
            ListenerPage::open(&fd)
        })?;
        let page = Arc::new(page);
        let mut cache = self
            .listener_pages
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if cache.len() > 4096 {
            cache.clear();
        }
        cache.insert(id, Arc::clone(&page));
        Ok(page)
    }

    /// The namespace smcd sees this engine in.
    pub fn netns(&self) -> u64 {
        self.hello.netns
    }
}
