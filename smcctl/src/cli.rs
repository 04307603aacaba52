//! The command line: `smcctl [OPTIONS] OBJECT VERB [ARGS]`, smc-tools' grammar.
//!
//! clap (derive) defines every option, object and verb; the man page and the shell
//! completions are generated from the same definitions. Before clap parses, [`expand`]
//! does what smc-tools does by hand: objects and verbs may be abbreviated to any unique
//! prefix (`smcctl l s` is `smcctl linkgroup show`), and a missing verb means `show`
//! (`smcctl stats -d`, `smcctl linkgroup 100`). An unknown or ambiguous prefix is a usage
//! error (exit 2).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{ArgAction, Args, Command, Parser, Subcommand};

use crate::error::Error;

/// `smcd`'s default control socket.
pub const DEFAULT_SOCKET: &str = "/run/smcd/smcd.sock";

/// Operator CLI for smcd (and the kernel's SMC), modelled on smc-tools.
#[derive(Debug, Parser)]
#[command(
    name = "smcctl",
    version,
    about = "Inspect and steer SMC: link groups, devices, statistics, sysctls and sockets",
    long_about = "Inspect and steer SMC (Shared Memory Communications) as smc-tools' smcd, smcr \
                  and smcss do, through the generic netlink families smcd serves on its control \
                  socket (or the kernel's SMC_GEN_NETLINK with --kernel).\n\n\
                  OBJECT and VERB may be abbreviated to any unique prefix: `smcctl l s` is \
                  `smcctl linkgroup show`. Without a VERB the object's `show` runs.\n\n\
                  Exit status: 0 success, 1 a request failed, 2 a usage error.",
    after_help = "Examples:\n  smcctl info\n  smcctl linkgroup show -d\n  smcctl stats\n  \
                  smcctl sysctl set wmem=131072\n  smcctl --netns blue ss -a\n  \
                  smcctl --json device"
)]
pub struct Cli {
    /// smcd's control socket.
    #[arg(
        long,
        global = true,
        env = "SMCD_SOCKET",
        value_name = "PATH",
        default_value = DEFAULT_SOCKET
    )]
    pub socket: PathBuf,

    /// Send the requests to the kernel's SMC_GEN_NETLINK family (NETLINK_GENERIC) instead of
    /// smcd.
    #[arg(long, global = true)]
    pub kernel: bool,

    /// Network namespace the command is about: a name under /run/netns, a path to a
    /// namespace file, or a pid.
    #[arg(long, global = true, value_name = "NAME|PATH|PID")]
    pub netns: Option<String>,

    /// Print a JSON document instead of the table (schema in docs/smcctl.md).
    #[arg(long, global = true)]
    pub json: bool,

    /// More detail; -dd for even more (smc-tools' -d and -dd).
    #[arg(short = 'd', long = "details", action = ArgAction::Count, global = true)]
    pub details: u8,

    /// What to look at or change.
    #[command(subcommand)]
    pub object: Object,
}

/// The objects (smc-tools' OBJECT).
#[derive(Debug, Subcommand)]
pub enum Object {
    /// SMC capabilities: version, host name, SMC-D/SMC-R features, SEID, ISM, RoCE.
    Info {
        /// What to do.
        #[command(subcommand)]
        verb: InfoVerb,
    },
    /// Link groups (smcd/smcr linkgroup).
    Linkgroup {
        /// What to do.
        #[command(subcommand)]
        verb: LinkgroupVerb,
    },
    /// SMC devices (smcd/smcr device).
    Device {
        /// What to do.
        #[command(subcommand)]
        verb: DeviceVerb,
    },
    /// Statistics: connections, RX/TX, fallback reasons (smcd/smcr stats).
    Stats {
        /// What to do.
        #[command(subcommand)]
        verb: StatsVerb,
    },
    /// Handshake limitation (the kernel's limit_smc_hs), per network namespace.
    HsLimit {
        /// What to do.
        #[command(subcommand)]
        verb: HsLimitVerb,
    },
    /// SMC sysctls (/proc/sys/net/smc in the kernel), per network namespace.
    Sysctl {
        /// What to do.
        #[command(subcommand)]
        verb: SysctlVerb,
    },
    /// User EIDs (smcd ueid).
    Ueid {
        /// What to do.
        #[command(subcommand)]
        verb: UeidVerb,
    },
    /// The system EID (smcd seid).
    Seid {
        /// What to do.
        #[command(subcommand)]
        verb: SeidVerb,
    },
    /// SMC sockets, as smcss lists them.
    Ss(SsArgs),
    /// Print a shell completion script.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    #[command(hide = true)]
    Manpage,
}

/// `info` verbs.
#[derive(Debug, Subcommand)]
pub enum InfoVerb {
    /// Show the capabilities (default).
    Show,
}

/// Which technology to show.
#[derive(Debug, Args, Clone, Copy, Default)]
#[group(multiple = false)]
pub struct Tech {
    /// SMC-D (the default).
    #[arg(long)]
    pub smcd: bool,
    /// SMC-R.
    #[arg(long)]
    pub smcr: bool,
}

impl Tech {
    /// SMC-R only when asked for: smcd implements SMC-D.
    pub fn is_smcr(self) -> bool {
        self.smcr
    }
}

/// `linkgroup` verbs.
#[derive(Debug, Subcommand)]
pub enum LinkgroupVerb {
    /// List link groups (default); -d prints a detail block per link group.
    Show {
        /// `all`, or one link group id (hexadecimal, as listed).
        #[arg(value_name = "all|LG-ID")]
        target: Option<String>,
        /// Technology.
        #[command(flatten)]
        tech: Tech,
    },
    /// List the links of SMC-R link groups (smcr linkgroup link-show); -d, -dd add columns.
    Links {
        /// `all`, or one link group id (hexadecimal).
        #[arg(value_name = "all|LG-ID")]
        target: Option<String>,
    },
}

/// `device` verbs.
#[derive(Debug, Subcommand)]
pub enum DeviceVerb {
    /// List devices (default).
    Show {
        /// Technology.
        #[command(flatten)]
        tech: Tech,
    },
}

/// Options of `stats show` and `stats reset`.
#[derive(Debug, Args, Clone, Copy)]
pub struct StatsArgs {
    /// Technology.
    #[command(flatten)]
    pub tech: Tech,
    /// Absolute values. Accepted for smc-tools compatibility: smcctl's counters are always
    /// absolute since the last `stats reset` (the reset happens in smcd, not in a snapshot
    /// file), so this changes nothing.
    #[arg(short = 'a', long)]
    pub absolute: bool,
}

/// `stats` verbs.
#[derive(Debug, Subcommand)]
pub enum StatsVerb {
    /// Show the statistics (default).
    Show(StatsArgs),
    /// Show the statistics, then reset the namespace's counters and fallback reasons
    /// (STATS_RESET; needs root).
    Reset(StatsArgs),
}

/// `hs-limit` verbs.
#[derive(Debug, Subcommand)]
pub enum HsLimitVerb {
    /// Whether handshake limitation is on (default).
    Show,
    /// Turn it on (needs root; applies to sockets created afterwards).
    Enable,
    /// Turn it off (needs root).
    Disable,
}

/// `sysctl` verbs.
#[derive(Debug, Subcommand)]
pub enum SysctlVerb {
    /// List every knob with its value, default and range (default).
    Show,
    /// Print one knob.
    Get {
        /// Knob name (`wmem` or `net.smc.wmem`).
        key: String,
    },
    /// Change one knob (needs root; new connections use the new value).
    Set {
        /// `KEY=VALUE`.
        #[arg(value_name = "KEY=VALUE")]
        assignment: String,
    },
}

/// `ueid` verbs.
#[derive(Debug, Subcommand)]
pub enum UeidVerb {
    /// List the user EIDs (default).
    Show,
    /// Add a user EID (needs root).
    Add {
        /// Up to 32 characters: A-Z, 0-9, '.', '-', starting with a letter or digit.
        eid: String,
    },
    /// Remove a user EID (needs root).
    Del {
        /// The user EID.
        eid: String,
    },
    /// Remove all user EIDs (needs root).
    Flush,
}

/// `seid` verbs.
#[derive(Debug, Subcommand)]
pub enum SeidVerb {
    /// Show the system EID and whether it is used (default).
    Show,
    /// Use the system EID (needs root).
    Enable,
    /// Stop using the system EID (needs root; needs a user EID).
    Disable,
}

/// `ss` options (smcss).
#[derive(Debug, Args, Clone, Copy)]
pub struct SsArgs {
    /// All sockets: listening, opening, closing and connected.
    #[arg(short = 'a', long, conflicts_with = "listening")]
    pub all: bool,
    /// Listening sockets only.
    #[arg(short = 'l', long)]
    pub listening: bool,
    /// SMC-D details (shows only SMC-D sockets).
    #[arg(short = 'D', long = "smcd", conflicts_with_all = ["smcr", "listening"])]
    pub smcd: bool,
    /// SMC-R details (shows only SMC-R sockets).
    #[arg(short = 'R', long = "smcr", conflicts_with = "listening")]
    pub smcr: bool,
    /// Do not truncate IP addresses.
    #[arg(short = 'W', long)]
    pub wide: bool,
}

/// Objects whose verb may be left out: the verb then is `show`.
const DEFAULT_VERB: &str = "show";

/// Expands abbreviated objects and verbs and inserts the default verb, so that clap sees the
/// full grammar. `args[0]` is the program name.
pub fn expand(root: &Command, args: Vec<OsString>) -> Result<Vec<OsString>, Error> {
    let mut root = root.clone();
    root.build();
    let mut out: Vec<OsString> = Vec::with_capacity(args.len() + 1);
    let mut it = args.into_iter();
    if let Some(prog) = it.next() {
        out.push(prog);
    }
    let rest: Vec<OsString> = it.collect();
    let wants_help = rest
        .iter()
        .any(|a| a == "-h" || a == "--help" || a == "help");

    enum Stage {
        Object,
        Verb { object_at: usize },
        Rest,
    }
    let mut stage = Stage::Object;
    let mut current: Command = root.clone();
    let mut i = 0;
    while i < rest.len() {
        let arg = &rest[i];
        let Some(s) = arg.to_str() else {
            out.push(arg.clone());
            i += 1;
            continue;
        };
        if s == "--" {
            out.extend(rest[i..].iter().cloned());
            break;
        }
        if matches!(stage, Stage::Rest) {
            out.push(arg.clone());
            i += 1;
            continue;
        }
        if let Some(long) = s.strip_prefix("--") {
            out.push(arg.clone());
            i += 1;
            if !long.contains('=') && long_takes_value(&current, long) && i < rest.len() {
                out.push(rest[i].clone());
                i += 1;
            }
            continue;
        }
        if s.len() > 1 && s.starts_with('-') {
            out.push(arg.clone());
            i += 1;
            let shorts: Vec<char> = s[1..].chars().collect();
            for (k, c) in shorts.iter().enumerate() {
                if short_takes_value(&current, *c) {
                    if k + 1 == shorts.len() && i < rest.len() {
                        out.push(rest[i].clone());
                        i += 1;
                    }
                    break;
                }
            }
            continue;
        }
        // A positional word.
        match stage {
            Stage::Object => {
                let name = resolve(&root, s, "object")?;
                out.push(name.clone().into());
                current = root
                    .find_subcommand(&name)
                    .cloned()
                    .unwrap_or_else(|| root.clone());
                stage = if current.has_subcommands() && name != "help" {
                    Stage::Verb {
                        object_at: out.len() - 1,
                    }
                } else {
                    Stage::Rest
                };
            }
            Stage::Verb { .. } => {
                let object = current.get_name().to_owned();
                match resolve(&current, s, "verb") {
                    Ok(verb) => out.push(verb.into()),
                    Err(_) if object == "linkgroup" && looks_like_lgr_target(s) => {
                        // smc-tools: `linkgroup all`, `linkgroup 100` mean `show`.
                        out.push(DEFAULT_VERB.into());
                        out.push(arg.clone());
                    }
                    Err(e) => return Err(e),
                }
                stage = Stage::Rest;
            }
            Stage::Rest => out.push(arg.clone()),
        }
        i += 1;
    }
    if let Stage::Verb { object_at } = stage
        && !wants_help
        && current.find_subcommand(DEFAULT_VERB).is_some()
    {
        out.insert(object_at + 1, DEFAULT_VERB.into());
    }
    Ok(out)
}

/// `all` or a hexadecimal link group id.
fn looks_like_lgr_target(s: &str) -> bool {
    s == "all" || (!s.is_empty() && s.len() <= 10 && parse_lgr_id(s).is_some())
}

/// A link group id as smc-tools reads it: hexadecimal, with or without `0x`.
pub fn parse_lgr_id(s: &str) -> Option<u32> {
    let h = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if h.is_empty() {
        return None;
    }
    u32::from_str_radix(h, 16).ok()
}

/// The full name of the subcommand of `cmd` that `word` names exactly or is the unique
/// prefix of (hidden subcommands only by their full name).
fn resolve(cmd: &Command, word: &str, what: &str) -> Result<String, Error> {
    let names: Vec<(&str, bool)> = cmd
        .get_subcommands()
        .map(|c| (c.get_name(), c.is_hide_set()))
        .collect();
    if let Some((n, _)) = names.iter().find(|(n, _)| *n == word) {
        return Ok((*n).to_owned());
    }
    let matches: Vec<&str> = names
        .iter()
        .filter(|(n, hidden)| !hidden && n.starts_with(word))
        .map(|(n, _)| *n)
        .collect();
    let visible: Vec<&str> = names.iter().filter(|(_, h)| !h).map(|(n, _)| *n).collect();
    let scope = if what == "object" {
        String::new()
    } else {
        format!(" of {}", cmd.get_name())
    };
    match matches.as_slice() {
        [one] => Ok((*one).to_owned()),
        [] => Err(Error::usage(format!(
            "{what} \"{word}\"{scope} is unknown; expected one of: {} (try 'smcctl --help')",
            visible.join(", ")
        ))),
        many => Err(Error::usage(format!(
            "{what} \"{word}\"{scope} is ambiguous: {} (try 'smcctl --help')",
            many.join(", ")
        ))),
    }
}

fn long_takes_value(cmd: &Command, long: &str) -> bool {
    cmd.get_arguments().any(|a| {
        (a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|al| al.contains(&long)))
            && a.get_action().takes_values()
    })
}

fn short_takes_value(cmd: &Command, c: char) -> bool {
    cmd.get_arguments()
        .any(|a| a.get_short() == Some(c) && a.get_action().takes_values())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn exp(line: &str) -> Result<String, Error> {
        let args: Vec<OsString> = std::iter::once("smcctl")
            .chain(line.split_whitespace())
            .map(OsString::from)
            .collect();
        let v = expand(&Cli::command(), args)?;
        Ok(v[1..]
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" "))
    }

    #[test]
    fn prefixes_expand() {
        assert_eq!(exp("l s").unwrap(), "linkgroup show");
        assert_eq!(exp("lin sh -d").unwrap(), "linkgroup show -d");
        assert_eq!(exp("d").unwrap(), "device show");
        assert_eq!(exp("i").unwrap(), "info show");
        assert_eq!(exp("st r").unwrap(), "stats reset");
        assert_eq!(exp("sy g wmem").unwrap(), "sysctl get wmem");
        assert_eq!(exp("u a ABC").unwrap(), "ueid add ABC");
        assert_eq!(exp("se e").unwrap(), "seid enable");
        assert_eq!(exp("hs e").unwrap(), "hs-limit enable");
        assert_eq!(exp("ss -a").unwrap(), "ss -a");
        assert_eq!(exp("c bash").unwrap(), "completions bash");
    }

    #[test]
    fn default_verb_is_show() {
        assert_eq!(exp("stats").unwrap(), "stats show");
        assert_eq!(exp("stats -d -a").unwrap(), "stats show -d -a");
        assert_eq!(exp("-d stats").unwrap(), "-d stats show");
        assert_eq!(exp("linkgroup 100").unwrap(), "linkgroup show 100");
        assert_eq!(exp("l all").unwrap(), "linkgroup show all");
        assert_eq!(exp("l --smcr").unwrap(), "linkgroup show --smcr");
        assert_eq!(exp("linkgroup --help").unwrap(), "linkgroup --help");
    }

    #[test]
    fn option_values_are_not_objects() {
        assert_eq!(
            exp("--socket /tmp/s l").unwrap(),
            "--socket /tmp/s linkgroup show"
        );
        assert_eq!(exp("--netns s stats").unwrap(), "--netns s stats show");
        assert_eq!(
            exp("--netns=blue sy sh").unwrap(),
            "--netns=blue sysctl show"
        );
        assert_eq!(exp("ss --netns ss").unwrap(), "ss --netns ss");
    }

    #[test]
    fn unknown_and_ambiguous_are_usage_errors() {
        let e = exp("s").unwrap_err();
        assert_eq!(e.code, 2);
        assert!(e.message.contains("ambiguous"), "{}", e.message);
        assert!(e.message.contains("stats") && e.message.contains("sysctl"));
        let e = exp("bogus").unwrap_err();
        assert_eq!(e.code, 2);
        assert!(e.message.contains("unknown"), "{}", e.message);
        let e = exp("stats bogus").unwrap_err();
        assert!(
            e.message.contains("verb \"bogus\" of stats"),
            "{}",
            e.message
        );
        let e = exp("h").unwrap_err();
        assert!(e.message.contains("ambiguous"), "{}", e.message);
        assert!(exp("linkgroup xyz").is_err());
        // Hidden objects only by their full name.
        assert!(exp("manp").is_err());
        assert_eq!(exp("manpage").unwrap(), "manpage");
    }

    #[test]
    fn expanded_lines_parse() {
        for line in [
            "l s -d",
            "l links -dd",
            "d --smcr",
            "st -a --smcr",
            "st r",
            "sy set wmem=1",
            "ss -l",
            "ss -a -D -d -W",
            "--json --kernel i",
            "hs",
            "u",
            "se",
        ] {
            let args: Vec<OsString> = std::iter::once("smcctl")
                .chain(line.split_whitespace())
                .map(OsString::from)
                .collect();
            let v = expand(&Cli::command(), args).unwrap();
            Cli::try_parse_from(v).unwrap_or_else(|e| panic!("{line}: {e}"));
        }
    }

    #[test]
    fn conflicting_options_are_refused() {
        for line in ["ss -l -a", "ss -D -R", "d --smcd --smcr"] {
            let args: Vec<OsString> = std::iter::once("smcctl")
                .chain(line.split_whitespace())
                .map(OsString::from)
                .collect();
            let v = expand(&Cli::command(), args).unwrap();
            assert!(Cli::try_parse_from(v).is_err(), "{line}");
        }
    }

    #[test]
    fn lgr_ids_are_hex() {
        assert_eq!(parse_lgr_id("100"), Some(0x100));
        assert_eq!(parse_lgr_id("0xff"), Some(0xff));
        assert_eq!(parse_lgr_id("zz"), None);
        assert_eq!(parse_lgr_id(""), None);
        assert!(looks_like_lgr_target("all"));
        assert!(!looks_like_lgr_target("links2"));
    }

    #[test]
    fn clap_definitions_are_consistent() {
        Cli::command().debug_assert();
    }
}
