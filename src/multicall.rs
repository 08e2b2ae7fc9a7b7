//! Busybox-style dispatch: `gpud <applet> …` or a link named `gpud-<applet>`.
//!
//! Resolution is a pure function of argv so it can be tested without processes; `main` maps
//! its outcome to an exit code. Only applets that work are in the table.

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::ExitCode;

use crate::applets::{APPLETS, Applet};
use crate::daemon::{address_space, exit_code, signals};
use crate::exit;

/// What argv asks for.
#[derive(Debug)]
pub enum Invocation {
    /// Run an applet with these arguments (argv[0] is the applet's display name).
    Applet(&'static Applet, Vec<OsString>),
    /// `gpud --list`.
    List,
    /// `gpud --version`.
    Version,
    /// `gpud`, `gpud --help`.
    Help,
    /// An applet name that does not exist.
    Unknown(String),
}

/// Program names of other projects' tools that gpud stands in for, with the applet each runs:
/// a link named `nvidia-cdi-hook` serves the CDI specs NVIDIA's tools write.
const PROGRAM_ALIASES: &[(&str, &str)] = &[("nvidia-cdi-hook", "cdi-hook")];

/// Works out which applet argv names.
pub fn resolve(argv: &[OsString]) -> Invocation {
    let program = argv.first().map(|arg0| {
        Path::new(arg0)
            .file_name()
            .unwrap_or(OsStr::new(""))
            .to_string_lossy()
            .into_owned()
    });
    if let Some(name) = program.as_deref().and_then(|p| p.strip_prefix("gpud-")) {
        return applet_invocation(name, &argv[1..]);
    }
    if let Some((_, applet)) = PROGRAM_ALIASES
        .iter()
        .find(|(alias, _)| program.as_deref() == Some(*alias))
    {
        return applet_invocation(applet, &argv[1..]);
    }
    let Some(first) = argv.get(1) else {
        return Invocation::Help;
    };
    match first.to_str() {
        Some("--list") => Invocation::List,
        Some("--version" | "-V") => Invocation::Version,
        Some("--help" | "-h" | "help") => Invocation::Help,
        Some(name) => applet_invocation(name, &argv[2..]),
        None => Invocation::Unknown(first.to_string_lossy().into_owned()),
    }
}

fn applet_invocation(name: &str, rest: &[OsString]) -> Invocation {
    match APPLETS.iter().find(|applet| applet.name == name) {
        Some(applet) => {
            let mut args = Vec::with_capacity(rest.len() + 1);
            args.push(OsString::from(format!("gpud {}", applet.name)));
            args.extend_from_slice(rest);
            Invocation::Applet(applet, args)
        }
        None => Invocation::Unknown(name.to_owned()),
    }
}

/// The process entry point. Expects the daemon signals blocked ([`signals::block`], the first
/// thing `main` does); gives them back to everything that is not a daemon.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    address_space::one_line_for_thread_exhaustion();
    let invocation = resolve(&argv);
    if !matches!(invocation, Invocation::Applet(applet, _) if applet.daemon) {
        signals::unblock();
    }
    match invocation {
        // A daemon checks its room before anything else: past this point, running out of
        // address space fails somewhere inside a library, not with a line that says so.
        Invocation::Applet(applet, args) if applet.daemon => {
            exit_code(address_space::check(applet.name).and_then(|()| (applet.run)(args)))
        }
        Invocation::Applet(applet, args) => exit_code((applet.run)(args)),
        Invocation::List => {
            for applet in APPLETS {
                println!("{}", applet.name);
            }
            ExitCode::SUCCESS
        }
        Invocation::Version => {
            println!("gpud {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Invocation::Help => {
            print!("{}", usage());
            ExitCode::SUCCESS
        }
        Invocation::Unknown(name) => {
            eprintln!("{}", unknown_applet(&name));
            ExitCode::from(exit::USAGE)
        }
    }
}

/// The message for an applet name that does not exist, with the closest one when it is close.
fn unknown_applet(name: &str) -> String {
    let closest = APPLETS
        .iter()
        .map(|applet| (strsim::jaro(name, applet.name), applet.name))
        .filter(|(score, _)| *score > 0.7)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match closest {
        Some((_, applet)) => format!(
            "gpud: unknown applet '{name}'; did you mean '{applet}'? (gpud --list shows the applets)"
        ),
        None => format!("gpud: unknown applet '{name}' (gpud --list shows the applets)"),
    }
}

fn usage() -> String {
    let mut text = format!(
        "gpud {} — the GPU node daemon\n\n\
         Usage: gpud <applet> [options]   or   gpud-<applet> [options]\n\
         \x20      gpud --list | --version | --help\n\nApplets:\n",
        env!("CARGO_PKG_VERSION")
    );
    // The descriptions start in one column, two spaces past the longest name.
    let width = APPLETS.iter().map(|a| a.name.len()).max().unwrap_or(0) + 2;
    for applet in APPLETS {
        text.push_str(&format!("  {:<width$}{}\n", applet.name, applet.about));
    }
    text.push_str("\nRun 'gpud <applet> --help' for an applet's options.\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn applet_from_first_argument() {
        match resolve(&argv(&["/usr/bin/gpud", "inventory", "--format", "table"])) {
            Invocation::Applet(applet, args) => {
                assert_eq!(applet.name, "inventory");
                assert_eq!(args, argv(&["gpud inventory", "--format", "table"]));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn applet_from_link_name() {
        match resolve(&argv(&[
            "/usr/local/bin/gpud-inventory",
            "--format",
            "json",
        ])) {
            Invocation::Applet(applet, args) => {
                assert_eq!(applet.name, "inventory");
                assert_eq!(args, argv(&["gpud inventory", "--format", "json"]));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nvidia_cdi_hook_runs_the_cdi_hook_applet() {
        match resolve(&argv(&[
            "/usr/bin/nvidia-cdi-hook",
            "update-ldcache",
            "--folder",
            "/usr/lib64",
        ])) {
            Invocation::Applet(applet, args) => {
                assert_eq!(applet.name, "cdi-hook");
                assert_eq!(
                    args,
                    argv(&["gpud cdi-hook", "update-ldcache", "--folder", "/usr/lib64"])
                );
            }
            other => panic!("{other:?}"),
        }
        // Only the exact name: a similar one is not NVIDIA's hook.
        assert!(matches!(
            resolve(&argv(&["nvidia-cdi-hook-old", "chmod"])),
            Invocation::Unknown(name) if name == "chmod"
        ));
    }

    #[test]
    fn unknown_applets() {
        assert!(
            matches!(resolve(&argv(&["gpud", "frobnicate"])), Invocation::Unknown(n) if n == "frobnicate")
        );
        assert!(
            matches!(resolve(&argv(&["gpud-frobnicate"])), Invocation::Unknown(n) if n == "frobnicate")
        );
    }

    #[test]
    fn unknown_applet_suggests_the_closest() {
        assert_eq!(
            unknown_applet("labeler"),
            "gpud: unknown applet 'labeler'; did you mean 'labeller'? (gpud --list shows the applets)"
        );
        assert_eq!(
            unknown_applet("exproter"),
            "gpud: unknown applet 'exproter'; did you mean 'exporter'? (gpud --list shows the applets)"
        );
        assert_eq!(
            unknown_applet("frobnicate"),
            "gpud: unknown applet 'frobnicate' (gpud --list shows the applets)"
        );
    }

    #[test]
    fn top_level_flags() {
        assert!(matches!(resolve(&argv(&["gpud"])), Invocation::Help));
        assert!(matches!(
            resolve(&argv(&["gpud", "--list"])),
            Invocation::List
        ));
        assert!(matches!(
            resolve(&argv(&["gpud", "--version"])),
            Invocation::Version
        ));
    }
}
