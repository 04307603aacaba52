//! The command line: `smcctl [OPTIONS] OBJECT [VERB] [ARGS]`, smc-tools' grammar.
//!
//! clap (derive) defines every option, object and verb; the man page and the shell
//! completions are generated from the same definitions. smc-tools' conveniences are clap's
//! too:
//!
//! * objects and verbs may be abbreviated to any unique prefix (`infer_subcommands`):
//!   `smcctl l s` is `smcctl linkgroup show`, and an exact name always wins;
//! * a missing verb means `show`: every object's verb is optional, and an object whose `show`
//!   has options takes them itself when the verb is left out (`smcctl stats -d -a`,
//!   `smcctl linkgroup 100`), the default-subcommand pattern of clap's documentation.
//!
//! What clap leaves to [`parse`]: phrasing a word that names no object or verb, or more
//! than one, the way smc-tools users read it (a usage error, exit 2); refusing a `show`
//! option written before an explicit verb; and `manpage`, which is deliberately not a clap
//! subcommand. clap infers hidden subcommands from prefixes as well, and `manpage` is taken
//! by its full name only.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgAction, Args, Command, CommandFactory, Parser, Subcommand};

use crate::error::Error;

/// `smcd`'s default control socket.
pub const DEFAULT_SOCKET: &str = "/run/smcd/smcd.sock";

/// Operator CLI for smcd (and the kernel's SMC), modelled on smc-tools.
#[derive(Debug, Parser)]
#[command(
    name = "smcctl",
    version,
    infer_subcommands = true,
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
    Info(Verbs<InfoVerb>),
    /// Link groups (smcd/smcr linkgroup).
    Linkgroup(LinkgroupObject),
    /// SMC devices (smcd/smcr device).
    Device(DeviceObject),
    /// Statistics: connections, RX/TX, fallback reasons (smcd/smcr stats).
    Stats(StatsObject),
    /// Handshake limitation (the kernel's limit_smc_hs), per network namespace.
    HsLimit(Verbs<HsLimitVerb>),
    /// SMC sysctls (/proc/sys/net/smc in the kernel), per network namespace.
    Sysctl(Verbs<SysctlVerb>),
    /// User EIDs (smcd ueid).
    Ueid(Verbs<UeidVerb>),
    /// The system EID (smcd seid).
    Seid(Verbs<SeidVerb>),
    /// SMC sockets, as smcss lists them.
    Ss(SsArgs),
    /// Print a shell completion script.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff). Not a clap subcommand (see the module doc): [`parse`]
    /// makes it from the word `manpage`.
    #[command(skip)]
    Manpage,
    /// A first word that names no object (or `manpage`). [`parse`] never returns it: it
    /// becomes [`Object::Manpage`] or a usage error.
    #[command(external_subcommand)]
    Unresolved(Vec<OsString>),
}

/// An object whose verbs take no options before them. A missing verb is the verb type's
/// default, `show`.
#[derive(Debug, Args)]
pub struct Verbs<V: Subcommand> {
    /// What to do.
    #[command(subcommand)]
    verb: Option<V>,
}

impl<V: Subcommand + Default + Clone> Verbs<V> {
    /// The verb given, or `show`.
    pub fn verb(&self) -> V {
        self.verb.clone().unwrap_or_default()
    }
}

/// `info` verbs.
#[derive(Debug, Subcommand, Clone, Copy, Default)]
pub enum InfoVerb {
    /// Show the capabilities (default).
    #[default]
    Show,
}

/// Which technology to show.
#[derive(Debug, Args, Clone, Copy, Default, PartialEq, Eq)]
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

/// The error for options of `show` given to `object` when an explicit verb follows: clap
/// would take them for the object, and they are `show`'s only when the verb is left out.
fn options_before_verb(object: &str) -> Error {
    Error::usage(format!(
        "options of \"{object} show\" go after the verb when one is given \
         (smcctl {object} VERB [OPTIONS]), or leave the verb out"
    ))
}

/// `linkgroup`: its verb, or `show` with the arguments given to the object.
#[derive(Debug, Args)]
pub struct LinkgroupObject {
    /// `show`'s arguments when the verb is left out (`smcctl linkgroup 100`).
    #[command(flatten)]
    show: LinkgroupShow,
    /// What to do.
    #[command(subcommand)]
    verb: Option<LinkgroupVerb>,
}

impl LinkgroupObject {
    /// The verb given, or `show` with the object's arguments.
    pub fn verb(&self) -> LinkgroupVerb {
        self.verb
            .clone()
            .unwrap_or_else(|| LinkgroupVerb::Show(self.show.clone()))
    }

    fn check(&self) -> Result<(), Error> {
        match (&self.verb, &self.show.target) {
            (Some(_), _) if self.show != LinkgroupShow::default() => {
                Err(options_before_verb("linkgroup"))
            }
            // smc-tools: `linkgroup all`, `linkgroup 100` mean `show`; any other word was
            // meant as a verb.
            (None, Some(word)) if !looks_like_lgr_target(word) => Err(unresolved(
                subcommand(&built(), &["linkgroup"]),
                word,
                "verb",
            )),
            _ => Ok(()),
        }
    }
}

/// `linkgroup show`'s arguments.
#[derive(Debug, Args, Clone, Default, PartialEq, Eq)]
pub struct LinkgroupShow {
    /// `all`, or one link group id (hexadecimal, as listed).
    #[arg(value_name = "all|LG-ID")]
    pub target: Option<String>,
    /// Technology.
    #[command(flatten)]
    pub tech: Tech,
}

/// `linkgroup` verbs.
#[derive(Debug, Subcommand, Clone)]
pub enum LinkgroupVerb {
    /// List link groups (default); -d prints a detail block per link group.
    Show(LinkgroupShow),
    /// List the links of SMC-R link groups (smcr linkgroup link-show); -d, -dd add columns.
    Links {
        /// `all`, or one link group id (hexadecimal).
        #[arg(value_name = "all|LG-ID")]
        target: Option<String>,
    },
}

/// `device`: its verb, or `show` with the options given to the object.
#[derive(Debug, Args)]
pub struct DeviceObject {
    /// `show`'s options when the verb is left out (`smcctl device --smcr`).
    #[command(flatten)]
    show: Tech,
    /// What to do.
    #[command(subcommand)]
    verb: Option<DeviceVerb>,
}

impl DeviceObject {
    /// The verb given, or `show` with the object's options.
    pub fn verb(&self) -> DeviceVerb {
        self.verb.unwrap_or(DeviceVerb::Show(self.show))
    }

    fn check(&self) -> Result<(), Error> {
        if self.verb.is_some() && self.show != Tech::default() {
            return Err(options_before_verb("device"));
        }
        Ok(())
    }
}

/// `device` verbs.
#[derive(Debug, Subcommand, Clone, Copy)]
pub enum DeviceVerb {
    /// List devices (default).
    Show(Tech),
}

/// Options of `stats show` and `stats reset`.
#[derive(Debug, Args, Clone, Copy, Default, PartialEq, Eq)]
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

/// `stats`: its verb, or `show` with the options given to the object.
#[derive(Debug, Args)]
pub struct StatsObject {
    /// `show`'s options when the verb is left out (`smcctl stats -a`).
    #[command(flatten)]
    show: StatsArgs,
    /// What to do.
    #[command(subcommand)]
    verb: Option<StatsVerb>,
}

impl StatsObject {
    /// The verb given, or `show` with the object's options.
    pub fn verb(&self) -> StatsVerb {
        self.verb.unwrap_or(StatsVerb::Show(self.show))
    }

    fn check(&self) -> Result<(), Error> {
        if self.verb.is_some() && self.show != StatsArgs::default() {
            return Err(options_before_verb("stats"));
        }
        Ok(())
    }
}

/// `stats` verbs.
#[derive(Debug, Subcommand, Clone, Copy)]
pub enum StatsVerb {
    /// Show the statistics (default).
    Show(StatsArgs),
    /// Show the statistics, then reset the namespace's counters and fallback reasons
    /// (STATS_RESET; needs root).
    Reset(StatsArgs),
}

/// `hs-limit` verbs.
#[derive(Debug, Subcommand, Clone, Copy, Default)]
pub enum HsLimitVerb {
    /// Whether handshake limitation is on (default).
    #[default]
    Show,
    /// Turn it on (needs root; applies to sockets created afterwards).
    Enable,
    /// Turn it off (needs root).
    Disable,
}

/// `sysctl` verbs.
#[derive(Debug, Subcommand, Clone, Default)]
pub enum SysctlVerb {
    /// List every knob with its value, default and range (default).
    #[default]
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
#[derive(Debug, Subcommand, Clone, Default)]
pub enum UeidVerb {
    /// List the user EIDs (default).
    #[default]
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
#[derive(Debug, Subcommand, Clone, Copy, Default)]
pub enum SeidVerb {
    /// Show the system EID and whether it is used (default).
    #[default]
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
    /// The process that owns each socket, as `ss -p` shows it (`users:(("nginx",pid=42))`):
    /// with smc-run, the program itself.
    #[arg(short = 'p', long)]
    pub processes: bool,
}

/// Why [`parse`] returned no command line.
#[derive(Debug)]
pub enum ParseError {
    /// clap's own answer: help or version (print to stdout, exit 0), or a usage error it
    /// phrased (stderr, exit 2). `clap::Error::print` and `use_stderr` tell which.
    Clap(clap::Error),
    /// A usage error phrased here (exit 2).
    Usage(Error),
}

/// Parses a command line (`args[0]` the program name). clap does the grammar, the prefix
/// matching and the default verb; see the module doc for what is left to this function.
pub fn parse(args: Vec<OsString>) -> Result<Cli, ParseError> {
    let mut cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) if e.kind() == ErrorKind::InvalidSubcommand => {
            return Err(match e.get(ContextKind::InvalidSubcommand) {
                Some(ContextValue::String(word)) => ParseError::Usage(unresolved_word(&args, word)),
                _ => ParseError::Clap(e),
            });
        }
        Err(e) => return Err(ParseError::Clap(e)),
    };
    if let Object::Unresolved(words) = &cli.object {
        cli.object = match words.as_slice() {
            [only] if only == "manpage" => Object::Manpage,
            [first, ..] if first == "manpage" => {
                return Err(ParseError::Usage(Error::usage(
                    "manpage takes no arguments",
                )));
            }
            _ => return Err(ParseError::Usage(unknown_object(words))),
        };
    }
    match &cli.object {
        Object::Linkgroup(o) => o.check(),
        Object::Device(o) => o.check(),
        Object::Stats(o) => o.check(),
        _ => Ok(()),
    }
    .map_err(ParseError::Usage)?;
    Ok(cli)
}

/// The clap command, built (help subcommands added, globals propagated), to look names up.
fn built() -> Command {
    let mut root = Cli::command();
    root.build();
    root
}

/// The usage error for a first word that names no object.
pub fn unknown_object(words: &[OsString]) -> Error {
    let root = built();
    let word = words
        .first()
        .map(|w| w.to_string_lossy())
        .unwrap_or_default();
    unresolved(&root, &word, "object")
}

/// The usage error for a word clap could not resolve as a verb (or object): which command
/// it was looking at is read back from clap, by parsing again with errors ignored.
fn unresolved_word(args: &[OsString], word: &str) -> Error {
    let mut root = Cli::command().ignore_errors(true);
    let path: Vec<String> = match root.try_get_matches_from_mut(args) {
        Ok(m) => {
            let mut path = Vec::new();
            let mut m = &m;
            while let Some((name, sub)) = m.subcommand() {
                path.push(name.to_owned());
                m = sub;
            }
            path
        }
        Err(_) => Vec::new(),
    };
    let path: Vec<&str> = path.iter().map(String::as_str).collect();
    let what = if path.is_empty() { "object" } else { "verb" };
    unresolved(subcommand(&root, &path), word, what)
}

/// The (built) subcommand of `root` at `path`, or the deepest one that exists.
fn subcommand<'a>(root: &'a Command, path: &[&str]) -> &'a Command {
    let mut cmd = root;
    for name in path {
        match cmd.find_subcommand(name) {
            Some(sub) => cmd = sub,
            None => break,
        }
    }
    cmd
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

/// A word that names no subcommand of `cmd` (or more than one), phrased as smc-tools users
/// expect: what was wrong and what the choices are.
fn unresolved(cmd: &Command, word: &str, what: &str) -> Error {
    let visible: Vec<&str> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(Command::get_name)
        .collect();
    let matches: Vec<&str> = visible
        .iter()
        .copied()
        .filter(|n| n.starts_with(word))
        .collect();
    let scope = if what == "object" {
        String::new()
    } else {
        format!(" of {}", cmd.get_name())
    };
    if matches.len() > 1 {
        Error::usage(format!(
            "{what} \"{word}\"{scope} is ambiguous: {} (try 'smcctl --help')",
            matches.join(", ")
        ))
    } else {
        Error::usage(format!(
            "{what} \"{word}\"{scope} is unknown; expected one of: {} (try 'smcctl --help')",
            visible.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn try_line(line: &str) -> Result<Cli, ParseError> {
        let args: Vec<OsString> = std::iter::once("smcctl")
            .chain(line.split_whitespace())
            .map(OsString::from)
            .collect();
        parse(args)
    }

    fn usage_error(line: &str) -> Error {
        match try_line(line) {
            Err(ParseError::Usage(e)) => e,
            other => panic!("{line}: expected a usage error, got {other:?}"),
        }
    }

    /// What a line means, in full words: the command, its resolved verb with its arguments,
    /// and the global options. Two lines mean the same exactly when these are equal.
    fn meaning(line: &str) -> String {
        let cli = try_line(line).unwrap_or_else(|e| panic!("{line}: {e:?}"));
        let verb = match &cli.object {
            Object::Info(o) => format!("{:?}", o.verb()),
            Object::Linkgroup(o) => format!("{:?}", o.verb()),
            Object::Device(o) => format!("{:?}", o.verb()),
            Object::Stats(o) => format!("{:?}", o.verb()),
            Object::HsLimit(o) => format!("{:?}", o.verb()),
            Object::Sysctl(o) => format!("{:?}", o.verb()),
            Object::Ueid(o) => format!("{:?}", o.verb()),
            Object::Seid(o) => format!("{:?}", o.verb()),
            other => format!("{other:?}"),
        };
        format!(
            "{} {verb} socket={} kernel={} netns={:?} json={} d={}",
            crate::cmd::command_name(&cli.object),
            cli.socket.display(),
            cli.kernel,
            cli.netns,
            cli.json,
            cli.details
        )
    }

    fn same(short: &str, full: &str) {
        assert_eq!(meaning(short), meaning(full), "{short:?} vs {full:?}");
    }

    #[test]
    fn prefixes_expand() {
        same("l s", "linkgroup show");
        same("lin sh -d", "linkgroup show -d");
        same("d", "device show");
        same("i", "info show");
        same("st r", "stats reset");
        same("sy g wmem", "sysctl get wmem");
        same("u a ABC", "ueid add ABC");
        same("se e", "seid enable");
        same("hs e", "hs-limit enable");
        same("ss -a", "ss -a");
        same("c bash", "completions bash");
        assert!(meaning("sy g wmem").contains("Get { key: \"wmem\" }"));
        assert!(meaning("c bash").contains("Bash"));
    }

    #[test]
    fn default_verb_is_show() {
        same("stats", "stats show");
        same("stats -d -a", "stats show -d -a");
        same("-d stats", "-d stats show");
        same("stats -d show", "stats show -d");
        same("linkgroup 100", "linkgroup show 100");
        same("l all", "linkgroup show all");
        same("l --smcr", "linkgroup show --smcr");
        same("d --smcr", "device show --smcr");
        same("hs", "hs-limit show");
        same("u", "ueid show");
        assert!(meaning("linkgroup 100").contains("target: Some(\"100\")"));
        assert!(meaning("st -a --smcr").contains("smcr: true"));
        // Help for the object, not for its show.
        match try_line("linkgroup --help") {
            Err(ParseError::Clap(e)) => {
                assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
                assert!(e.to_string().contains("smcctl linkgroup"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn option_values_are_not_objects() {
        same("--socket /tmp/s l", "--socket /tmp/s linkgroup show");
        assert!(meaning("--socket /tmp/s l").contains("socket=/tmp/s"));
        same("--netns s stats", "--netns s stats show");
        same("--netns=blue sy sh", "--netns blue sysctl show");
        assert!(meaning("ss --netns ss").contains("netns=Some(\"ss\")"));
    }

    #[test]
    fn unknown_and_ambiguous_are_usage_errors() {
        let e = usage_error("s");
        assert_eq!(e.code, 2);
        assert!(e.message.contains("ambiguous"), "{}", e.message);
        assert!(e.message.contains("stats") && e.message.contains("sysctl"));
        let e = usage_error("bogus");
        assert_eq!(e.code, 2);
        assert!(e.message.contains("unknown"), "{}", e.message);
        let e = usage_error("stats bogus");
        assert!(
            e.message.contains("verb \"bogus\" of stats"),
            "{}",
            e.message
        );
        let e = usage_error("sysctl s");
        assert!(
            e.message
                .contains("verb \"s\" of sysctl is ambiguous: show, set"),
            "{}",
            e.message
        );
        let e = usage_error("h");
        assert!(e.message.contains("ambiguous"), "{}", e.message);
        let e = usage_error("linkgroup xyz");
        assert!(
            e.message.contains("verb \"xyz\" of linkgroup is unknown"),
            "{}",
            e.message
        );
        assert!(usage_error("linkgroup 100 xyz").message.contains("\"xyz\""));
        // Options of show before an explicit verb.
        assert!(usage_error("stats -a reset").message.contains("stats show"));
        assert!(usage_error("l --smcr s").message.contains("linkgroup show"));
        // The man page only by its full name.
        assert!(
            usage_error("manp")
                .message
                .contains("object \"manp\" is unknown")
        );
        assert!(usage_error("m").message.contains("unknown"));
        assert!(matches!(
            try_line("manpage").unwrap().object,
            Object::Manpage
        ));
        assert!(usage_error("manpage x").message.contains("no arguments"));
    }

    #[test]
    fn abbreviated_lines_parse() {
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
            try_line(line).unwrap_or_else(|e| panic!("{line}: {e:?}"));
        }
    }

    #[test]
    fn conflicting_options_are_refused() {
        for line in [
            "ss -l -a",
            "ss -D -R",
            "d --smcd --smcr",
            "d s --smcd --smcr",
        ] {
            match try_line(line) {
                Err(ParseError::Clap(e)) => assert!(e.use_stderr(), "{line}"),
                other => panic!("{line}: {other:?}"),
            }
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
