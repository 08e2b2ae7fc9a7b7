//! Which version of `resource.k8s.io` gpud reads claims and writes slices through, found from
//! the API server's discovery document (`GET /apis/resource.k8s.io`): `v1` (Kubernetes 1.34+),
//! else `v1beta2` (1.33, the same flat shape), else `v1beta1` (1.32), whose devices wrap their
//! data in `basic`. The kubelet's gRPC versions are separate ([`super::plugin`]): a 1.32 or
//! 1.33 kubelet speaks v1beta1 gRPC to a plugin whose slices its API server holds as v1beta1
//! or v1beta2.
//!
//! Discovered on first use and kept: a failed discovery is tried again on the next call, so a
//! plugin started before the API server answers (or before DRA is enabled there) catches up
//! without a restart.

use kube::discovery::ApiResource;
use serde_json::Value;
use tokio::sync::OnceCell;

use super::objects::SliceSpec;
use crate::kube::{ApiError, bounded};

/// The API group.
pub const GROUP: &str = "resource.k8s.io";

/// A version of `resource.k8s.io` gpud speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceVersion {
    V1,
    V1beta2,
    V1beta1,
}

impl ResourceVersion {
    /// Best first.
    pub const PREFERENCE: [ResourceVersion; 3] = [
        ResourceVersion::V1,
        ResourceVersion::V1beta2,
        ResourceVersion::V1beta1,
    ];

    /// `v1`, `v1beta2`, `v1beta1`.
    pub fn name(self) -> &'static str {
        match self {
            ResourceVersion::V1 => "v1",
            ResourceVersion::V1beta2 => "v1beta2",
            ResourceVersion::V1beta1 => "v1beta1",
        }
    }

    /// The API resource of ResourceSlices in this version.
    pub fn slices(self) -> ApiResource {
        self.resource("ResourceSlice", "resourceslices")
    }

    /// The API resource of ResourceClaims in this version.
    pub fn claims(self) -> ApiResource {
        self.resource("ResourceClaim", "resourceclaims")
    }

    fn resource(self, kind: &str, plural: &str) -> ApiResource {
        ApiResource {
            group: GROUP.to_owned(),
            version: self.name().to_owned(),
            api_version: format!("{GROUP}/{}", self.name()),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        }
    }

    /// A slice's spec as this version spells it: v1beta1 moves each device's data (all but
    /// its name) into `basic`.
    pub fn slice_to_wire(self, spec: &SliceSpec) -> Value {
        let mut value = serde_json::to_value(spec).unwrap_or_default();
        if self == ResourceVersion::V1beta1 {
            for device in devices_mut(&mut value) {
                let Value::Object(fields) = device else {
                    continue;
                };
                let name = fields.remove("name");
                let basic = Value::Object(std::mem::take(fields));
                if let Some(name) = name {
                    fields.insert("name".into(), name);
                }
                fields.insert("basic".into(), basic);
            }
        }
        value
    }

    /// A slice's spec read in this version, in gpud's (v1) terms; `None` when it is not one.
    pub fn slice_from_wire(self, mut value: Value) -> Option<SliceSpec> {
        if self == ResourceVersion::V1beta1 {
            for device in devices_mut(&mut value) {
                let Value::Object(fields) = device else {
                    continue;
                };
                if let Some(Value::Object(basic)) = fields.remove("basic") {
                    fields.extend(basic);
                }
            }
        }
        serde_json::from_value(value).ok()
    }
}

fn devices_mut(spec: &mut Value) -> impl Iterator<Item = &mut Value> {
    spec.get_mut("devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

/// The newer ResourceSlice fields the API server keeps, as far as gpud can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedFields {
    /// `sharedCounters` on slices and `consumesCounters` on devices (partitionable devices, KEP-4815).
    pub counters: bool,
    /// Counter sets must be published in slices of their own, without devices (Kubernetes 1.35+).
    pub counters_in_own_slices: bool,
    /// `allowMultipleAllocations` and capacity `requestPolicy` (consumable capacity, KEP-5075).
    pub shared_capacity: bool,
}

impl ServedFields {
    pub const ALL: ServedFields = ServedFields {
        counters: true,
        counters_in_own_slices: true,
        shared_capacity: true,
    };
}

/// A call to the API server failed, or it serves no version gpud speaks.
#[derive(Debug, thiserror::Error)]
pub enum ResourceApiError {
    #[error(transparent)]
    Call(#[from] ApiError),
    #[error(
        "the API server serves {GROUP} in none of the versions gpud speaks (v1, v1beta2, \
         v1beta1; it serves: {}): DRA needs Kubernetes 1.32 or newer, and on 1.32 and 1.33 the \
         beta API enabled (--runtime-config={GROUP}/v1beta1=true or v1beta2=true, feature gate \
         DynamicResourceAllocation)",
        if served.is_empty() { "none".to_owned() } else { served.join(", ") }
    )]
    NotServed { served: Vec<String> },
}

/// The API server's `resource.k8s.io`, in the version it serves best.
pub struct ResourceApi {
    client: kube::Client,
    version: OnceCell<ResourceVersion>,
}

impl std::fmt::Debug for ResourceApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceApi")
            .field("version", &self.version.get())
            .finish_non_exhaustive()
    }
}

impl ResourceApi {
    pub fn new(client: kube::Client) -> ResourceApi {
        ResourceApi {
            client,
            version: OnceCell::new(),
        }
    }

    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The version to use, discovered on the first call that succeeds.
    pub async fn version(&self) -> Result<ResourceVersion, ResourceApiError> {
        self.version
            .get_or_try_init(|| async {
                let served = self.served().await?;
                let version = choose(&served)?;
                tracing::info!(version = %version.name(), served = %served.join(","), "Speaking resource.k8s.io in this version");
                Ok(version)
            })
            .await
            .copied()
    }

    /// The versions the server lists for the group; none when it does not know the group.
    async fn served(&self) -> Result<Vec<String>, ResourceApiError> {
        let request = http::Request::get(format!("/apis/{GROUP}"))
            .body(Vec::new())
            .map_err(|e| {
                ResourceApiError::Call(ApiError::Api {
                    what: format!("discovering the served {GROUP} versions"),
                    source: kube::Error::HttpError(e),
                })
            })?;
        let answer = bounded(
            || format!("discovering the served {GROUP} versions"),
            self.client
                .request::<k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroup>(request),
        )
        .await;
        match answer {
            Ok(group) => Ok(group.versions.into_iter().map(|v| v.version).collect()),
            Err(ApiError::Api {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 404 => Ok(Vec::new()),
            Err(err) => Err(err.into()),
        }
    }
}

/// The best version of `served` gpud speaks.
pub fn choose(served: &[String]) -> Result<ResourceVersion, ResourceApiError> {
    ResourceVersion::PREFERENCE
        .into_iter()
        .find(|v| served.iter().any(|s| s == v.name()))
        .ok_or_else(|| ResourceApiError::NotServed {
            served: served.to_vec(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_best_served_version_is_chosen() {
        let served = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let pick = |list: &[&str]| choose(&served(list)).map_err(|e| e.to_string());
        assert_eq!(pick(&["v1beta1", "v1beta2", "v1"]), Ok(ResourceVersion::V1));
        assert_eq!(
            pick(&["v1alpha3", "v1beta1", "v1beta2"]),
            Ok(ResourceVersion::V1beta2)
        );
        assert_eq!(pick(&["v1beta1"]), Ok(ResourceVersion::V1beta1));
        let err = pick(&["v1alpha3"]).unwrap_err();
        assert!(
            err.contains("it serves: v1alpha3): DRA needs Kubernetes 1.32"),
            "{err}"
        );
        let err = pick(&[]).unwrap_err();
        assert!(err.contains("it serves: none)"), "{err}");
    }

    #[test]
    fn v1beta1_wraps_device_data_in_basic_and_reads_back() {
        let wire = json!({"driver": "d", "pool": {"name": "n", "generation": 1,
            "resourceSliceCount": 1}, "nodeName": "n", "devices": [{"name": "gpu-0",
            "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "1Gi"}}}]});
        let spec: SliceSpec = serde_json::from_value(wire.clone()).unwrap();
        let beta = ResourceVersion::V1beta1.slice_to_wire(&spec);
        assert_eq!(
            beta["devices"][0],
            json!({"name": "gpu-0", "basic": {"attributes": {"type": {"string": "gpu"}},
                "capacity": {"memory": {"value": "1Gi"}}}})
        );
        assert_eq!(
            ResourceVersion::V1beta1.slice_from_wire(beta),
            Some(spec.clone())
        );
        assert_eq!(ResourceVersion::V1beta2.slice_to_wire(&spec), wire);
        assert_eq!(ResourceVersion::V1.slice_from_wire(wire), Some(spec));
    }
}
