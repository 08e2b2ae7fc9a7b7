//! XID catalog and XID health policy.
//!
//! This module owns two pure pieces of the health subsystem:
//!
//! * the **catalog**: what each XID the NVIDIA driver reports means, how
//!   severe it is and what an operator should do about it ([`lookup`]);
//! * the **policy**: which XIDs mark a device unhealthy, configured the way
//!   NVIDIA's k8s-device-plugin configures it ([`XidPolicy`]).
//!
//! An XID arrives in the kernel log as an `NVRM` line, for example (a GPU
//! that dropped off PCIe on a 535-series driver):
//!
//! ```text
//! NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
//! ```
//!
//! Parsing such lines is `kmsg.rs`'s job; this module starts from the code.
//!
//! Invariants: the catalog is sorted by code with no duplicates (checked by
//! the tests), lookups never allocate, and nothing here reads the
//! environment, the clock or any file.
//!
//! Reference: NVIDIA's XID catalog,
//! <https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html>.

use std::collections::BTreeSet;
use std::fmt;

use crate::inventory::health::HealthState;

// === Severity and Action ===

/// How bad an XID is for the GPU that reported it, least severe first.
///
/// The variants are ordered, so `severity >= Severity::Critical` is a valid
/// test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The fault is scoped to one workload; the GPU stays in service.
    Application,
    /// Worth recording; the GPU keeps serving and needs no action now.
    Warning,
    /// The GPU needs an intervention (reset, reboot or inspection) but the
    /// driver does not consider it lost.
    Critical,
    /// The GPU must stop receiving work until it is reset or the node is
    /// rebooted.
    Fatal,
}

impl Severity {
    /// Lower-case name, stable for logs and metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Application => "application",
            Self::Warning => "warning",
            Self::Critical => "critical",
            Self::Fatal => "fatal",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an operator should do after an XID: the inventory's typed remedy, so that what the
/// catalog says reaches every reader of a verdict as a value, not as words.
pub use crate::inventory::remedy::Remedy as Action;

// === XidInfo ===

/// Everything the catalog knows about one XID code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidInfo {
    /// The XID number as printed by the driver.
    pub code: u32,
    /// NVIDIA's mnemonic, e.g. `ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS`.
    pub name: &'static str,
    /// A short human description, e.g. "GPU has fallen off the bus".
    pub description: &'static str,
    /// How severe the XID is for the reporting GPU.
    pub severity: Severity,
    /// What to do about it.
    pub action: Action,
}

/// Name given to codes the catalog does not know.
pub const UNKNOWN_NAME: &str = "UNKNOWN";

impl XidInfo {
    /// Whether this entry came from the catalog rather than the unknown-code
    /// fallback of [`lookup`].
    pub fn is_known(&self) -> bool {
        find(self.code).is_some()
    }

    /// One line for logs and reports, e.g.
    /// `XID 79: GPU has fallen off the bus — drain and reboot the node`.
    ///
    /// The wording is stable; tests and golden files depend on it.
    pub fn summary(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for XidInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "XID {}: {} — {}",
            self.code,
            self.description,
            self.action.phrase()
        )
    }
}

// === Catalog ===
//
// Each row records two public classifications of an XID, and `classify`
// turns them into a `Severity` and an `Action`:
//
// * NVIDIA's "immediate resolution" bucket from its XID catalog
//   (`Immediate`). It is the vendor's own statement of what the fault
//   requires right now, so it decides the action and the broad severity.
// * leptonai/gpud's event type (`Gpud`). gpud only distinguishes Warning from
//   Fatal (and says whether the first suspect is the user application), so it
//   is used to split buckets that NVIDIA's column leaves ambiguous.
//
// Severity mapping:
//
// | NVIDIA immediate bucket                 | gpud Warning | gpud Fatal  |
// |-----------------------------------------|--------------|-------------|
// | RESTART_APP, WORKFLOW_XID_45            | Application  | Application |
// | IGNORE, gpud blames the application     | Application  | (none)      |
// | IGNORE otherwise                        | Warning      | Warning     |
// | CHECK_MECHANICALS, CHECK_UVM, XID_154   | Warning      | Warning     |
// | RESET_GPU, RESTART_VM, WORKFLOW_XID_48, | Critical     | Fatal       |
// | WORKFLOW_NVLINK*, CONTACT_SUPPORT       |              |             |
// | RESTART_BM                              | Fatal        | Fatal       |
//
// Why: when NVIDIA says restarting the application is enough, the GPU stays
// in service whatever gpud's type says (this is what makes XID 94, a
// contained memory error, an application-scoped event, matching NVIDIA's
// guidance "restart the app only"). When NVIDIA says ignore, the GPU keeps
// serving. When NVIDIA asks for a reset, restart or support case, both
// sources agree something is wrong with the GPU, and gpud's Fatal is what
// separates "stop scheduling now" from "degraded, fix soon". RESTART_BM is
// only used for XID 79: the GPU is gone from the bus.
//
// Action mapping: RESTART_APP -> RestartWorkload; RESET_GPU and
// WORKFLOW_XID_48 (NVIDIA's older guidance: drain and reset) -> ResetGpu;
// RESTART_BM and RESTART_VM -> RebootNode; CONTACT_SUPPORT,
// CHECK_MECHANICALS and the NVLink workflows -> InspectHardware (as gpud
// maps them); IGNORE, WORKFLOW_XID_45 (a sympathetic cleanup whose root
// cause is another XID) and XID_154 (informational; the new recovery action
// must be read from NVML) -> None; CHECK_UVM -> ConsultDocs.

/// NVIDIA's immediate-resolution bucket for an XID.
#[derive(Debug, Clone, Copy)]
enum Immediate {
    RestartApp,
    Ignore,
    ResetGpu,
    RestartBareMetal,
    RestartVm,
    ContactSupport,
    CheckMechanicals,
    CheckUvm,
    Workflow45,
    Workflow48,
    WorkflowNvlink,
    RecoveryActionChanged,
}

/// leptonai/gpud's event type for an XID.
#[derive(Debug, Clone, Copy)]
enum Gpud {
    /// Warning, first repair action "check the user application".
    AppWarning,
    Warning,
    Fatal,
}

/// Derives severity and action from the two source classifications; see the
/// mapping table above.
const fn classify(immediate: Immediate, gpud: Gpud) -> (Severity, Action) {
    let gpud_fatal = matches!(gpud, Gpud::Fatal);
    match immediate {
        Immediate::RestartApp => (Severity::Application, Action::RestartWorkload),
        Immediate::Workflow45 => (Severity::Application, Action::None),
        Immediate::Ignore => match gpud {
            Gpud::AppWarning => (Severity::Application, Action::None),
            Gpud::Warning | Gpud::Fatal => (Severity::Warning, Action::None),
        },
        Immediate::CheckMechanicals => (Severity::Warning, Action::InspectHardware),
        Immediate::CheckUvm => (Severity::Warning, Action::ConsultDocs),
        Immediate::RecoveryActionChanged => (Severity::Warning, Action::None),
        Immediate::RestartBareMetal => (Severity::Fatal, Action::RebootNode),
        Immediate::ResetGpu | Immediate::Workflow48 => (escalate(gpud_fatal), Action::ResetGpu),
        Immediate::RestartVm => (escalate(gpud_fatal), Action::RebootNode),
        Immediate::ContactSupport | Immediate::WorkflowNvlink => {
            (escalate(gpud_fatal), Action::InspectHardware)
        }
    }
}

/// Critical, or Fatal when gpud also calls the XID fatal.
const fn escalate(gpud_fatal: bool) -> Severity {
    if gpud_fatal {
        Severity::Fatal
    } else {
        Severity::Critical
    }
}

/// Builds one catalog row from its source classifications.
const fn row(
    code: u32,
    name: &'static str,
    description: &'static str,
    immediate: Immediate,
    gpud: Gpud,
) -> XidInfo {
    let (severity, action) = classify(immediate, gpud);
    XidInfo {
        code,
        name,
        description,
        severity,
        action,
    }
}

/// The catalog, sorted by code. Sorting is what makes [`find`] a binary
/// search; a test guards it.
#[rustfmt::skip]
static CATALOG: &[XidInfo] = {
    use Gpud::{AppWarning, Fatal as GFatal, Warning as GWarning};
    use Immediate::*;
    &[
    row(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", RestartApp, GWarning),
    row(13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", RestartApp, AppWarning),
    row(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", RestartApp, AppWarning),
    row(32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", RestartApp, GFatal),
    row(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", Ignore, GFatal),
    row(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", Ignore, AppWarning),
    row(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup after previous errors", Workflow45, GWarning),
    row(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", ResetGpu, GFatal),
    row(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", Workflow48, GFatal),
    row(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Aux power not connected", CheckMechanicals, GWarning),
    row(61, "PMU_BREAKPOINT", "Internal micro-controller breakpoint/warning", ContactSupport, GFatal),
    row(62, "PMU_HALT_ERROR", "Internal micro-controller halt", ResetGpu, GFatal),
    row(63, "INFOROM_DRAM_RETIREMENT_EVENT", "ECC page retirement or row-remap recording event", Ignore, GFatal),
    row(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "ECC page retirement or row-remap recording failure", ResetGpu, GFatal),
    row(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", RestartApp, GFatal),
    row(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", RestartApp, GFatal),
    row(74, "NVLINK_ERROR", "NVLink Error", WorkflowNvlink, GFatal),
    row(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", RestartBareMetal, GFatal),
    row(92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", Ignore, GWarning),
    row(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained ECC/memory error", RestartApp, GFatal),
    row(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained ECC/memory error", ResetGpu, GFatal),
    row(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout", ResetGpu, GWarning),
    row(110, "SEC_FAULT_ERROR", "Security Fault Error", ResetGpu, GFatal),
    row(119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", ResetGpu, GFatal),
    row(120, "GSP_ERROR", "GSP Error", ResetGpu, GFatal),
    row(121, "C2C_ERROR", "C2C Link Error", Ignore, GFatal),
    row(123, "SPI_PMU_RPC_WRITE_FAIL", "SPI PMU RPC Write Failure", ContactSupport, GFatal),
    row(136, "ALI_TRAINING_FAIL", "Link Training Failed", ResetGpu, GWarning),
    row(137, "NVLINK_PRIV_ERR", "NVLink (FLA) privilege error", Ignore, AppWarning),
    row(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "Unrecovered ECC Error", ResetGpu, GFatal),
    row(143, "GPU_INIT_ERROR", "GPU Initialization Failure", ResetGpu, GFatal),
    // 144-150: NVLink5 sub-unit errors. The base entry is gpud's; the decoded
    // intrinfo of a specific line can make one fatal (e.g. 149
    // NETIR_LINK_DOWN), which this catalog does not model.
    row(144, "NVLINK_SAW_ERROR", "NVLink5 SAW sub-unit error", WorkflowNvlink, GWarning),
    row(145, "NVLINK_RLW_ERROR", "NVLink5 RLW sub-unit error", WorkflowNvlink, GWarning),
    row(146, "NVLINK_TLW_ERROR", "NVLink5 TLW sub-unit error", WorkflowNvlink, GWarning),
    row(147, "NVLINK_TREX_ERROR", "NVLink5 TREX sub-unit error", WorkflowNvlink, GWarning),
    row(148, "NVLINK_NVLPW_CTRL_ERROR", "NVLink5 NVLPW_CTRL sub-unit error", WorkflowNvlink, GWarning),
    row(149, "NVLINK_NETIR_ERROR", "NVLink5 NETIR sub-unit error", WorkflowNvlink, GWarning),
    row(150, "NVLINK_MSE_ERROR", "NVLink5 MSE sub-unit error", WorkflowNvlink, GWarning),
    row(151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation error (confidential computing)", RestartVm, GWarning),
    row(154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", RecoveryActionChanged, GWarning),
    row(155, "NVLINK_SW_DEFINED_ERROR", "NVLink SW Defined Error", ResetGpu, GWarning),
    row(156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", ResetGpu, GWarning),
    row(158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", ResetGpu, GWarning),
    row(159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI Non-Data Error", CheckUvm, GWarning),
    ]
};

/// Every XID the catalog knows, sorted by code.
pub fn catalog() -> &'static [XidInfo] {
    CATALOG
}

/// The catalog entry for `code`, if there is one.
pub fn find(code: u32) -> Option<&'static XidInfo> {
    CATALOG
        .binary_search_by_key(&code, |info| info.code)
        .ok()
        .and_then(|index| CATALOG.get(index))
}

/// What is known about `code`.
///
/// Codes missing from the catalog are reported as [`Severity::Critical`]
/// with [`Action::ConsultDocs`]: a new driver may emit XIDs this build has
/// never heard of, and treating them as harmless would hide real faults,
/// while treating them as fatal would drain nodes on a guess.
pub fn lookup(code: u32) -> XidInfo {
    match find(code) {
        Some(info) => *info,
        None => XidInfo {
            code,
            name: UNKNOWN_NAME,
            description: "Unknown XID",
            severity: Severity::Critical,
            action: Action::ConsultDocs,
        },
    }
}

// === XidPolicy ===

/// Environment variable that disables XID health checks (`all`/`xids`) or
/// lists extra XIDs to ignore. Read by the caller, passed to [`XidPolicy`].
pub const ENV_DISABLE_HEALTHCHECKS: &str = "DP_DISABLE_HEALTHCHECKS";

/// Environment variable that lists XIDs to check even when they would be
/// ignored (`all` re-enables everything). Read by the caller, passed to
/// [`XidPolicy`].
pub const ENV_ENABLE_HEALTHCHECKS: &str = "DP_ENABLE_HEALTHCHECKS";

/// XIDs NVIDIA's device plugin ignores by default because they are
/// application errors: the GPU is expected to still be healthy.
pub const DEFAULT_IGNORED_XIDS: [u32; 6] = [13, 31, 43, 45, 68, 109];

pub use crate::config::XidPolicyConfig;

/// Which XIDs mark a device unhealthy.
///
/// Semantics follow NVIDIA's k8s-device-plugin (`internal/rm/health.go`):
///
/// * [`DEFAULT_IGNORED_XIDS`] are always ignored unless enabled;
/// * `DP_DISABLE_HEALTHCHECKS=all` (or `xids`) disables XID checks; any
///   other value is a comma-separated list of XIDs to ignore as well;
/// * `DP_ENABLE_HEALTHCHECKS` lists XIDs to check regardless of the two
///   lists above, and `all` (or `xids`) checks every XID, defaults included.
///
/// Keywords are case-insensitive, whitespace around entries is ignored,
/// empty entries are skipped and malformed ones are dropped with a warning.
///
/// Two deliberate differences from NVIDIA's code, both where its code and
/// its documentation disagree:
///
/// * With `DISABLE=all` and `ENABLE=79`, NVIDIA's `IsAllDisabled()` still
///   reports everything disabled, so the device plugin runs no checks at
///   all, although its own doc comment says enabled XIDs are selected "even
///   if" all are disabled. Here XID 79 is checked and everything else is
///   ignored.
/// * NVIDIA stores "all" under XID 0, so a literal `0` acts like `all`
///   (`DP_DISABLE_HEALTHCHECKS=0` turns checks off). XID 0 does not exist;
///   here `0` is rejected as malformed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidPolicy {
    /// `all`/`xids` in the disable list, or `disable_all` in config.
    disable_all: bool,
    /// `all`/`xids` in the enable list.
    enable_all: bool,
    /// Defaults plus explicitly ignored XIDs.
    ignored: BTreeSet<u32>,
    /// Explicitly enabled XIDs; these win over `ignored` and `disable_all`.
    enabled: BTreeSet<u32>,
}

impl Default for XidPolicy {
    /// The policy with no configuration: only the defaults are ignored.
    fn default() -> Self {
        Self {
            disable_all: false,
            enable_all: false,
            ignored: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            enabled: BTreeSet::new(),
        }
    }
}

impl XidPolicy {
    /// Builds the policy from the values of `DP_DISABLE_HEALTHCHECKS` and
    /// `DP_ENABLE_HEALTHCHECKS` (`None` when unset).
    ///
    /// Returns the policy and one warning per malformed entry, for the
    /// caller to log once at startup.
    pub fn from_env_values(disable: Option<&str>, enable: Option<&str>) -> (Self, Vec<String>) {
        Self::from_config_and_env(&XidPolicyConfig::default(), disable, enable)
    }

    /// Builds the policy from gpud's config section combined with the two
    /// environment values.
    ///
    /// Config and environment add up: `ignore` joins the disable list,
    /// `enable` joins the enable list and `disable_all` acts like
    /// `DP_DISABLE_HEALTHCHECKS=all`. An enabled XID wins over an ignored
    /// one whichever source each came from, as in NVIDIA's plugin.
    pub fn from_config_and_env(
        config: &XidPolicyConfig,
        disable: Option<&str>,
        enable: Option<&str>,
    ) -> (Self, Vec<String>) {
        let mut warnings = Vec::new();
        let disabled = parse_xid_list(ENV_DISABLE_HEALTHCHECKS, disable, &mut warnings);
        let enabled = parse_xid_list(ENV_ENABLE_HEALTHCHECKS, enable, &mut warnings);

        let policy = Self {
            disable_all: disabled.all || config.disable_all,
            enable_all: enabled.all,
            ignored: DEFAULT_IGNORED_XIDS
                .into_iter()
                .chain(disabled.codes)
                .chain(config.ignore.iter().copied())
                .collect(),
            enabled: enabled
                .codes
                .into_iter()
                .chain(config.enable.iter().copied())
                .collect(),
        };
        (policy, warnings)
    }

    /// Whether an XID with this code should leave the device healthy.
    pub fn is_ignored(&self, code: u32) -> bool {
        if self.enable_all || self.enabled.contains(&code) {
            return false;
        }
        self.disable_all || self.ignored.contains(&code)
    }

    /// Whether this XID was named in an enable list (or all were enabled): such an XID makes
    /// the device unhealthy whatever its catalog severity, as in NVIDIA's plugin.
    pub fn is_force_enabled(&self, code: u32) -> bool {
        self.enable_all || self.enabled.contains(&code)
    }

    /// What this policy makes of XID `code` on a device: `None` when it is ignored, else the
    /// state it puts the device in — unhealthy for a critical or fatal XID and for one named in
    /// an enable list, degraded for a warning or application-level one. The one judgement of an
    /// XID: the health watcher's verdicts and the doctor's `gpu.xid` both come from it.
    pub fn judge(&self, code: u32) -> Option<HealthState> {
        if self.is_ignored(code) {
            return None;
        }
        Some(match lookup(code).severity {
            _ if self.is_force_enabled(code) => HealthState::Unhealthy,
            Severity::Application | Severity::Warning => HealthState::Degraded,
            Severity::Critical | Severity::Fatal => HealthState::Unhealthy,
        })
    }

    /// Whether any XID can mark a device unhealthy; when `false` the caller
    /// can skip XID monitoring entirely.
    pub fn checks_enabled(&self) -> bool {
        !self.disable_all || self.enable_all || !self.enabled.is_empty()
    }

    /// The XIDs ignored by name (defaults plus configured), minus enabled
    /// ones, sorted. Empty when everything is enabled. With checks disabled
    /// wholesale this still lists only the named XIDs; use
    /// [`Self::checks_enabled`] for that case.
    pub fn ignored_codes(&self) -> Vec<u32> {
        if self.enable_all {
            return Vec::new();
        }
        self.ignored
            .iter()
            .copied()
            .filter(|code| !self.enabled.contains(code))
            .collect()
    }
}

/// One parsed `DP_*_HEALTHCHECKS` value.
#[derive(Debug, Default)]
struct XidList {
    all: bool,
    codes: Vec<u32>,
}

/// Parses a comma-separated XID list the way NVIDIA's plugin does, pushing a
/// warning for each malformed entry.
fn parse_xid_list(var: &str, value: Option<&str>, warnings: &mut Vec<String>) -> XidList {
    let mut list = XidList::default();
    for entry in value.unwrap_or_default().split(',').map(str::trim) {
        if entry.is_empty() {
            continue;
        }
        if entry.eq_ignore_ascii_case("all") || entry.eq_ignore_ascii_case("xids") {
            list.all = true;
            continue;
        }
        match parse_xid(entry) {
            Some(code) => list.codes.push(code),
            None => warnings.push(format!("{var}: ignoring malformed XID {entry:?}")),
        }
    }
    // NVIDIA's parser returns as soon as it sees a keyword, so the named
    // XIDs of a list that also says "all" have no effect; mirror that.
    if list.all {
        list.codes.clear();
    }
    list
}

/// A decimal XID: ASCII digits only (no sign, as Go's `ParseUint`), fits in
/// `u32`, and is not 0.
fn parse_xid(entry: &str) -> Option<u32> {
    if !entry.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    entry.parse::<u32>().ok().filter(|&code| code != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_judges_an_xid_as_the_watcher_and_the_doctor_take_it() {
        let (policy, _) = XidPolicy::from_env_values(Some("79"), Some("13"));
        assert_eq!(policy.judge(79), None, "ignored by the disable list");
        assert_eq!(
            policy.judge(13),
            Some(HealthState::Unhealthy),
            "enabled: forced"
        );
        assert_eq!(policy.judge(31), None, "ignored by default");
        assert_eq!(policy.judge(48), Some(HealthState::Unhealthy));
        assert_eq!(
            policy.judge(94),
            Some(HealthState::Degraded),
            "application-level"
        );
        assert_eq!(policy.judge(92), Some(HealthState::Degraded), "warning");
    }

    #[test]
    fn catalog_is_sorted_unique_and_described() {
        for pair in CATALOG.windows(2) {
            if let [a, b] = pair {
                assert!(a.code < b.code, "{} then {}", a.code, b.code);
            }
        }
        for info in CATALOG {
            assert!(
                !info.name.trim().is_empty(),
                "XID {} has no name",
                info.code
            );
            assert!(
                !info.description.trim().is_empty(),
                "XID {} has no description",
                info.code
            );
            assert_eq!(info.name, info.name.trim());
            assert!(info.is_known());
        }
    }

    #[test]
    fn catalog_covers_every_published_code() {
        let expected: Vec<u32> = [
            8, 13, 31, 32, 38, 43, 45, 46, 48, 54, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109,
            110, 119, 120, 121, 123, 136, 137, 140, 143,
        ]
        .into_iter()
        .chain(144..=151)
        .chain([154, 155, 156, 158, 159])
        .collect();
        let actual: Vec<u32> = catalog().iter().map(|info| info.code).collect();
        assert_eq!(actual, expected);
    }

    #[test]
    fn classification_of_each_code() {
        use Action as A;
        use Severity as S;
        let cases: &[(u32, Severity, Action)] = &[
            // The device plugin's "application" list.
            (13, S::Application, A::RestartWorkload),
            (31, S::Application, A::RestartWorkload),
            (43, S::Application, A::None),
            (45, S::Application, A::None),
            (68, S::Application, A::RestartWorkload),
            // NVIDIA asks for a reset; gpud only warns.
            (109, S::Critical, A::ResetGpu),
            // Restart-the-app buckets stay application-scoped.
            (8, S::Application, A::RestartWorkload),
            (32, S::Application, A::RestartWorkload),
            (69, S::Application, A::RestartWorkload),
            (94, S::Application, A::RestartWorkload),
            // NVIDIA says ignore.
            (38, S::Warning, A::None),
            (63, S::Warning, A::None),
            (92, S::Warning, A::None),
            (121, S::Warning, A::None),
            (137, S::Application, A::None),
            (54, S::Warning, A::InspectHardware),
            (154, S::Warning, A::None),
            (159, S::Warning, A::ConsultDocs),
            // Reset or reboot needed and gpud marks them fatal.
            (46, S::Fatal, A::ResetGpu),
            (48, S::Fatal, A::ResetGpu),
            (61, S::Fatal, A::InspectHardware),
            (62, S::Fatal, A::ResetGpu),
            (64, S::Fatal, A::ResetGpu),
            (74, S::Fatal, A::InspectHardware),
            (79, S::Fatal, A::RebootNode),
            (95, S::Fatal, A::ResetGpu),
            (110, S::Fatal, A::ResetGpu),
            (119, S::Fatal, A::ResetGpu),
            (120, S::Fatal, A::ResetGpu),
            (123, S::Fatal, A::InspectHardware),
            (140, S::Fatal, A::ResetGpu),
            (143, S::Fatal, A::ResetGpu),
            // Reset or restart needed, gpud only warns.
            (136, S::Critical, A::ResetGpu),
            (144, S::Critical, A::InspectHardware),
            (149, S::Critical, A::InspectHardware),
            (150, S::Critical, A::InspectHardware),
            (151, S::Critical, A::RebootNode),
            (155, S::Critical, A::ResetGpu),
            (156, S::Critical, A::ResetGpu),
            (158, S::Critical, A::ResetGpu),
        ];
        for &(code, severity, action) in cases {
            let info = lookup(code);
            assert_eq!(
                (info.severity, info.action),
                (severity, action),
                "XID {code}"
            );
        }
    }

    #[test]
    fn alerting_xids_are_fatal_and_noise_is_not() {
        // The XIDs a common alert rule pages on must all be fatal here...
        for code in [48, 62, 64, 74, 79, 95, 119, 120] {
            assert_eq!(lookup(code).severity, Severity::Fatal, "XID {code}");
        }
        // ...and the ones it calls noise must not even be critical.
        for code in [13, 31, 43, 63, 92] {
            assert!(lookup(code).severity < Severity::Critical, "XID {code}");
        }
    }

    #[test]
    fn severity_is_ordered() {
        assert!(Severity::Application < Severity::Warning);
        assert!(Severity::Warning < Severity::Critical);
        assert!(Severity::Critical < Severity::Fatal);
        assert_eq!(Severity::Fatal.to_string(), "fatal");
    }

    #[test]
    fn unknown_codes_are_critical_and_point_at_the_docs() {
        for code in [0, 1, 14, 157, 999, u32::MAX] {
            let info = lookup(code);
            assert_eq!(info.code, code);
            assert_eq!(info.name, UNKNOWN_NAME);
            assert_eq!(info.severity, Severity::Critical);
            assert_eq!(info.action, Action::ConsultDocs);
            assert_eq!(info.action.phrase(), "consult the XID documentation");
            assert!(!info.is_known());
            assert!(find(code).is_none());
        }
    }

    #[test]
    fn summaries() {
        assert_eq!(
            lookup(79).summary(),
            "XID 79: GPU has fallen off the bus — drain and reboot the node"
        );
        assert_eq!(
            lookup(48).summary(),
            "XID 48: Double Bit ECC Error — drain and reset the GPU"
        );
        assert_eq!(
            lookup(13).summary(),
            "XID 13: Graphics Engine Exception — restart the affected workload"
        );
        assert_eq!(
            lookup(92).summary(),
            "XID 92: High single-bit ECC error rate — no action needed"
        );
        assert_eq!(
            lookup(74).to_string(),
            "XID 74: NVLink Error — inspect the hardware"
        );
        assert_eq!(
            lookup(4242).summary(),
            "XID 4242: Unknown XID — consult the XID documentation"
        );
    }

    #[test]
    fn action_phrases_are_distinct() {
        let all = [
            Action::None,
            Action::RestartWorkload,
            Action::ResetGpu,
            Action::RebootNode,
            Action::InspectHardware,
            Action::ConsultDocs,
        ];
        let phrases: BTreeSet<&str> = all.iter().map(|a| a.phrase()).collect();
        assert_eq!(phrases.len(), all.len());
    }

    // --- policy ---

    /// One case of NVIDIA's TestGetDisabledHealthCheckXids, plus our own.
    struct PolicyCase {
        name: &'static str,
        disable: Option<&'static str>,
        enable: Option<&'static str>,
        checks_enabled: bool,
        /// (code, is_ignored)
        probes: &'static [(u32, bool)],
        ignored_codes: &'static [u32],
        warnings: usize,
    }

    const DEFAULTS_IGNORED: &[(u32, bool)] = &[
        (13, true),
        (31, true),
        (43, true),
        (45, true),
        (68, true),
        (109, true),
    ];

    fn check(case: &PolicyCase) {
        let (policy, warnings) = XidPolicy::from_env_values(case.disable, case.enable);
        assert_eq!(
            policy.checks_enabled(),
            case.checks_enabled,
            "{}",
            case.name
        );
        for &(code, ignored) in case.probes {
            assert_eq!(
                policy.is_ignored(code),
                ignored,
                "{}: XID {code}",
                case.name
            );
        }
        assert_eq!(policy.ignored_codes(), case.ignored_codes, "{}", case.name);
        assert_eq!(warnings.len(), case.warnings, "{}: {warnings:?}", case.name);
    }

    #[test]
    fn nvidia_disabled_health_check_xids_table() {
        let six: &[u32] = &[13, 31, 43, 45, 68, 109];
        let cases = [
            PolicyCase {
                name: "empty envvars are default disabled",
                disable: None,
                enable: None,
                checks_enabled: true,
                probes: DEFAULTS_IGNORED,
                ignored_codes: six,
                warnings: 0,
            },
            PolicyCase {
                name: "disabled is all",
                disable: Some("all"),
                enable: None,
                checks_enabled: false,
                probes: &[(13, true), (31, true), (109, true), (555, true)],
                ignored_codes: six,
                warnings: 0,
            },
            PolicyCase {
                name: "disabled is xids",
                disable: Some("xids"),
                enable: None,
                checks_enabled: false,
                probes: &[(13, true), (68, true), (109, true), (555, true)],
                ignored_codes: six,
                warnings: 0,
            },
            PolicyCase {
                name: "enabled is all",
                disable: None,
                enable: Some("all"),
                checks_enabled: true,
                probes: &[
                    (13, false),
                    (31, false),
                    (43, false),
                    (45, false),
                    (68, false),
                    (109, false),
                    (555, false),
                ],
                ignored_codes: &[],
                warnings: 0,
            },
            PolicyCase {
                name: "enabled overrides disabled",
                disable: Some("11"),
                enable: Some("11"),
                checks_enabled: true,
                probes: &[(11, false), (13, true), (109, true), (555, false)],
                ignored_codes: six,
                warnings: 0,
            },
            PolicyCase {
                name: "enabled overrides default ignored",
                disable: None,
                enable: Some("31"),
                checks_enabled: true,
                probes: &[(13, true), (31, false), (43, true), (555, false)],
                ignored_codes: &[13, 43, 45, 68, 109],
                warnings: 0,
            },
        ];
        for case in &cases {
            check(case);
        }
    }

    #[test]
    fn more_policy_cases() {
        let cases = [
            PolicyCase {
                name: "empty strings behave like unset",
                disable: Some(""),
                enable: Some(""),
                checks_enabled: true,
                probes: DEFAULTS_IGNORED,
                ignored_codes: &[13, 31, 43, 45, 68, 109],
                warnings: 0,
            },
            PolicyCase {
                name: "extra ignored XID, the gpu-operator#1065 workaround",
                disable: Some("94"),
                enable: None,
                checks_enabled: true,
                probes: &[(94, true), (79, false), (13, true)],
                ignored_codes: &[13, 31, 43, 45, 68, 94, 109],
                warnings: 0,
            },
            PolicyCase {
                name: "whitespace, empty entries and case",
                disable: Some(" 94 ,, 48\t,"),
                enable: Some(" ALL "),
                checks_enabled: true,
                probes: &[(94, false), (48, false), (13, false)],
                ignored_codes: &[],
                warnings: 0,
            },
            PolicyCase {
                name: "keyword is case-insensitive in disable",
                disable: Some("XIDs"),
                enable: None,
                checks_enabled: false,
                probes: &[(79, true)],
                ignored_codes: &[13, 31, 43, 45, 68, 109],
                warnings: 0,
            },
            PolicyCase {
                name: "malformed entries are dropped and reported",
                disable: Some("68,not-an-int,-67,+66,0,99999999999,67"),
                enable: None,
                checks_enabled: true,
                probes: &[(67, true), (66, false), (0, false)],
                ignored_codes: &[13, 31, 43, 45, 67, 68, 109],
                warnings: 5,
            },
            PolicyCase {
                name: "all disabled but one enabled keeps checking that one",
                disable: Some("all"),
                enable: Some("79"),
                checks_enabled: true,
                probes: &[(79, false), (48, true), (13, true)],
                ignored_codes: &[13, 31, 43, 45, 68, 109],
                warnings: 0,
            },
            PolicyCase {
                name: "all disabled and all enabled checks everything",
                disable: Some("all"),
                enable: Some("all"),
                checks_enabled: true,
                probes: &[(13, false), (79, false)],
                ignored_codes: &[],
                warnings: 0,
            },
            PolicyCase {
                name: "named XIDs next to all are dropped",
                disable: Some("94,all"),
                enable: None,
                checks_enabled: false,
                probes: &[(94, true), (79, true)],
                ignored_codes: &[13, 31, 43, 45, 68, 109],
                warnings: 0,
            },
            PolicyCase {
                name: "malformed enable entries are reported too",
                disable: None,
                enable: Some("abc,13"),
                checks_enabled: true,
                probes: &[(13, false), (31, true)],
                ignored_codes: &[31, 43, 45, 68, 109],
                warnings: 1,
            },
        ];
        for case in &cases {
            check(case);
        }
    }

    #[test]
    fn warnings_name_the_variable_and_entry() {
        let (_, warnings) = XidPolicy::from_env_values(Some("x1"), Some("-2"));
        assert_eq!(
            warnings,
            [
                "DP_DISABLE_HEALTHCHECKS: ignoring malformed XID \"x1\"",
                "DP_ENABLE_HEALTHCHECKS: ignoring malformed XID \"-2\"",
            ]
        );
    }

    #[test]
    fn default_policy_matches_unset_env() {
        let (policy, warnings) = XidPolicy::from_env_values(None, None);
        assert_eq!(policy, XidPolicy::default());
        assert!(warnings.is_empty());
    }

    #[test]
    fn config_composes_with_env() {
        let config = XidPolicyConfig {
            ignore: vec![94, 48],
            enable: vec![13],
            disable_all: false,
        };
        // Env enables 48, which config ignores: enable wins across sources.
        let (policy, warnings) = XidPolicy::from_config_and_env(&config, Some("92"), Some("48"));
        assert!(warnings.is_empty());
        assert!(policy.checks_enabled());
        assert!(policy.is_ignored(94));
        assert!(policy.is_ignored(92));
        assert!(!policy.is_ignored(48));
        assert!(!policy.is_ignored(13));
        assert!(policy.is_ignored(31));
        assert!(!policy.is_ignored(79));
        assert_eq!(policy.ignored_codes(), [31, 43, 45, 68, 92, 94, 109]);
    }

    #[test]
    fn config_disable_all_acts_like_env_all() {
        let config = XidPolicyConfig {
            disable_all: true,
            ..XidPolicyConfig::default()
        };
        let (policy, _) = XidPolicy::from_config_and_env(&config, None, None);
        assert!(!policy.checks_enabled());
        assert!(policy.is_ignored(79));

        // An env enable list re-selects XIDs, as it does for env `all`.
        let (policy, _) = XidPolicy::from_config_and_env(&config, None, Some("79,48"));
        assert!(policy.checks_enabled());
        assert!(!policy.is_ignored(79));
        assert!(!policy.is_ignored(48));
        assert!(policy.is_ignored(95));

        // And env `all` in ENABLE overrides the config's disable_all.
        let (policy, _) = XidPolicy::from_config_and_env(&config, None, Some("all"));
        assert!(policy.checks_enabled());
        assert!(!policy.is_ignored(95));
    }

    #[test]
    fn config_enable_overrides_env_disable() {
        let config = XidPolicyConfig {
            enable: vec![109],
            ..XidPolicyConfig::default()
        };
        let (policy, _) = XidPolicy::from_config_and_env(&config, Some("all"), None);
        assert!(policy.checks_enabled());
        assert!(!policy.is_ignored(109));
        assert!(policy.is_ignored(79));
    }
}
