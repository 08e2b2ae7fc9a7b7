//! Evicting one pod through the Eviction API (`policy/v1`, `POST …/pods/<name>/eviction`)
//! rather than deleting it: the API server then keeps the pod's PodDisruptionBudgets, and
//! answers 429 while one allows no disruption. One call; the caller retries what was
//! refused, on its backoff lengthened to what the API server asks ([`ApiError::paced`]).

use ::kube::api::{Api, EvictParams};
use k8s_openapi::api::core::v1::Pod;

use super::ApiError;
use super::call::bounded;

/// What became of one eviction.
#[derive(Debug)]
pub enum Eviction {
    /// Taken (201): the pod is being deleted, within its own grace period.
    Evicted,
    /// No such pod (404): it is gone already, which is what the eviction was for.
    Gone,
    /// Refused for now (429): a PodDisruptionBudget allows no disruption at present (its
    /// message says which), or the API server sheds load. Try again later, no sooner than
    /// [`ApiError::paced`] says (it carries the `retryAfterSeconds` the API server sent, if
    /// any).
    Refused(ApiError),
}

/// Asks the API server to evict pod `namespace/name`. An error for anything but the three
/// answers of [`Eviction`] (a 403 from RBAC, a 500 for a pod covered by two budgets, no
/// answer in time).
pub async fn evict(
    client: &::kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Eviction, ApiError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let answer = bounded(
        || format!("evicting pod {namespace}/{name}"),
        pods.evict(name, &EvictParams::default()),
    )
    .await;
    match answer {
        Ok(_) => Ok(Eviction::Evicted),
        Err(err) => match err.status() {
            Some(404) => Ok(Eviction::Gone),
            Some(429) => Ok(Eviction::Refused(err)),
            _ => Err(err),
        },
    }
}
