use serde::{Deserialize, Serialize};

/// The native API's one error body: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code (`not_found`, `invalid_request`, `spawn_failed`, …).
    pub code: String,
    /// Human-readable explanation naming the offending field, path or id.
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                code: code.into(),
                message: message.into(),
            },
        }
    }
}
