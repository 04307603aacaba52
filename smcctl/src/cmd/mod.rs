//! One module per object, as smc-tools has one file per object. Each builds a view from
//! the replies (plain serde structs: `--json` prints exactly them) and renders the
//! smc-tools text from the same view.

pub mod device;
pub mod eid;
pub mod hslimit;
pub mod info;
pub mod linkgroup;
pub mod ss;
pub mod stats;
pub mod sysctl;
#[cfg(test)]
pub(crate) mod testutil;

use clap::CommandFactory;

use crate::cli::{
    Cli, DeviceVerb, HsLimitVerb, InfoVerb, LinkgroupShow, LinkgroupVerb, Object, SeidVerb,
    StatsVerb, SysctlVerb, UeidVerb,
};
use crate::error::Error;
use crate::netns::NetnsArg;
use crate::session::Session;

/// The command in full words, for messages (`stats reset`).
pub fn command_name(o: &Object) -> &'static str {
    match o {
        Object::Info(_) => "info",
        Object::Linkgroup(o) => match o.verb() {
            LinkgroupVerb::Show(_) => "linkgroup show",
            LinkgroupVerb::Links { .. } => "linkgroup links",
        },
        Object::Device(_) => "device show",
        Object::Stats(o) => match o.verb() {
            StatsVerb::Show(_) => "stats show",
            StatsVerb::Reset(_) => "stats reset",
        },
        Object::HsLimit(o) => match o.verb() {
            HsLimitVerb::Show => "hs-limit show",
            HsLimitVerb::Enable => "hs-limit enable",
            HsLimitVerb::Disable => "hs-limit disable",
        },
        Object::Sysctl(o) => match o.verb() {
            SysctlVerb::Show => "sysctl show",
            SysctlVerb::Get { .. } => "sysctl get",
            SysctlVerb::Set { .. } => "sysctl set",
        },
        Object::Ueid(o) => match o.verb() {
            UeidVerb::Show => "ueid show",
            UeidVerb::Add { .. } => "ueid add",
            UeidVerb::Del { .. } => "ueid del",
            UeidVerb::Flush => "ueid flush",
        },
        Object::Seid(o) => match o.verb() {
            SeidVerb::Show => "seid show",
            SeidVerb::Enable => "seid enable",
            SeidVerb::Disable => "seid disable",
        },
        Object::Ss(_) => "ss",
        Object::Completions { .. } => "completions",
        Object::Manpage => "manpage",
        Object::Unresolved(_) => "smcctl",
    }
}

/// Whether the command sends `SMC_GEN_NETLINK` requests, which carry no namespace
/// selector: with `--netns` smcctl must enter the namespace first.
fn uses_smc_family(o: &Object) -> bool {
    !matches!(
        o,
        Object::Sysctl(_)
            | Object::Ss(_)
            | Object::Completions { .. }
            | Object::Manpage
            | Object::Unresolved(_)
    )
}

/// Runs the parsed command line; returns what to print on stdout.
pub fn execute(cli: &Cli) -> Result<String, Error> {
    match &cli.object {
        Object::Completions { shell } => {
            let mut cmd = Cli::command();
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut cmd, "smcctl", &mut out);
            return Ok(String::from_utf8_lossy(&out).into_owned());
        }
        Object::Manpage => return manpage(),
        // `cli::parse` never returns it; a `Cli` parsed by clap alone may hold it.
        Object::Unresolved(words) => return Err(crate::cli::unknown_object(words)),
        _ => {}
    }
    let netns = cli.netns.as_deref().map(NetnsArg::parse).transpose()?;
    let name = command_name(&cli.object);
    if let Some(ns) = &netns
        && uses_smc_family(&cli.object)
    {
        ns.enter(name)?;
    }
    let mut s = Session::new(
        cli.json,
        cli.details,
        netns,
        cli.kernel,
        cli.socket.clone(),
        name,
    );
    match &cli.object {
        Object::Info(o) => match o.verb() {
            InfoVerb::Show => info::show(&mut s),
        },
        Object::Linkgroup(o) => match o.verb() {
            LinkgroupVerb::Show(LinkgroupShow { target, tech }) => {
                linkgroup::show(&mut s, target.as_deref(), tech.is_smcr())
            }
            LinkgroupVerb::Links { target } => linkgroup::links(&mut s, target.as_deref()),
        },
        Object::Device(o) => match o.verb() {
            DeviceVerb::Show(tech) => device::show(&mut s, tech.is_smcr()),
        },
        Object::Stats(o) => match o.verb() {
            StatsVerb::Show(a) => stats::run(&mut s, a.tech.is_smcr(), false),
            StatsVerb::Reset(a) => stats::run(&mut s, a.tech.is_smcr(), true),
        },
        Object::HsLimit(o) => match o.verb() {
            HsLimitVerb::Show => hslimit::show(&mut s),
            HsLimitVerb::Enable => hslimit::set(&mut s, true),
            HsLimitVerb::Disable => hslimit::set(&mut s, false),
        },
        Object::Sysctl(o) => match o.verb() {
            SysctlVerb::Show => sysctl::show(&mut s),
            SysctlVerb::Get { key } => sysctl::get(&mut s, &key),
            SysctlVerb::Set { assignment } => sysctl::set(&mut s, &assignment),
        },
        Object::Ueid(o) => match o.verb() {
            UeidVerb::Show => eid::ueid_show(&mut s),
            UeidVerb::Add { eid } => eid::ueid_add(&mut s, &eid),
            UeidVerb::Del { eid } => eid::ueid_del(&mut s, &eid),
            UeidVerb::Flush => eid::ueid_flush(&mut s),
        },
        Object::Seid(o) => match o.verb() {
            SeidVerb::Show => eid::seid_show(&mut s),
            SeidVerb::Enable => eid::seid_set(&mut s, true),
            SeidVerb::Disable => eid::seid_set(&mut s, false),
        },
        Object::Ss(o) => ss::run(&mut s, o),
        Object::Completions { .. } | Object::Manpage | Object::Unresolved(_) => Ok(String::new()),
    }
}

/// The man page, generated from the clap definitions: clap_mangen's page for `smcctl`,
/// then a section listing every object with its verbs, usages and options.
pub fn manpage() -> Result<String, Error> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut out)
        .map_err(|e| Error::failed(format!("cannot render the man page: {e}")))?;
    let mut roff = String::from_utf8_lossy(&out).into_owned();
    roff.push_str(".SH \"OBJECTS AND VERBS\"\n");
    for obj in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
        if obj.get_name() == "help" {
            continue;
        }
        roff.push_str(&format!(".SS {}\n", obj.get_name()));
        if let Some(a) = obj.get_about() {
            roff.push_str(&format!("{}\n", escape(&a.to_string())));
        }
        let verbs: Vec<&clap::Command> = obj
            .get_subcommands()
            .filter(|v| v.get_name() != "help")
            .collect();
        if verbs.is_empty() {
            describe(&mut roff, obj);
        }
        for verb in verbs {
            describe(&mut roff, verb);
        }
    }
    Ok(roff)
}

/// One `.TP` entry: the usage line, the description and the verb's own options.
fn describe(roff: &mut String, c: &clap::Command) {
    let usage = c.clone().render_usage().to_string();
    let usage = usage.trim_start_matches("Usage: ").trim();
    roff.push_str(&format!(".TP\n\\fB{}\\fR\n", escape(usage)));
    if let Some(a) = c.get_long_about().or(c.get_about()) {
        roff.push_str(&format!("{}\n", escape(&a.to_string())));
    }
    for a in c
        .get_arguments()
        .filter(|a| !a.is_global_set() && !a.is_hide_set())
    {
        if a.get_id() == "help" || a.get_id() == "version" {
            continue;
        }
        let name = match (a.get_short(), a.get_long()) {
            (Some(s), Some(l)) => format!("-{s}, --{l}"),
            (None, Some(l)) => format!("--{l}"),
            (Some(s), None) => format!("-{s}"),
            (None, None) => a
                .get_value_names()
                .and_then(|v| v.first().map(ToString::to_string))
                .unwrap_or_else(|| a.get_id().to_string()),
        };
        let help = a.get_help().map(ToString::to_string).unwrap_or_default();
        roff.push_str(&format!(
            ".RS\n.TP\n{}\n{}\n.RE\n",
            escape(&name),
            escape(&help)
        ));
    }
}

/// roff escapes: backslashes, and a leading dot or quote that would start a request.
fn escape(s: &str) -> String {
    let s = s.replace('\\', "\\\\").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}
