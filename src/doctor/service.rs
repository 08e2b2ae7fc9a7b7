//! The doctor inside `gpud run`: a subsystem that runs every check on an interval and keeps
//! the latest report in a [`LatestReport`] (a seam other subsystems read), served at `/doctor`
//! on the admin endpoint.

use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::get;

use super::busy::Busy;
use super::env::Options;
use super::render;
use super::runner;
use super::select::Selection;
use crate::daemon::{Context, Subsystem};
use crate::doctor_report::LatestReport;
use crate::inventory::Inventory;
use crate::nvml::Nvml;

/// `GET /doctor`: the latest report as JSON (the `gpud doctor --json` schema); 503 with a
/// one-line reason before the first run.
pub fn routes(latest: &LatestReport) -> Router {
    let latest = latest.clone();
    Router::new().route(
        "/doctor",
        get(move || {
            let report = latest.get();
            async move {
                match report {
                    Some(report) => (
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "application/json")],
                        render::json(&report),
                    ),
                    None => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [(header::CONTENT_TYPE, "text/plain")],
                        "the first doctor run has not finished\n".to_owned(),
                    ),
                }
            }
        }),
    )
}

/// Runs the doctor every `interval` over the daemon's NVML, `gpu.xid` reporting the verdicts
/// of the health watcher that runs beside it (every daemon that runs the doctor runs one).
#[derive(Debug)]
pub struct PeriodicDoctor {
    nvml: Nvml,
    options: Options,
    interval: Duration,
    latest: LatestReport,
    /// The threads runs left behind, shared by every run so that none is started twice.
    busy: Busy,
}

impl PeriodicDoctor {
    pub fn new(nvml: Nvml, options: Options, interval: Duration, latest: LatestReport) -> Self {
        PeriodicDoctor {
            nvml,
            options,
            interval,
            latest,
            busy: Busy::default(),
        }
    }
}

impl Subsystem for PeriodicDoctor {
    type Settings = ();
    crate::subsystem_name!("doctor");

    async fn run(self, ctx: Context<()>, inventory: Inventory) -> anyhow::Result<()> {
        // Ready at once: the doctor reports on the node, it serves nothing the node needs.
        ctx.set_ready();
        let cancel = ctx.cancel_token();
        loop {
            let (nvml, mut options, busy) =
                (self.nvml.clone(), self.options.clone(), self.busy.clone());
            // The health watcher of this process writes its verdicts into this inventory: the
            // doctor reports them rather than judging XIDs a second time.
            options.watched = Some(inventory.current());
            let run = tokio::task::spawn_blocking(move || {
                runner::run_with(options, &Selection::default(), Some(nvml), &busy).0
            });
            tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                report = run => match report {
                    Ok(report) => {
                        tracing::info!(
                            ok = report.summary.ok,
                            warn = report.summary.warn,
                            fail = report.summary.fail,
                            "Doctor run finished"
                        );
                        self.latest.publish(report);
                    }
                    Err(err) => tracing::warn!(error = %err, "Doctor run failed"),
                },
            }
            tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                () = tokio::time::sleep(crate::backoff::period(self.interval)) => {}
            }
        }
    }
}
