//! smcctl's behaviour that needs no control plane: usage errors, the missing-smcd
//! message, the kernel path (this machine's kernel has no SMC: the one-line error is what
//! is tested; with SMC the real output is), completions and the man page.

mod common;

use common::{BINS, Smcd, smcctl, smcctl_args};

#[test]
#[ignore = "child process entry, started by the tests"]
fn child_entry() {
    common::child_main();
}

#[test]
fn usage_errors_exit_2_with_one_line() {
    let none = Some(std::path::Path::new("/nonexistent/smcd.sock"));
    for (args, says) in [
        ("s", "ambiguous: stats, sysctl, seid, ss"),
        ("h", "ambiguous"),
        ("bogus", "object \"bogus\" is unknown"),
        ("stats bogus", "verb \"bogus\" of stats is unknown"),
        ("sysctl s", "verb \"s\" of sysctl is ambiguous: show, set"),
        ("linkgroup show xyz", "not a link group id"),
        ("sysctl set wmem", "KEY=VALUE"),
        ("ueid add lower-case", "invalid User EID"),
        ("ueid add A..B", "consecutive dots"),
    ] {
        let r = smcctl(none, args);
        let line = r.fails(2);
        assert!(line.contains(says), "{args}: {line}");
    }
    // clap's errors (unknown option, conflicts) are usage errors too.
    for args in [
        "ss -l -a",
        "ss -D -R",
        "device --smcd --smcr",
        "stats --bogus",
    ] {
        let r = smcctl(none, args);
        assert_eq!(r.code, 2, "{args}: {r:#?}");
        assert!(r.stdout.is_empty());
        assert!(!r.stderr.contains("panicked"));
    }
}

#[test]
fn smcd_not_running_names_the_socket_and_how_to_start_it() {
    let path = std::env::temp_dir()
        .join(common::unique("nosmcd"))
        .join("smcd.sock");
    for args in ["info", "linkgroup", "--json stats", "sysctl show", "ss -a"] {
        let r = smcctl(Some(&path), args);
        let line = r.fails(1);
        assert!(line.contains(&path.display().to_string()), "{line}");
        assert!(
            line.contains(&format!("smcd --socket {} &", path.display())),
            "{line}"
        );
    }
    // --socket wins over SMCD_SOCKET.
    let other = std::env::temp_dir()
        .join(common::unique("other"))
        .join("x.sock");
    let r = smcctl_args(
        Some(&path),
        &["--socket", other.to_str().unwrap(), "device"],
    );
    assert!(r.fails(1).contains(&other.display().to_string()));
}

fn kernel_has_smc() -> bool {
    std::path::Path::new("/proc/sys/net/smc").exists()
}

#[test]
fn kernel_transport() {
    let r = smcctl(None, "--kernel info");
    if kernel_has_smc() || r.code == 0 {
        // A kernel with SMC answers for real (the module may load on the lookup).
        assert!(r.ok().starts_with("Kernel Capabilities\n"), "{r:#?}");
        let j = smcctl(None, "--kernel --json info").json();
        assert!(j["smc_version"].is_string() || j["smc_version"].is_null());
        return;
    }
    let line = r.fails(1);
    assert!(line.contains("SMC_GEN_NETLINK"), "{line}");
    assert!(
        line.contains("not loaded") && line.contains("lacks SMC"),
        "{line}"
    );
    for args in [
        "--kernel --json stats",
        "--kernel linkgroup -d",
        "--kernel device --smcr",
    ] {
        let r = smcctl(None, args);
        assert!(r.fails(1).contains("SMC_GEN_NETLINK"), "{args}: {r:#?}");
    }
}

#[test]
fn kernel_has_no_engine_family() {
    // sysctl and ss are smcd's SMCD_ENGINE family; the kernel never has it.
    for args in [
        "--kernel sysctl show",
        "--kernel ss -a",
        "--kernel sysctl get wmem",
    ] {
        let r = smcctl(None, args);
        let line = r.fails(1);
        assert!(line.contains("SMCD_ENGINE"), "{line}");
        assert!(line.contains("/proc/sys/net/smc"), "{line}");
    }
}

#[test]
fn unknown_namespace_is_one_line() {
    let r = smcctl(None, "--netns smcctl-no-such-namespace-xyz stats");
    let line = r.fails(1);
    assert!(
        line.contains("no network namespace smcctl-no-such-namespace-xyz"),
        "{line}"
    );
}

#[test]
fn completions_and_man_page() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let r = smcctl(None, &format!("completions {shell}"));
        assert!(r.ok().contains("smcctl"), "{shell}");
        assert!(
            r.stdout.contains("linkgroup") && r.stdout.contains("hs-limit"),
            "{shell}"
        );
    }
    let man = smcctl(None, "manpage");
    let roff = man.ok();
    assert!(roff.contains(".TH smcctl 1"));
    assert!(roff.contains(".SH \"OBJECTS AND VERBS\""));
    assert!(roff.contains("smcctl linkgroup show"));
    assert!(roff.contains("smcctl sysctl set"));
    // The committed page is the generated one.
    let committed = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/smcctl.1");
    let on_disk = std::fs::read_to_string(&committed).unwrap_or_default();
    assert_eq!(
        on_disk, roff,
        "docs/smcctl.1 is stale: regenerate with `cargo run -p smc-tools --bin smcctl -- manpage > docs/smcctl.1`"
    );
    let help = smcctl(None, "--help");
    assert!(
        help.ok()
            .contains("Exit status: 0 success, 1 a request failed, 2 a usage error")
    );
}

#[test]
fn no_backtrace_reaches_the_user() {
    // RUST_BACKTRACE=1 is set by the helper; a failing request must still be one line.
    let r = smcctl(
        Some(std::path::Path::new("/nonexistent/s.sock")),
        "-dd linkgroup links",
    );
    r.fails(1);
    assert!(!r.stderr.contains("stack backtrace"));
}

/// An smcd without the control plane (or with it): smcctl never hangs and always ends with
/// exit 0 or one line and exit 1.
#[test]
fn any_smcd_answers_or_fails_in_one_line() {
    let smcd = Smcd::start(BINS);
    for args in ["info", "sysctl show"] {
        let r = smcd.ctl(args);
        if r.code != 0 {
            r.fails(1);
        }
    }
}
