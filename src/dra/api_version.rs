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
//!
//! Which of the newer slice fields the server keeps ([`ServedFields`]) follows from three
//! things: the version (v1beta1 and v1beta2 have none of them; gpud does not write them
//! there), the server's Kubernetes version from `GET /version` (1.35+ wants counter sets in
//! slices of their own; when it cannot be read gpud assumes the newest shape and says so),
//! and what the server does with a write: an API server whose feature gate is off drops the
//! field silently, so the publisher compares what it wrote with what came back
//! ([`super::read_back`]), marks a dropped field unserved ([`ResourceApi::dropped_on_write`])
//! and publishes again without it. What gpud leaves out is logged once, with the reason.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use kube::discovery::ApiResource;
use serde_json::Value;
use tokio::sync::OnceCell;
use tracing::{info, warn};

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

/// The newer ResourceSlice fields the API server keeps, as far as gpud can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedFields {
    /// `sharedCounters` on slices and `consumesCounters` on devices (partitionable devices, KEP-4815).
    pub counters: bool,
    /// Counter sets must be published in slices of their own, without devices (Kubernetes 1.35+).
    pub counters_in_own_slices: bool,
    /// `allowMultipleAllocations` and capacity `requestPolicy` (consumable capacity, KEP-5075).
    pub shared_capacity: bool,
    /// List-type attribute values (`ints`, KEP-5491; Kubernetes 1.36+).
    pub list_attributes: bool,
}

impl ServedFields {
    pub const ALL: ServedFields = ServedFields {
        counters: true,
        counters_in_own_slices: true,
        shared_capacity: true,
        list_attributes: true,
    };
    /// A v1beta1 or v1beta2 server: none of the newer fields.
    pub const NONE: ServedFields = ServedFields {
        counters: false,
        counters_in_own_slices: false,
        shared_capacity: false,
        list_attributes: false,
    };

    /// Whether `field` is kept.
    pub fn has(self, field: NewField) -> bool {
        match field {
            NewField::Counters => self.counters,
            NewField::SharedCapacity => self.shared_capacity,
            NewField::ListAttributes => self.list_attributes,
        }
    }

    /// These fields, less `dropped`.
    pub fn without(mut self, dropped: &BTreeSet<NewField>) -> ServedFields {
        for field in dropped {
            match field {
                NewField::Counters => self.counters = false,
                NewField::SharedCapacity => self.shared_capacity = false,
                NewField::ListAttributes => self.list_attributes = false,
            }
        }
        self
    }
}

/// A group of newer slice fields that come and go together, behind one feature gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NewField {
    /// `sharedCounters`, `consumesCounters`.
    Counters,
    /// `allowMultipleAllocations`, capacity `requestPolicy`.
    SharedCapacity,
    /// List-type attribute values: `resource.kubernetes.io/numaNode` as `ints`.
    ListAttributes,
}

impl NewField {
    /// The fields, as the API spells them.
    pub fn fields(self) -> &'static str {
        match self {
            NewField::Counters => "sharedCounters and consumesCounters",
            NewField::SharedCapacity => "allowMultipleAllocations and capacity requestPolicy",
            NewField::ListAttributes => "list-type attribute values (ints)",
        }
    }

    /// What they are for.
    pub fn feature(self) -> &'static str {
        match self {
            NewField::Counters => "partitionable devices",
            NewField::SharedCapacity => "consumable capacity, GPUs shared by capacity",
            NewField::ListAttributes => {
                "resource.kubernetes.io/numaNode with the nearest NUMA nodes of the GPU's socket"
            }
        }
    }

    /// The Kubernetes feature gate that keeps them.
    pub fn gate(self) -> &'static str {
        match self {
            NewField::Counters => "DRAPartitionableDevices",
            NewField::SharedCapacity => "DRAConsumableCapacity",
            NewField::ListAttributes => "DRAListTypeAttributes",
        }
    }
}

/// The first release whose `resource.k8s.io/v1` has list-type attributes (alpha in 1.36).
pub const LIST_ATTRIBUTES_SINCE: (u32, u32) = (1, 36);

/// The newer fields a server of `version` can keep, the server being Kubernetes `server`
/// (`(major, minor)`; `None` when `GET /version` failed: the newest shape is assumed).
pub fn served_fields(version: ResourceVersion, server: Option<(u32, u32)>) -> ServedFields {
    match version {
        ResourceVersion::V1 => ServedFields {
            counters: true,
            counters_in_own_slices: server.is_none_or(|v| v >= (1, 35)),
            shared_capacity: true,
            list_attributes: server.is_none_or(|v| v >= LIST_ATTRIBUTES_SINCE),
        },
        ResourceVersion::V1beta2 | ResourceVersion::V1beta1 => ServedFields::NONE,
    }
}

/// `(major, minor)` of a `GET /version` answer: from `gitVersion` (`v1.35.2-gke.100`), else
/// from `major` and `minor` (`35+` on some managed clusters); `None` when neither reads.
pub fn kubernetes_version(git_version: &str, major: &str, minor: &str) -> Option<(u32, u32)> {
    let leading = |text: &str| -> Option<u32> {
        let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let mut parts = git_version.trim().trim_start_matches('v').split('.');
    if let (Some(a), Some(b)) = (parts.next(), parts.next())
        && let (Some(a), Some(b)) = (leading(a), leading(b))
    {
        return Some((a, b));
    }
    Some((leading(major)?, leading(minor)?))
}

/// The API server's `resource.k8s.io`, in the version it serves best.
pub struct ResourceApi {
    client: kube::Client,
    version: OnceCell<ResourceVersion>,
    /// The newer fields the version and the server's release allow.
    shape: OnceCell<ServedFields>,
    /// The server's release (`(major, minor)`), once read; `None` inside when it could not be.
    release: std::sync::OnceLock<Option<(u32, u32)>>,
    /// What writes showed the server drops, and what was logged.
    notes: Mutex<FieldNotes>,
}

/// Fields the server dropped from gpud's writes, and those whose absence was logged.
#[derive(Debug, Default)]
struct FieldNotes {
    dropped: BTreeSet<NewField>,
    told: BTreeSet<NewField>,
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
            shape: OnceCell::new(),
            release: std::sync::OnceLock::new(),
            notes: Mutex::new(FieldNotes::default()),
        }
    }

    /// The newer slice fields the server keeps: found on the first call (after the version),
    /// less the ones writes showed it drops.
    pub async fn served_fields(&self) -> Result<ServedFields, ResourceApiError> {
        let version = self.version().await?;
        let shape = *self
            .shape
            .get_or_init(|| async {
                let server = self.kubernetes_version().await;
                let _ = self.release.set(server.as_ref().ok().copied());
                let shape = served_fields(version, server.as_ref().ok().copied());
                match (&server, version) {
                    (Ok((major, minor)), _) => {
                        info!(version = %version.name(), kubernetes = %format!("{major}.{minor}"), counters_in_own_slices = shape.counters_in_own_slices, "The API server's release decides the shape of the ResourceSlices");
                    }
                    (Err(why), ResourceVersion::V1) => {
                        warn!(error = %why, "Cannot read the API server's Kubernetes version; assuming 1.35 or newer (counter sets published in slices of their own)");
                    }
                    (Err(_), _) => {}
                }
                shape
            })
            .await;
        Ok(shape.without(&self.notes().dropped))
    }

    /// `(major, minor)` from `GET /version`; the error says why not.
    async fn kubernetes_version(&self) -> Result<(u32, u32), String> {
        let info = bounded(
            || "reading the API server's version (GET /version)".to_owned(),
            self.client.apiserver_version(),
        )
        .await
        .map_err(|e| crate::logging::error_chain(&e))?;
        kubernetes_version(&info.git_version, &info.major, &info.minor).ok_or_else(|| {
            format!(
                "GET /version answered gitVersion {:?}, major {:?}, minor {:?}: no version gpud can read",
                info.git_version, info.major, info.minor
            )
        })
    }

    fn notes(&self) -> std::sync::MutexGuard<'_, FieldNotes> {
        self.notes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The server dropped `fields` from a slice gpud wrote (its feature gate is off): from
    /// now on they count as unserved; each is logged once, naming the gate to enable.
    pub fn dropped_on_write(&self, fields: &BTreeSet<NewField>) {
        let mut notes = self.notes();
        for &field in fields {
            if notes.dropped.insert(field) && notes.told.insert(field) {
                if field == NewField::ListAttributes {
                    // gpud asked for nothing here: the scalar it falls back to is what every
                    // release before 1.36 gets, so this is news, not a warning.
                    info!(
                        gate = field.gate(),
                        "The API server does not keep list-type attributes (feature gate {} is off there): publishing resource.kubernetes.io/numaNode as the GPU's NUMA node alone (an int); enable {} on the API server and the scheduler to publish it with the nearest NUMA nodes of the GPU's socket",
                        field.gate(),
                        field.gate()
                    );
                    continue;
                }
                warn!(
                    gate = field.gate(),
                    "The API server dropped {} ({}) from the ResourceSlices gpud wrote: feature gate {} is off there. Publishing the devices without them; enable {} on the API server, the scheduler and the kubelets to use them",
                    field.fields(),
                    field.feature(),
                    field.gate(),
                    field.gate()
                );
            }
        }
    }

    /// gpud wanted `field` but the server does not keep it: logged once, with the reason.
    pub fn left_out(&self, field: NewField) {
        if !self.notes().told.insert(field) {
            return;
        }
        let version = self.version.get().map_or("?", |v| v.name());
        if field == NewField::ListAttributes {
            let release = match self.release.get().copied().flatten() {
                Some((major, minor)) => format!("Kubernetes {major}.{minor}"),
                None => format!("{GROUP} {version}"),
            };
            let (major, minor) = LIST_ATTRIBUTES_SINCE;
            info!(
                gate = field.gate(),
                "Publishing resource.kubernetes.io/numaNode as the GPU's NUMA node alone (an int): the API server is {release}, which has no list-type attributes; they need Kubernetes {major}.{minor} or newer with feature gate {}",
                field.gate()
            );
            return;
        }
        warn!(
            gate = field.gate(),
            "Publishing the devices without {} ({}): the API server serves {GROUP} {version}, which has no such fields; they need {GROUP}/v1 (Kubernetes 1.34 or newer) with feature gate {}",
            field.fields(),
            field.feature(),
            field.gate()
        );
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
    fn the_shape_follows_the_served_version_and_the_servers_release() {
        let v = |git: &str| kubernetes_version(git, "", "");
        assert_eq!(v("v1.34.2"), Some((1, 34)));
        assert_eq!(v("v1.36.0"), Some((1, 36)));
        assert_eq!(v("v1.35.1-gke.1616000"), Some((1, 35)));
        assert_eq!(kubernetes_version("", "1", "35+"), Some((1, 35)));
        assert_eq!(kubernetes_version("unknown", "", ""), None);

        let shape = |version, server| served_fields(version, server);
        let v134 = shape(ResourceVersion::V1, Some((1, 34)));
        assert_eq!(
            v134,
            ServedFields {
                counters: true,
                counters_in_own_slices: false,
                shared_capacity: true,
                list_attributes: false,
            }
        );
        let v135 = shape(ResourceVersion::V1, Some((1, 35)));
        assert!(v135.counters_in_own_slices && !v135.list_attributes);
        assert_eq!(shape(ResourceVersion::V1, Some((1, 36))), ServedFields::ALL);
        assert_eq!(shape(ResourceVersion::V1, Some((1, 37))), ServedFields::ALL);
        // GET /version failed: the newest shape.
        assert_eq!(shape(ResourceVersion::V1, None), ServedFields::ALL);
        for beta in [ResourceVersion::V1beta2, ResourceVersion::V1beta1] {
            assert_eq!(shape(beta, Some((1, 36))), ServedFields::NONE);
            assert_eq!(shape(beta, None), ServedFields::NONE);
        }
        let dropped = [NewField::SharedCapacity].into_iter().collect();
        let less = ServedFields::ALL.without(&dropped);
        assert!(less.counters && less.counters_in_own_slices && !less.shared_capacity);
        assert!(!less.has(NewField::SharedCapacity) && less.has(NewField::Counters));
    }

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
