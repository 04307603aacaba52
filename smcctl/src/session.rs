//! One run of smcctl: the options that apply to every command, the connection (opened on
//! first use) and the mapping of refusals to one-line messages.

use std::path::PathBuf;

use smc_proto::netlink::engine::{EngineMessage, NetnsSelector, SMCD_ENGINE_FAMILY_NAME};
use smc_proto::netlink::smc::consts::SMC_GENL_FAMILY_NAME;
use smc_proto::netlink::smc::{SmcCmd, SmcGenlMessage};

use crate::client::{Client, Failure};
use crate::error::{self, Error, errno_text};
use crate::netns::NetnsArg;
use crate::transport::{Endpoint, KernelSocket, SmcdSocket};

/// The state of one invocation.
#[derive(Debug)]
pub struct Session {
    /// `--json`.
    pub json: bool,
    /// `-d` count.
    pub details: u8,
    /// `--netns`.
    pub netns: Option<NetnsArg>,
    /// `--kernel`.
    pub kernel: bool,
    /// `--socket`.
    pub socket: PathBuf,
    /// The command as the user would write it in full (`stats reset`), for messages.
    pub command: String,
    client: Option<Client>,
}

impl Session {
    /// A session; nothing is opened yet.
    pub fn new(
        json: bool,
        details: u8,
        netns: Option<NetnsArg>,
        kernel: bool,
        socket: PathBuf,
        command: impl Into<String>,
    ) -> Self {
        Self {
            json,
            details,
            netns,
            kernel,
            socket,
            command: command.into(),
            client: None,
        }
    }

    /// Who answers (before or after connecting).
    pub fn endpoint(&self) -> Endpoint {
        if self.kernel {
            Endpoint::Kernel
        } else {
            Endpoint::Smcd(self.socket.clone())
        }
    }

    /// The `NETNS` selector for engine requests.
    pub fn selector(&self) -> Option<NetnsSelector> {
        self.netns.as_ref().map(NetnsArg::selector)
    }

    fn client(&mut self) -> Result<&mut Client, Error> {
        if self.client.is_none() {
            let c = if self.kernel {
                Client::new(Box::new(KernelSocket::open()?))
            } else {
                Client::new(Box::new(SmcdSocket::connect(&self.socket)?))
            };
            self.client = Some(c);
        }
        match self.client.as_mut() {
            Some(c) => Ok(c),
            None => Err(Error::failed("no connection")),
        }
    }

    fn family(&mut self, name: &str) -> Result<u16, Error> {
        let endpoint = self.endpoint();
        let command = self.command.clone();
        match self.client()?.family_id(name) {
            Ok(id) => Ok(id),
            Err(Failure::Other(e)) => Err(e),
            Err(Failure::Errno(errno)) => Err(family_missing(&endpoint, name, &command, errno)),
        }
    }

    /// Sends an `SMC_GEN_NETLINK` dump request without attributes and maps a refusal.
    pub fn gen_dump(&mut self, cmd: SmcCmd) -> Result<Vec<SmcGenlMessage>, Error> {
        let op = smc_op_name(cmd);
        let id = self.family(SMC_GENL_FAMILY_NAME)?;
        self.client()?
            .dump(id, SmcGenlMessage::request(cmd))
            .map_err(|f| self.refused(op, f))
    }

    /// Sends an `SMC_GEN_NETLINK` do request (all of them are only acknowledged); the caller
    /// maps refusals it has words for and hands the rest to [`Session::refused`].
    pub fn gen_execute(&mut self, msg: SmcGenlMessage) -> Result<(), Failure> {
        let id = self.family(SMC_GENL_FAMILY_NAME)?;
        self.client()?.execute(id, msg)
    }

    /// Sends an `SMCD_ENGINE` dump request.
    pub fn engine_dump(&mut self, msg: EngineMessage) -> Result<Vec<EngineMessage>, Failure> {
        let id = self.family(SMCD_ENGINE_FAMILY_NAME)?;
        self.client()?.dump(id, msg)
    }

    /// Sends an `SMCD_ENGINE` do request answered by one message (`SYSCTL_GET`/`SET`).
    pub fn engine_query(&mut self, msg: EngineMessage) -> Result<Vec<EngineMessage>, Failure> {
        let id = self.family(SMCD_ENGINE_FAMILY_NAME)?;
        self.client()?.query(id, msg)
    }

    /// Sends an `SMCD_ENGINE` do request that is only acknowledged (`STATS_RESET`).
    pub fn engine_execute(&mut self, msg: EngineMessage) -> Result<(), Failure> {
        let id = self.family(SMCD_ENGINE_FAMILY_NAME)?;
        self.client()?.execute(id, msg)
    }

    /// The message for a refusal nobody had more specific words for.
    pub fn refused(&self, op: &str, f: Failure) -> Error {
        // An engine request naming a namespace: smcd resolves the selector first, and
        // answers ENOENT when it names nothing, EACCES/EINVAL when it cannot use it.
        if let (Failure::Errno(e), Some(ns), true) =
            (&f, &self.netns, op.starts_with("SMCD_ENGINE"))
        {
            let e = *e;
            if e == error::ENOENT {
                return Error::failed(format!(
                    "{} knows no network namespace {} ({op} was answered ENOENT)",
                    self.endpoint(),
                    ns.describe()
                ));
            }
            if e == error::EACCES || e == error::EINVAL {
                return Error::failed(format!(
                    "{} cannot use {} as a network namespace: {}",
                    self.endpoint(),
                    ns.path().display(),
                    errno_text(e)
                ));
            }
        }
        match f {
            Failure::Other(e) => e,
            Failure::Errno(e) if e == error::EPERM || e == error::EACCES => Error::failed(format!(
                "`{}` needs root (CAP_NET_ADMIN): {} refused {op}: {}",
                self.command,
                self.endpoint(),
                errno_text(e)
            )),
            Failure::Errno(e) if e == error::EOPNOTSUPP => Error::failed(format!(
                "{} does not support {op} (`{}`): {}",
                self.endpoint(),
                self.command,
                errno_text(e)
            )),
            Failure::Errno(e) => Error::failed(format!(
                "{} refused {op}: {}",
                self.endpoint(),
                errno_text(e)
            )),
        }
    }
}

/// What to say when nlctrl does not know a family.
fn family_missing(endpoint: &Endpoint, family: &str, command: &str, errno: i32) -> Error {
    match (endpoint, family, errno) {
        (Endpoint::Kernel, SMC_GENL_FAMILY_NAME, error::ENOENT) => Error::failed(
            "the kernel has no SMC_GEN_NETLINK family: the smc module is not loaded or the \
             kernel lacks SMC (try `modprobe smc`)",
        ),
        (Endpoint::Kernel, SMCD_ENGINE_FAMILY_NAME, error::ENOENT) => Error::failed(format!(
            "`{command}` uses smcd's SMCD_ENGINE family, which the kernel does not have: the \
             kernel exposes these through /proc/sys/net/smc and sock_diag (smcss), not \
             netlink; drop --kernel to ask smcd"
        )),
        (Endpoint::Smcd(_), _, error::ENOENT) => Error::failed(format!(
            "{endpoint} does not serve the {family} family; update smcd"
        )),
        (Endpoint::Smcd(_), _, error::EOPNOTSUPP) => Error::failed(format!(
            "{endpoint} does not serve the netlink control families yet (the {family} lookup \
             was answered EOPNOTSUPP); update smcd"
        )),
        (_, _, e) => Error::failed(format!(
            "{endpoint} refused the lookup of the {family} family: {}",
            errno_text(e)
        )),
    }
}

/// The kernel's name of an `SMC_GEN_NETLINK` command.
pub fn smc_op_name(cmd: SmcCmd) -> &'static str {
    match cmd {
        SmcCmd::GetSysInfo => "SMC_NETLINK_GET_SYS_INFO",
        SmcCmd::GetLgrSmcr => "SMC_NETLINK_GET_LGR_SMCR",
        SmcCmd::GetLinkSmcr => "SMC_NETLINK_GET_LINK_SMCR",
        SmcCmd::GetLgrSmcd => "SMC_NETLINK_GET_LGR_SMCD",
        SmcCmd::GetDevSmcd => "SMC_NETLINK_GET_DEV_SMCD",
        SmcCmd::GetDevSmcr => "SMC_NETLINK_GET_DEV_SMCR",
        SmcCmd::GetStats => "SMC_NETLINK_GET_STATS",
        SmcCmd::GetFbackStats => "SMC_NETLINK_GET_FBACK_STATS",
        SmcCmd::DumpUeid => "SMC_NETLINK_DUMP_UEID",
        SmcCmd::AddUeid => "SMC_NETLINK_ADD_UEID",
        SmcCmd::RemoveUeid => "SMC_NETLINK_REMOVE_UEID",
        SmcCmd::FlushUeid => "SMC_NETLINK_FLUSH_UEID",
        SmcCmd::DumpSeid => "SMC_NETLINK_DUMP_SEID",
        SmcCmd::EnableSeid => "SMC_NETLINK_ENABLE_SEID",
        SmcCmd::DisableSeid => "SMC_NETLINK_DISABLE_SEID",
        SmcCmd::DumpHsLimitation => "SMC_NETLINK_DUMP_HS_LIMITATION",
        SmcCmd::EnableHsLimitation => "SMC_NETLINK_ENABLE_HS_LIMITATION",
        SmcCmd::DisableHsLimitation => "SMC_NETLINK_DISABLE_HS_LIMITATION",
        SmcCmd::Unknown(_) => "an unknown SMC_GEN_NETLINK command",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_phrased() {
        let s = Session::new(false, 0, None, false, "/x/s".into(), "ueid add");
        let e = s.refused("SMC_NETLINK_ADD_UEID", Failure::Errno(1));
        assert!(
            e.message.starts_with("`ueid add` needs root"),
            "{}",
            e.message
        );
        assert_eq!(e.code, 1);
        let e = s.refused("X", Failure::Errno(95));
        assert!(e.message.contains("does not support X"), "{}", e.message);
        let e = s.refused("X", Failure::Errno(22));
        assert!(
            e.message
                .contains("smcd at /x/s refused X: Invalid argument")
        );
    }

    #[test]
    fn namespace_refusals() {
        let s = Session::new(
            false,
            0,
            Some(NetnsArg::Name("blue".into())),
            false,
            "/x/s".into(),
            "sysctl show",
        );
        let e = s.refused("SMCD_ENGINE SYSCTL_LIST", Failure::Errno(2));
        assert!(
            e.message.contains("knows no network namespace blue"),
            "{}",
            e.message
        );
        let e = s.refused("SMCD_ENGINE SYSCTL_LIST", Failure::Errno(13));
        assert!(
            e.message.contains("cannot use /run/netns/blue"),
            "{}",
            e.message
        );
        // SMC_GEN_NETLINK requests carry no selector: their errnos mean what they say.
        let e = s.refused("SMC_NETLINK_ADD_UEID", Failure::Errno(13));
        assert!(e.message.contains("needs root"), "{}", e.message);
    }

    #[test]
    fn missing_families() {
        let e = family_missing(&Endpoint::Kernel, SMC_GENL_FAMILY_NAME, "info", 2);
        assert!(
            e.message.contains("smc module is not loaded"),
            "{}",
            e.message
        );
        let e = family_missing(&Endpoint::Kernel, SMCD_ENGINE_FAMILY_NAME, "sysctl show", 2);
        assert!(e.message.contains("/proc/sys/net/smc"), "{}", e.message);
        let e = family_missing(
            &Endpoint::Smcd("/s".into()),
            SMCD_ENGINE_FAMILY_NAME,
            "x",
            95,
        );
        assert!(e.message.contains("update smcd"), "{}", e.message);
    }
}
