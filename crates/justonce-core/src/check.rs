//! What `justonce doctor` finds: one [`Check`] per link of the chain that makes
//! at-least-once hold (a durable queue, persistent messages, publisher confirms, dead
//! letters that have somewhere to go) and turns it into effectively-once (a dedup table,
//! a retention longer than the redelivery horizon, a store whose clock agrees).

use serde::Serialize;

/// How a link stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    /// As the chain needs it.
    Pass,
    /// Works, with a risk worth knowing, or could not be checked.
    Warn,
    /// Breaks the chain: messages or effects can be lost or doubled.
    Fail,
}

impl CheckStatus {
    /// `pass`, `warn` or `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Pass => "pass",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "fail",
        }
    }
}

/// One link checked against the real service.
///
/// ```
/// use justonce_core::{Check, CheckStatus};
///
/// let c = Check::fail("dead letters", "exchange orders.dlx does not exist", "declare it");
/// assert_eq!(c.status, CheckStatus::Fail);
/// assert_eq!(c.fix.as_deref(), Some("declare it"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// The link: `work queue`, `publisher confirms`, `dedup retention`, ….
    pub link: String,
    /// How it stands.
    pub status: CheckStatus,
    /// What was found.
    pub detail: String,
    /// What to change, when it is not a pass.
    pub fix: Option<String>,
}

impl Check {
    /// A link as the chain needs it.
    pub fn pass(link: impl Into<String>, detail: impl Into<String>) -> Self {
        Check {
            link: link.into(),
            status: CheckStatus::Pass,
            detail: detail.into(),
            fix: None,
        }
    }

    /// A link with a risk worth knowing, and what to do about it.
    pub fn warn(
        link: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Check {
            status: CheckStatus::Warn,
            fix: Some(fix.into()),
            ..Check::pass(link, detail)
        }
    }

    /// A broken link, and what to change.
    pub fn fail(
        link: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Check {
            status: CheckStatus::Fail,
            fix: Some(fix.into()),
            ..Check::pass(link, detail)
        }
    }
}
