//! `gpud inventory`: prints the node's inventory once, or again whenever it changes.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::cli::{self, CommonArgs, NodeArgs, OutputFormat};
use crate::exit;
use crate::inventory::{Inventory, Snapshot, table};

/// Print everything the node's GPUs are: identity, memory, MIG, NVLink/PCIe topology, health.
#[derive(Debug, Parser)]
#[command(name = "gpud inventory", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Json)]
    format: OutputFormat,

    /// Keep running: rescan every --interval and print the inventory again whenever it changes
    /// (JSON: one document per line).
    #[arg(long)]
    watch: bool,

    /// Rescan interval for --watch, e.g. "5s", "500ms".
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    interval: Duration,

    #[command(flatten)]
    node: NodeArgs,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let args: Args = match cli::parse(argv) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let nvml = match args.common.start() {
        Ok(nvml) => nvml,
        Err(code) => return code,
    };
    let inventory = match Inventory::discover(nvml, args.node.facts()) {
        Ok(inventory) => inventory,
        Err(err) => return cli::fail_nvml(&err),
    };
    if !args.watch {
        return print(&inventory.current(), args.format, false);
    }
    match cli::runtime(1) {
        Ok(runtime) => runtime.block_on(watch(inventory, &args)),
        Err(code) => code,
    }
}

/// Prints the first snapshot, then every changed one, until SIGINT/SIGTERM or a closed stdout.
async fn watch(inventory: Inventory, args: &Args) -> ExitCode {
    let mut updates = inventory.subscribe();
    let first = updates.borrow_and_update().clone();
    let code = print(&first, args.format, true);
    if code != ExitCode::SUCCESS {
        return code;
    }
    let rescanner = inventory.clone();
    let interval = args.interval;
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(err) = rescanner.rescan().await {
                tracing::warn!(error = %err, "Rescan failed");
            }
        }
    });
    let stop = crate::signals::shutdown();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return ExitCode::SUCCESS,
            changed = updates.changed() => {
                if changed.is_err() {
                    return ExitCode::SUCCESS;
                }
                let snapshot = updates.borrow_and_update().clone();
                let code = print(&snapshot, args.format, true);
                if code != ExitCode::SUCCESS {
                    return code;
                }
            }
        }
    }
}

/// Writes one rendering; a closed stdout ends the program quietly (`gpud inventory | head`).
fn print(snapshot: &Snapshot, format: OutputFormat, compact: bool) -> ExitCode {
    let text = match (format, compact) {
        (OutputFormat::Table, _) => table::render(snapshot),
        (OutputFormat::Json, false) => render_json(serde_json::to_string_pretty(snapshot)),
        (OutputFormat::Json, true) => render_json(serde_json::to_string(snapshot)),
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("gpud: cannot write the inventory: {err}");
            ExitCode::from(exit::FAILURE)
        }
    }
}

fn render_json(result: serde_json::Result<String>) -> String {
    // Serialising plain data cannot fail; if it ever did, say so in the output rather than
    // panic.
    match result {
        Ok(mut json) => {
            json.push('\n');
            json
        }
        Err(err) => format!("{{\"error\":\"cannot serialise the inventory: {err}\"}}\n"),
    }
}
