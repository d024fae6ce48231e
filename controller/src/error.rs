//! The controller's domain errors; the API maps each to one status class.

use crate::provider::ProviderError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// A conflict with its own error code (`control_held`, `not_holder`).
    #[error("{1}")]
    ConflictCode(&'static str, String),
    /// Refused by a rule, with its error code (`login_not_enabled`, `github_repository_not_cloned`).
    #[error("{1}")]
    Forbidden(&'static str, String),
    /// Valid, but cannot be done here (a disabled profile, an image this provider cannot run).
    #[error("{0}")]
    Unprocessable(String),
    /// The sandbox is not (or no longer) able to serve the request.
    #[error("{0}")]
    Unavailable(String),
    /// The sandbox's agent failed the request.
    #[error("{0}")]
    Agent(String),
    /// A service outside berth (GitHub) failed or refused.
    #[error("{0}")]
    Upstream(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn code(&self) -> &'static str {
        match self {
            Error::BadRequest(_) => "invalid_request",
            Error::Unauthorized(_) => "unauthorized",
            Error::TooLarge(_) => "too_large",
            Error::NotFound(_) => "not_found",
            Error::Conflict(_) => "conflict",
            Error::ConflictCode(code, _) => code,
            Error::Forbidden(code, _) => code,
            Error::Unprocessable(_) => "unprocessable",
            Error::Unavailable(_) => "unavailable",
            Error::Agent(_) => "agent",
            Error::Upstream(_) => "upstream",
            Error::Internal(_) => "internal",
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        Error::Internal(e.to_string())
    }
}

impl From<ProviderError> for Error {
    fn from(e: ProviderError) -> Self {
        match e {
            ProviderError::Unsupported(m) => Error::Unprocessable(m),
            ProviderError::Failed(m) => Error::Internal(format!("provider: {m}")),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
