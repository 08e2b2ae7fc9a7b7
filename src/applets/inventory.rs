//! `gpud inventory`: prints the node's inventory once, or again whenever it changes.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::cli::{self, CommonArgs, NodeArgs, OutputFormat, StateArgs};
use crate::daemon::{Error, signals};
use crate::inventory::{Inventory, Snapshot, table};
use crate::nvml::Rescanner;

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
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = crate::values::positive_duration)]
    interval: Duration,

    #[command(flatten)]
    node: NodeArgs,

    /// Where a gpud daemon on this node keeps its state: each GPU's remediation phase and the
    /// admins' device taints its DRA plugin saw are read from there.
    #[command(flatten)]
    state: StateArgs,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    let nvml = args.common.start()?;
    let rescanner = Rescanner::new(nvml, args.node.facts(), args.interval);
    let inventory = rescanner.discover()?;
    // What the daemon's remediation says of each GPU, and the admins' device taints its DRA
    // plugin saw, as it last wrote them.
    if !args.state.state_dir.is_empty() {
        let dir = std::path::Path::new(&args.state.state_dir);
        let views = crate::remediation_state::record::views_in(dir);
        let taints = crate::dra::taint_rules::kept(dir);
        inventory.update(|snapshot| {
            for gpu in &mut snapshot.gpus {
                gpu.remediation = views.get(&gpu.uuid).cloned();
                gpu.device_taints = taints.get(&gpu.uuid).cloned().unwrap_or_default();
            }
        });
    }
    if args.watch {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| Error::Failure(format!("cannot start the runtime: {err}")))?
            .block_on(watch(rescanner, inventory, args.format))?;
    } else {
        print(&inventory.current(), args.format, false)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the first snapshot, then every changed one, until SIGINT/SIGTERM or a closed stdout.
async fn watch(
    rescanner: Rescanner,
    inventory: Inventory,
    format: OutputFormat,
) -> Result<(), Error> {
    let mut updates = inventory.subscribe();
    let first = updates.borrow_and_update().clone();
    print(&first, format, true)?;
    let rescans = rescanner.spawn(&inventory);
    let stop_signal = signals::shutdown();
    tokio::pin!(stop_signal);
    let outcome = loop {
        tokio::select! {
            () = &mut stop_signal => break Ok(()),
            changed = updates.changed() => {
                if changed.is_err() {
                    break Ok(());
                }
                let snapshot = updates.borrow_and_update().clone();
                if let Err(err) = print(&snapshot, format, true) {
                    break Err(err);
                }
            }
        }
    };
    rescans.stop().await;
    outcome
}

/// Writes one rendering; a closed stdout ends the program quietly (`gpud inventory | head`).
fn print(snapshot: &Snapshot, format: OutputFormat, compact: bool) -> Result<(), Error> {
    let text = match (format, compact) {
        (OutputFormat::Table, _) => table::render(snapshot),
        (OutputFormat::Json, false) => render_json(serde_json::to_string_pretty(snapshot)),
        (OutputFormat::Json, true) => render_json(serde_json::to_string(snapshot)),
    };
    cli::print_stdout(&text, "the inventory")
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
