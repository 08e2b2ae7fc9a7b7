//! The labeller as a daemon subsystem: its settings are GFD's part of NVIDIA's config file,
//! re-read on SIGHUP; the API sink (if any) is connected when it starts.

use super::{ApiSink, Settings};
use crate::daemon::{Context, Subsystem};
use crate::inventory::Inventory;

/// How the labeller reaches the Kubernetes API, resolved when it starts (connecting is
/// async, the applet's set-up is not).
pub type ApiConnect = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<ApiSink>, crate::kube::ApiError>> + Send>,
>;

/// Labels the node; ready once the labels reached every sink.
pub struct Labeller {
    api: ApiConnect,
}

impl std::fmt::Debug for Labeller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Labeller").finish_non_exhaustive()
    }
}

impl Labeller {
    /// A labeller whose API sink `api` connects (a future resolving to `None` for the
    /// features file alone).
    pub fn new(api: ApiConnect) -> Self {
        Labeller { api }
    }
}

impl Subsystem for Labeller {
    type Settings = Settings;
    crate::subsystem_name!("labeller");

    async fn run(self, ctx: Context<Settings>, inventory: Inventory) -> anyhow::Result<()> {
        let api_sink = self.api.await?;
        super::run(
            ctx.cancel_token(),
            inventory,
            ctx.settings(),
            api_sink,
            ctx.ready_latch(),
            &|| ctx.handed_over(),
            ctx.takeover_abandoned(),
        )
        .await?;
        Ok(())
    }
}
